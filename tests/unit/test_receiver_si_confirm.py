"""A supplementary instance confirms, on its SI stream, only what its journal hardened.

The Receiver Server's answers read the stream's seqno without the commit lock, and an SI apply moves
it before the batch's journal write and fdatasync: while that fdatasync runs (on the Update Process's
thread or on the receiver's loop, ``apply_here``), or after it failed, an answer confirmed
transactions a crash of the supplementary would lose. Its confirmation is the stream's seqno as of
the journal's hardened position (``Database.hardened_stream_seqno``, ``engine.streams``), as a BC
secondary's is its hardened seqno."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

import multisite
from multisite.engine.streams import marked, seqno_as_of
from multisite.journal.records import SET, FrameRun, Record, Update, encode_record
from multisite.replication.server.pools import ReceivePool
from multisite.replication.server.receiver import ReceiverServer
from multisite.replication.server.update import UpdateProcess
from multisite.testing.checks import held_fdatasync

STREAM = 1


def source_record(seqno: int) -> Record:
    """Seqno ``seqno`` of the source that stream 1 comes from."""
    return Record(seqno, 0, seqno, "A", 1700000000.0, [Update(SET, "acct", ("k", seqno), b"\x01")])


def until(probe, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def answers_of(db, update) -> ReceiverServer:
    """A Receiver Server as far as its answers go: what they read is the instance and the SI stream."""
    rec = ReceiverServer.__new__(ReceiverServer)
    rec.db, rec.update = db, update
    return rec


@pytest.fixture(params=["group", "fsync"])
def supplementary(request, tmp_path):
    db = multisite.open(multisite.create(tmp_path / "P", "P", supplementary=True, durability=request.param))
    db.create_region("acct")
    db.set("acct", ("own",), 1)  # a commit of its own (stream 0) before the stream: positions differ
    yield db
    db.close()


def test_no_confirmation_while_the_fdatasync_of_an_si_apply_runs(supplementary):
    db = supplementary
    db.apply_records([source_record(s) for s in (1, 2, 3)], si_stream=STREAM)
    rec = answers_of(db, SimpleNamespace(si_stream=STREAM))
    assert rec._applied_seqno() == 3
    with held_fdatasync(db._core.journal) as (in_sync, release):  # the batch's fdatasync takes a while
        t = threading.Thread(target=db.apply_records, args=([source_record(s) for s in (4, 5, 6)],),
                             kwargs={"si_stream": STREAM})
        t.start()
        try:
            assert in_sync.wait(10)
            assert db.stream_seqno(STREAM) == 6  # applied, journaled, not hard
            confirmed_meanwhile = rec._applied_seqno()
        finally:
            release.set()
            t.join()
    assert confirmed_meanwhile == 3
    assert rec._applied_seqno() == 6


def test_no_confirmation_of_an_si_batch_whose_fdatasync_failed_on_the_receivers_loop(tmp_path, monkeypatch):
    db = multisite.open(multisite.create(tmp_path / "P", "P", supplementary=True, durability="group"))
    db.create_region("acct")
    log = logging.getLogger(f"test-si-confirm-{id(db)}")
    log.propagate = False
    up = UpdateProcess(db, ReceivePool(10**6, 10**5), log, stats_interval_s=3600)
    up.si_stream = STREAM
    up.idle_wait_s = 3600
    up.place.max_s = 60.0  # a loaded machine's fdatasync: the loop applies anyway
    rec = answers_of(db, up)
    try:
        up.start()
        up.pool.put(FrameRun.of([(1, encode_record(source_record(1)))]))
        until(lambda: up.status()["applied"] == 1, "1 applied by the thread")
        assert rec._applied_seqno() == 1
        up.pool.put(FrameRun.of([(2, encode_record(source_record(2)))]), wake=False)

        def eio(fd):
            raise OSError(5, "Input/output error")
        with monkeypatch.context() as m:
            m.setattr("os.fdatasync", eio)
            assert up.apply_here() is None  # journaled, its fdatasync failed: handed to the thread
        assert db.stream_seqno(STREAM) == 2  # moved by the apply, never hardened
        assert rec._applied_seqno() == 1
    finally:
        up.stop()
        db.close()


def test_a_stream_seqno_as_of_a_hardened_position():
    # Stream at 3 before a write from position 10 (held at 5 before a write from position 7).
    marks = marked(marked((), 7, 2, hard=6), 10, 3, hard=6)
    assert marks == ((7, 2), (10, 3))
    assert seqno_as_of(marks, current=5, hard=6) == 2  # neither write hard
    assert seqno_as_of(marks, current=5, hard=9) == 3  # the first one
    assert seqno_as_of(marks, current=5, hard=12) == 5  # both
    assert seqno_as_of((), current=5, hard=0) == 5  # nothing written since the last hard point
    assert marked(marks, 12, 5, hard=9) == ((10, 3), (12, 5))  # a hard mark goes
    assert marked(marks, 12, 5, hard=11) == ((12, 5),)
    assert marked(marks, 10, 4, hard=6) == ((7, 2), (10, 4))  # a write undone (its position reused) goes
    assert seqno_as_of(marks, current=1, hard=6) == 1  # rolled back below the marks: the stream now


class Gate:
    """The writer's fsync lock, with hooks to order the two threads deterministically."""

    def __init__(self, t1_trying: threading.Event, t1_in: threading.Event):
        self.lock = threading.Lock()
        self.t1_trying, self.t1_in = t1_trying, t1_in

    def __enter__(self):
        if threading.current_thread().name == "T1-harden":
            self.t1_trying.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
        if threading.current_thread().name == "T2-apply":
            # the harden thread takes the lock and starts its fdatasync before sync() stores its seqno
            self.t1_in.wait(0.5)


