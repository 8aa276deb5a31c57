"""`journal index`'s worker processes: a worker that dies (SIGKILL, as the out-of-memory killer sends)
no longer ends the command with BrokenProcessPool: what the others finished is kept, the rest is done
in the parent, and a note says so; and the command itself, through a pipe, with two workers."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import multisite
from multisite.pipeline.journal_frames import run_workers

MULTISITE = shutil.which("multisite", path=str(Path(sys.executable).parent)) or "multisite"


def square_or_die(x: int) -> int:
    """x*x; item 3 kills the worker process running it (never the parent: the retry there succeeds)."""
    if x == 3 and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_a_worker_killed_mid_run_is_replaced_by_the_parent_and_said_so():
    out, notes = run_workers(square_or_die, list(range(8)), 2)
    assert out == [x * x for x in range(8)]
    assert len(notes) == 1 and "a worker process died (2 were running" in notes[0] and "dmesg" in notes[0]


def test_workers_that_all_finish_leave_no_note():
    out, notes = run_workers(abs, [-1, -2, -3], 2)
    assert out == [1, 2, 3] and notes == []


def test_journal_index_writes_the_pieces_with_two_workers(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(300):
            db.set("acct", ("k", i), {"n": i, "pad": "x" * 40})
    res = subprocess.run([MULTISITE, "journal", "index", str(root), "--jobs", "2", "--json"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["pieces_written"] > 1 and rep["jobs"] == 2 and rep["notes"] == []
    again = json.loads(subprocess.run([MULTISITE, "journal", "index", str(root), "--json"], capture_output=True,
                                      text=True, timeout=300, check=True).stdout)
    assert again["pieces_written"] == 0  # only what is missing is written
