"""The Update Process when a batch cannot be applied: nothing is dropped, and only a gap restarts the stream.

A record the engine refuses (an opcode that is no set/kill/zkill: TransactionError) used to be taken
for a gap: the pool was emptied and the receiver restarted the connection, and the source sent the
same record again, forever. It now stops the Update Process visibly, with the batch back in the
receive pool, so that `update start` (once the cause is fixed) goes on without a reconnection.
"""

from __future__ import annotations

from multisite.journal.records import Record, Update, encode_record
from multisite.journal.records import FrameRun
from multisite.replication.pools import ReceivePool

from .test_update_process import rec_frame, until, up  # noqa: F401 - up: the same fixture


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