def test_the_hard_position_never_goes_back_when_an_apply_sync_and_a_commit_harden_interleave(tmp_path):
    """``sync`` (an SI apply, under the commit lock) stored the journal's hard position after it released
    the fsync lock; a ``harden`` of a lower token (a local commit, without the commit lock) that took the
    lock in between stored its own target after it: the position went back below what was hard, and the
    SI confirmation, read as of it, stayed below the stream's hardened transaction (found by review)."""
    db = multisite.open(multisite.create(tmp_path / "P", "P", supplementary=True, durability="group"))
    try:
        db.create_region("acct")
        db.set("acct", ("own",), 1)  # seqno 1, hard
        j = db._core.journal
        # A local commit (stream 0), written, its fdatasync not yet run: what the client listener does
        prep = db.prepare([[(SET, "acct", ("own", 2), b"\x01")]])
        token = prep.write()
        assert (j.written_seqno, j.durable_seqno) == (2, 1)

        t2_in, t1_trying, t1_in = threading.Event(), threading.Event(), threading.Event()
        real = j._fdatasync

        def fdatasync(fd):
            name = threading.current_thread().name
            if name == "T2-apply":
                t2_in.set()
                assert t1_trying.wait(5)
                time.sleep(0.05)  # T1 is blocked on the fsync lock
            elif name == "T1-harden":
                t1_in.set()
                deadline = time.monotonic() + 5
                while j.durable_seqno < 3 and time.monotonic() < deadline:  # sync() stores 3 meanwhile
                    time.sleep(0.001)
            real(fd)

        j._fdatasync = fdatasync
        j._fsync_lock = Gate(t1_trying, t1_in)
        t2 = threading.Thread(target=db.apply_records, args=([source_record(1)],), kwargs={"si_stream": STREAM},
                              name="T2-apply")
        t2.start()
        assert t2_in.wait(5)
        t1 = threading.Thread(target=db.harden, args=(token,), name="T1-harden")
        t1.start()
        t1.join(10)
        t2.join(10)
        j._fdatasync = real

        assert j.written_seqno == 3 and db.seqno == 3
        assert db.stream_seqno(STREAM) == 1  # applied, journaled and fdatasynced (by sync())
        rec = ReceiverServer.__new__(ReceiverServer)
        rec.db, rec.update = db, SimpleNamespace(si_stream=STREAM)
        assert j.durable_seqno >= 3, f"durable_seqno went back to {j.durable_seqno} (written 3, all of it fdatasynced)"
        assert rec._applied_seqno() == 1
    finally:
        db.close()
