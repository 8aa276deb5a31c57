"""The Update Process on a real instance: in order, exactly once, gaps handed back, bad records visible."""

from __future__ import annotations

import logging
import time

import pytest

import multisite
from multisite.journal.records import SET, Record, Update, encode_record, frame
from multisite.journal.records import FrameRun
from multisite.replication.server.pools import ReceivePool
from multisite.replication.server.update import UpdateProcess


def rec_frame(seqno: int) -> tuple[int, bytes]:
    return seqno, encode_record(Record(seqno, 0, seqno, "A", 1700000000.0,
                                       [Update(SET, "acct", ("k", seqno), b"\x01")]))


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def until(probe, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (got := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return got


@pytest.fixture
def up(tmp_path):
    db = multisite.open(multisite.create(tmp_path / "B", "B", durability="none"))
    pool = ReceivePool(10**6, 10**5)
    log = logging.getLogger(f"test-update-{id(db)}")
    log.propagate = False
    h = ListHandler()
    log.addHandler(h)
    u = UpdateProcess(db, pool, log, stats_interval_s=3600)
    u.lines = h.lines
    yield u
    u.stop()
    db.close()


def test_applies_in_order_and_exactly_once(up):
    up.start()
    up.pool.put(FrameRun.of([rec_frame(s) for s in range(1, 6)]))
    until(lambda: up.db.seqno == 5, "seqno 5")
    up.pool.put(FrameRun.of([rec_frame(s) for s in range(3, 9)]))  # 3..5 again (a resend), then new ones
    # The seqno moves inside the apply, the applied count just after it: wait for both.
    until(lambda: up.db.seqno == 8 and up.status()["applied"] == 8, "seqno 8, 8 applied")
    assert up.status()["applied"] == 8 and up.status()["error"] is None
    assert [k for k, _ in up.db.items("acct")] == [("k", s) for s in range(1, 9)]


def test_a_gap_clears_the_pool_and_asks_for_a_restart(up):
    gaps = []
    up.on_gap = lambda: gaps.append(up.db.seqno)
    up.start()
    up.pool.put(FrameRun.of([rec_frame(1), rec_frame(2)]))
    until(lambda: up.db.seqno == 2, "seqno 2")
    up.pool.put(FrameRun.of([rec_frame(4), rec_frame(5)]))  # 3 is missing
    until(lambda: gaps, "the gap callback")
    assert gaps == [2] and up.db.seqno == 2 and len(up.pool) == 0
    assert "JOURNAL_GAP" in up.status()["error"] and up.running
    up.pool.put(FrameRun.of([rec_frame(s) for s in range(3, 6)]))  # the restarted stream
    until(lambda: up.db.seqno == 5, "seqno 5")


def test_an_undecodable_record_stops_the_update_process_visibly(up):
    """A frame whose CRCs are right but whose payload is no Record (a peer of another version, a
    bug upstream): nothing of its batch is applied, and the failure shows in status and log."""
    up.start()
    up.pool.put(FrameRun.of([rec_frame(1), (2, frame(2, b"\xc1 not msgpack"))]))
    until(lambda: up.status()["error"], "the error in status")
    until(lambda: not up.running, "the update process to stop")
    assert up.db.seqno == 0  # the batch is applied whole or not at all
    assert up.status()["state"] == "stopped"
    assert any(line.startswith("ERROR") and "seqno 0" in line for line in up.lines), up.lines


# A batch the engine refuses: nothing is dropped, and only a gap restarts the stream.
# A record the engine refuses (an opcode that is no set/kill/zkill: TransactionError) used to be taken
# for a gap: the pool was emptied and the receiver restarted the connection, and the source sent the
# same record again, forever. It now stops the Update Process visibly, with the batch back in the
# receive pool, so that `update start` (once the cause is fixed) goes on without a reconnection.


def bad_opcode_frame(seqno: int) -> tuple[int, bytes]:
    return seqno, encode_record(Record(seqno, 0, seqno, "A", 1700000000.0, [Update(9, "acct", ("k", seqno), b"\x01")]))


def test_a_record_the_engine_refuses_stops_the_update_process_and_keeps_the_batch(up):
    gaps = []
    up.on_gap = lambda: gaps.append(up.db.seqno)
    up.start()
    up.pool.put(FrameRun.of([rec_frame(1), rec_frame(2)]))
    until(lambda: up.db.seqno == 2, "seqno 2")
    up.pool.put(FrameRun.of([rec_frame(3), bad_opcode_frame(4), rec_frame(5)]))
    until(lambda: not up.running, "the update process to stop")
    st = up.status()
    assert gaps == [], "a refused record is not a gap: restarting the stream only brings it again"
    assert "TRANSACTION" in st["error"] and st["state"] == "stopped"
    assert up.db.seqno == 2  # the batch is applied whole or not at all
    assert [s for r in up.pool._q for s, _ in r.frames()] == [3, 4, 5]
    assert up.pool.bytes == sum(len(r.data) for r in up.pool._q)


def test_put_back_returns_frames_to_the_front_unless_the_pool_was_cleared():
    pool = ReceivePool(10**6, 10**5)
    pool.put(FrameRun.of([(1, b"a"), (2, b"bb"), (3, b"ccc")]))
    gen, items = pool.take(2, timeout=0)
    pool.put(FrameRun.of([(4, b"dddd")]))
    pool.put_back(gen, items)
    assert [s for r in pool._q for s, _ in r.frames()] == [1, 2, 3, 4] and pool.bytes == 10
    gen, items = pool.take(2, timeout=0)
    pool.clear(0)
    pool.put_back(gen, items)  # stale: the restarted stream brings them again
    assert len(pool) == 0 and pool.bytes == 0


# -- applies on the receiver's loop (apply_here) beside the thread's ------------------------------------
# The thread is woken only by wake() here (idle_wait_s an hour): what apply_here sees is deterministic.

def test_apply_here_applies_in_order_once_measured_and_not_while_stopped(up):
    """The first batch goes to the thread (no apply measured yet); then a streamed read's batches put
    without waking the thread are applied by apply_here, in order, exactly once; a stopped Update
    Process applies nothing, here either, and the thread takes them once started."""
    up.idle_wait_s = 3600
    assert up.apply_here() is None  # not running
    up.start()
    up.pool.put(FrameRun.of([rec_frame(1), rec_frame(2)]), wake=False)
    assert up.apply_here() is None  # no apply measured yet
    up.pool.wake()
    until(lambda: up.status()["applied"] == 2, "2 applied by the thread")
    up.pool.put(FrameRun.of([rec_frame(2), rec_frame(3)]), wake=False)  # 2 again (a resend), then 3
    up.pool.put(FrameRun.of([rec_frame(4)]), wake=False)
    with up.pool.apply_lock:  # a rollback holds it (and the commit lock): the loop must not wait for it
        assert up.apply_here() is None and up.db.seqno == 2
    assert up.apply_here() == 2
    assert up.db.seqno == 4 and len(up.pool) == 0 and up.status()["applied_here"] == 2
    assert [k for k, _ in up.db.items("acct")] == [("k", s) for s in range(1, 5)]
    up.stop()
    up.pool.put(FrameRun.of([rec_frame(5)]), wake=False)
    assert up.apply_here() is None and up.db.seqno == 4
    up.start()
    up.pool.wake()
    until(lambda: up.db.seqno == 5, "seqno 5 by the thread")


def test_apply_here_leaves_a_catch_up_backlog_and_a_failed_batch_to_the_thread(up):
    gaps = []
    up.on_gap = lambda: gaps.append(up.db.seqno)
    up.idle_wait_s = 3600
    up.place.max_frames = 2
    up.start()
    up.pool.put(FrameRun.of([rec_frame(1)]))
    until(lambda: up.status()["applied"] == 1, "1 applied by the thread")
    up.pool.put(FrameRun.of([rec_frame(2), rec_frame(3), rec_frame(4)]), wake=False)
    assert up.apply_here() is None and up.db.seqno == 1  # a backlog: the thread's
    up.pool.wake()
    # the thread moves the seqno before its journal write and fdatasync, and holds the pool's apply
    # lock until they end: the loop's apply would not even try before that
    until(lambda: up.db.seqno == 4 and not up.pool.apply_lock.locked(), "seqno 4 by the thread, and its apply ended")
    # A gap found on the loop: the batch goes back to the pool, and the thread, applying it again, finds
    # the gap and asks for the restart, as it always did.
    up.pool.put(FrameRun.of([rec_frame(6)]), wake=False)
    assert up.apply_here() is None and up.db.seqno == 4
    assert any("receiver's loop failed at seqno 5" in line for line in up.lines), up.lines
    assert up.apply_here() is None  # handed back: the thread's until it took it
    up.pool.wake()
    until(lambda: gaps, "the gap callback from the thread")
    assert gaps == [4] and len(up.pool) == 0
    up.pool.put(FrameRun.of([rec_frame(5)]), wake=False)  # the restarted stream: on the loop again
    assert up.apply_here() == 1 and up.db.seqno == 5


def test_a_failed_fdatasync_on_the_loop_stops_the_update_process_as_on_the_thread(tmp_path, monkeypatch):
    """Group durability: the loop's apply journals the batch (the seqno moves), then its fdatasync
    fails. The thread, applying the batch again, found it applied and took that for a success: the
    Update Process went on running with no error over a journal writer that can harden nothing. It
    must stop visibly with the failure, as it does when the fdatasync fails on its own thread."""
    db = multisite.open(multisite.create(tmp_path / "B", "B", durability="group"))
    log = logging.getLogger(f"test-update-eio-{id(db)}")
    log.propagate = False
    h = ListHandler()
    log.addHandler(h)
    up = UpdateProcess(db, ReceivePool(10**6, 10**5), log, stats_interval_s=3600)
    up.idle_wait_s = 3600
    up.place.max_s = 60.0  # a loaded machine's fdatasync: the loop applies anyway
    try:
        up.start()
        up.pool.put(FrameRun.of([rec_frame(1)]))
        until(lambda: up.status()["applied"] == 1, "1 applied by the thread")
        up.pool.put(FrameRun.of([rec_frame(2)]), wake=False)

        def eio(fd):
            raise OSError(5, "Input/output error")
        with monkeypatch.context() as m:
            m.setattr("os.fdatasync", eio)
            assert up.apply_here() is None  # failed here: handed to the thread
        up.pool.wake()
        until(lambda: not up.running, "the update process to stop")
        st = up.status()
        assert st["state"] == "stopped" and "fdatasync" in st["error"], st
        assert any(line.startswith("ERROR") and "cannot apply received records" in line for line in h.lines), h.lines
    finally:
        up.stop()
        db.close()
