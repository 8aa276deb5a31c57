"""Crash tests: writer processes are SIGKILLed at random moments; every acknowledged commit survives.

After each kill the instance is reopened (recovery runs) and checked: every acknowledged seqno is
present with its data, no transaction is half there, journal seqnos are contiguous from 1, and the
seqno is at least the last acknowledged one. The same instance goes through many crashes in a row.
Recovery after a writer that exited without closing hardens the journal before the store.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import multisite
from multisite.journal.reader import iter_records

ROUNDS_PER_MODE = 8  # x3 modes = 24 rounds
PAD = "x" * 64


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _kill_after(proc: subprocess.Popen, acks: int, rng: random.Random) -> list[list[int]]:
    """Read ACK lines until ``acks`` of them, wait a random moment, SIGKILL; return every ACK read."""
    got: list[list[int]] = []
    assert proc.stdout.readline().startswith("READY")
    while len(got) < acks:
        line = proc.stdout.readline()
        assert line.startswith("ACK"), f"writer stopped early: {line!r}"
        got.append([int(x) for x in line.split()[1:]])
    time.sleep(rng.random() * 0.01)  # kill anywhere: inside a write, an fsync, a segment switch
    proc.send_signal(signal.SIGKILL)
    # Lines written before the kill were acknowledged too: read them to the end.
    for line in proc.stdout:
        if line.startswith("ACK") and line.endswith("\n"):
            got.append([int(x) for x in line.split()[1:]])
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return got


def _check_journal(db) -> None:
    seqnos = [r.seqno for r in iter_records(db.layout.journal)]
    assert seqnos == list(range(1, db.seqno + 1))


@pytest.mark.parametrize("mode", ["fsync", "group", "none"])
def test_sigkilled_writer_loses_no_acknowledged_commit(tmp_path, mode):
    rng = random.Random(f"crash-{mode}")
    root = multisite.create(tmp_path / "A", name="A", durability=mode, segment_bytes=64 * 1024)
    acked: dict[int, int] = {}  # seqno -> i
    for rnd in range(ROUNDS_PER_MODE):
        proc = _spawn("multisite.testing.crash_writer", str(root), "--durability", mode)
        for seqno, i in _kill_after(proc, rng.randrange(1, 400), rng):
            acked[seqno] = i
        with multisite.open(root) as db:
            last = max(acked)
            assert db.seqno >= last, f"round {rnd}: seqno {db.seqno} is behind the last ack {last}"
            for seqno, i in acked.items():
                assert seqno == i  # the writer numbers its transactions by seqno
                assert db.get("crash", ("w", i)) == {"i": i, "pad": PAD}, f"round {rnd}: ack {i} lost"
                assert db.get("crash", ("w2", i)) == i, f"round {rnd}: ack {i} half there"
            w = [k[1] for k, _ in db.items("crash", start=("w",), stop=("w2",))]
            w2 = [k[1] for k, _ in db.items("crash", start=("w2",), stop=("w3",))]
            assert w == w2 == list(range(1, db.seqno + 1)), f"round {rnd}: a partial transaction is visible"
            _check_journal(db)
    assert len(list((root / "journal").glob("*.msj"))) > 1  # the rounds crossed segment switches


def test_sigkilled_threaded_group_writer_loses_no_acknowledged_commit(tmp_path):
    rng = random.Random("crash-threads")
    root = multisite.create(tmp_path / "A", name="A", durability="group", segment_bytes=64 * 1024)
    acked: dict[int, tuple[int, int]] = {}  # seqno -> (thread, n)
    for rnd in range(6):
        proc = _spawn("multisite.testing.crash_threads", str(root), "--threads", "16")
        for seqno, t, n in _kill_after(proc, rng.randrange(50, 1500), rng):
            assert seqno not in acked, "two commits acknowledged with one seqno"
            acked[seqno] = (t, n)
        with multisite.open(root) as db:
            assert db.seqno >= max(acked)
            for seqno, (t, n) in acked.items():
                assert db.get("crash", ("t", t, n)) == {"t": t, "n": n}, f"round {rnd}: ack {seqno} lost"
                assert db.get("crash", ("t2", t, n)) == n
            per_thread: dict[int, list[int]] = {}
            for (_, t, n), v in db.items("crash", start=("t",), stop=("t2",)):
                per_thread.setdefault(t, []).append(n)
                assert v == {"t": t, "n": n}
            count = 0
            for t, ns in per_thread.items():
                assert ns == list(range(len(ns))), f"round {rnd}: thread {t} has a hole"
                assert [k[2] for k, _ in db.items("crash", start=("t2", t), stop=("t2", t + 1))] == ns
                count += len(ns)
            assert count == db.seqno  # one transaction per seqno, none partial, none extra
            _check_journal(db)


def _fill(root: Path, n: int) -> int:
    with multisite.open(root) as db:
        db.create_region("crash")
        for i in range(n):
            db.set("crash", ("w", i), {"i": i, "pad": PAD})
        return db.seqno


def test_crash_right_after_a_segment_switch(tmp_path):
    """The new segment exists with its header and no record: the journal continues in it."""
    from multisite.journal.segments import list_segments
    from multisite.journal.writer import create_segment

    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    last = _fill(root, 100)
    infos = list_segments(root / "journal")
    create_segment(root / "journal", infos[-1].index + 1, last + 1, infos[-1].index)
    with multisite.open(root) as db:
        assert db.seqno == last and db.recovery.torn_bytes == 0
        db.set("crash", ("after",), 1)
    with multisite.open(root) as db:
        assert db.seqno == last + 1 and db.get("crash", ("after",)) == 1
        _check_journal(db)


def test_crash_inside_crash_safe_writes_leaves_only_ignored_temp_files(tmp_path):
    """A segment or instance file being written when the crash came is a temp file: ignored on open."""
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    last = _fill(root, 100)
    seg = sorted((root / "journal").glob("*.msj"))[-1]
    nxt = int(seg.stem) + 1
    (root / "journal" / f".{nxt:08d}.msj.tmp-99999").write_bytes(b"MSJSEG01 half a header")
    (root / ".instance.msi.tmp-99999").write_bytes(b"MSI1 half")
    with multisite.open(root) as db:
        assert db.seqno == last
        for i in range(100, 200):
            db.set("crash", ("w", i), i)
    with multisite.open(root) as db:
        assert db.seqno == last + 100
        _check_journal(db)


def test_recovery_hardens_the_replayed_journal_before_the_store(tmp_path, monkeypatch):
    """Journal first, then database, on open too: records a crashed writer left in the page cache are
    fsynced before the store that now reflects them is, so a power loss cannot leave it ahead."""
    from multisite.engine import recovery
    from multisite.store.sqlite import Store

    root = multisite.create(tmp_path / "A", name="A", durability="none")
    child = ("import os, sys, multisite\n"
             "db = multisite.open(sys.argv[1]); db.create_region('r')\n"
             "[db.set('r', (i,), i) for i in range(200)]\n"
             "os._exit(0)  # no close: the store is behind the journal\n")
    subprocess.run([sys.executable, "-c", child, str(root)], check=True, timeout=60)
    order: list[str] = []
    real_sync, real_flush = recovery.fsync_file, Store.flush
    monkeypatch.setattr(recovery, "fsync_file", lambda p: (order.append("journal"), real_sync(p))[1])
    monkeypatch.setattr(Store, "flush", lambda self: (order.append("store"), real_flush(self))[1])
    with multisite.open(root) as db:
        assert db.recovery.replayed > 0 and db.seqno == 200
    assert order[:2] == ["journal", "store"], order
