"""A rollback SIGKILLed between its steps is completed by the next open, with the same lost file.

The parent builds an instance and the state it must roll back to. A child process opens it, wraps
one step of ``engine.rollback`` so that the process kills itself right after that step, and
rolls back. The parent then opens the instance (recovery runs, then the interrupted rollback is
finished) and checks: the seqno and store are those of the target, the journal ends there, the
marker is gone, and exactly one lost-transaction file holds the rolled-off records in order: the
one the child had written, if it had written one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import multisite
from multisite.journal.reader import iter_records
from multisite.journal.lostfile import LostFile, list_lost_files

TARGET = 150

CHILD = """
import os, signal, sys
import multisite
from multisite.engine import rollback as rb

root, step, target = sys.argv[1], sys.argv[2], int(sys.argv[3])

def die_after(name):
    real = getattr(rb, name)
    def wrapper(*a, **kw):
        out = real(*a, **kw)
        os.kill(os.getpid(), signal.SIGKILL)
        return out
    setattr(rb, name, wrapper)

die_after(step)
db = multisite.open(root)
db.rollback(target)
print("finished")
"""

# Each step of rollback(), in order, by the module-level name the child wraps.
STEPS = ["atomic_write", "write_lost_file", "_undo_store",  # marker, lost file, store
         "_remove_segment", "_truncate_segment",  # inside the journal cut: the newest segment gone, the cut
         "_cut_journal", "_trim_info"]


def state(db) -> dict:
    return {r: list(db.items(r)) for r in ("acct", "other")}


@pytest.fixture
def built(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=8192)
    with multisite.open(root) as db:
        db.create_region("acct")
        db.create_region("other")
        for i in range(TARGET):
            db.set("acct", ("k", i % 40), {"i": i, "pad": "p" * 50})
        expect = state(db)
        for i in range(TARGET, 300):
            with db.transaction() as tx:
                tx.set("acct", ("k", i % 40), {"i": i})
                tx.set("other", ("o", i), i)
                if i % 25 == 0:
                    tx.kill("acct", ("k",))
        gone = list(iter_records(db.layout.journal, TARGET + 1))
    return root, expect, gone


@pytest.mark.parametrize("step", STEPS)
def test_rollback_killed_after_each_step_completes_on_open(built, step):
    root, expect, gone = built
    p = subprocess.run([sys.executable, "-c", CHILD, str(root), step, str(TARGET)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert "finished" not in p.stdout
    written = list_lost_files(root / "lost")
    assert len(written) <= 1
    with multisite.open(root) as db:
        assert db.seqno == TARGET
        assert state(db) == expect
        assert [r.seqno for r in iter_records(db.layout.journal)] == list(range(1, TARGET + 1))
        assert not (db.layout.run / "rollback.json").exists()
        files = list_lost_files(db.layout.lost)
        assert len(files) == 1, files
        if written:
            assert files == written
        assert list(LostFile.read(files[0]).records()) == gone
        db.set("acct", ("after",), 1)
        assert db.seqno == TARGET + 1
    with multisite.open(root) as db:  # and a second open finds nothing left to do
        assert db.seqno == TARGET + 1 and db.recovery.notes == []
