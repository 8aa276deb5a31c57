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
