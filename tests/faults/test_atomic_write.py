"""atomic_write under SIGKILL: the target holds the old or the new content, never a mix.

A child process kills itself at each hook step; another writes versions in a loop and is killed at
random moments from outside.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

CHUNK = 256 * 1024


def _content(v: int) -> bytes:
    # Big enough that a write is not one syscall's worth of page cache; every byte says which version.
    head = f"version {v:08d}\n".encode()
    return head + bytes([v % 251]) * (CHUNK - len(head))


def _run_child(code: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)


KILL_AT_STEP = """
import os, signal, sys
from pathlib import Path
from multisite.fsutil import atomic_write
path, step, data = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]).read_bytes()
def hook(s):
    if s == step:
        os.kill(os.getpid(), signal.SIGKILL)
atomic_write(path, data, hook=hook)
print("finished")
"""


@pytest.mark.parametrize("step,expect", [("written", "old"), ("synced", "old"), ("replaced", "new")])
def test_sigkill_at_each_step(tmp_path, step, expect):
    target = tmp_path / "target"
    old, new = _content(1), _content(2)
    target.write_bytes(old)
    (tmp_path / "new.bin").write_bytes(new)
    p = _run_child(KILL_AT_STEP, str(target), step, str(tmp_path / "new.bin"))
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and "finished" not in out
    assert target.read_bytes() == (old if expect == "old" else new)


LOOP = """
import sys
from pathlib import Path
from multisite.fsutil import atomic_write
path, chunk = Path(sys.argv[1]), int(sys.argv[2])
v = 2
while True:
    head = f"version {v:08d}\\n".encode()
    print(v, flush=True)
    atomic_write(path, head + bytes([v % 251]) * (chunk - len(head)))
    v += 1
"""


def test_sigkill_at_random_moments_never_leaves_a_partial_file(tmp_path):
    rng = random.Random(20240602)
    for rnd in range(12):
        target = tmp_path / f"t{rnd}"
        target.write_bytes(_content(1))
        p = _run_child(LOOP, str(target), str(CHUNK))
        last = 1
        for _ in range(rng.randrange(1, 8)):
            last = int(p.stdout.readline())
        time.sleep(rng.random() * 0.004)  # land anywhere inside the write of version `last`
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()
        data = target.read_bytes()
        v = int(data[8:16])
        assert v >= last - 1, (v, last)  # the child may have run ahead of what we read
        assert data == _content(v), f"round {rnd}: the target holds a partial version {v}"
