"""The journal pool (a bounded window of the newest frames) and the receive pool (XOFF/XON marks)."""

from __future__ import annotations

import asyncio
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.journal.records import FrameRun
from multisite.replication.server.pools import JournalPool, ReceivePool


def fr(seqno: int, size: int = 30) -> bytes:
    """A stand-in frame of ``size`` bytes that says which seqno it is."""
    tag = f"#{seqno}:".encode()
    return tag + b"." * (size - len(tag))


def filled(capacity: int, first: int, last: int, size: int = 30) -> JournalPool:
    p = JournalPool(capacity)
    p.reset(first - 1)
    for s in range(first, last + 1):
        p.extend(s, [fr(s, size)])
    return p


# -- journal pool ----------------------------------------------------------------------------------

def test_journal_pool_keeps_the_newest_frames_within_capacity():
    p = filled(100, 1, 10)  # 30-byte frames: three fit in 100 bytes
    assert (p.first_seqno, p.last_seqno, p.bytes) == (8, 10, 90)
    assert (p.appended, p.evicted) == (10, 7)
    assert p.read(8, 1 << 20) == [fr(8), fr(9), fr(10)]
    assert p.read(10, 1 << 20) == [fr(10)]


def test_journal_pool_read_below_first_seqno_is_none():
    p = filled(100, 1, 10)
    for s in (1, 5, 7):
        assert p.read(s, 1 << 20) is None  # the Source Server must read journal files
    assert p.read(8, 1 << 20) is not None


def test_journal_pool_read_beyond_the_end_is_empty():
    p = filled(100, 1, 10)
    assert p.read(11, 1 << 20) == []
    assert p.read(50, 1 << 20) == []


def test_journal_pool_read_honours_max_bytes_but_returns_at_least_one_frame():
    p = filled(1000, 1, 10)
    assert p.read(1, 1) == [fr(1)]
    assert p.read(1, 60) == [fr(1), fr(2)]
    assert p.read(1, 61) == [fr(1), fr(2), fr(3)]


def test_a_frame_larger_than_the_pool_is_still_kept_alone():
    p = filled(100, 1, 3)
    p.extend(4, [fr(4, 500)])
    assert (p.first_seqno, p.last_seqno, p.bytes) == (4, 4, 500)
    assert p.read(4, 1 << 20) == [fr(4, 500)]
    assert p.read(3, 1 << 20) is None


def test_journal_pool_reset_starts_empty_after_a_seqno():
    p = filled(1000, 1, 10)
    p.reset(50)
    assert (p.first_seqno, p.last_seqno, p.bytes) == (51, 50, 0)
    assert p.read(51, 1 << 20) == []
    assert p.read(50, 1 << 20) is None  # not held: read it from the files
    assert p.read(10, 1 << 20) is None
    p.extend(51, [fr(51)])
    assert p.read(51, 1 << 20) == [fr(51)]


def test_a_discontinuity_rollback_restarts_the_pool():
    p = filled(1000, 1, 10)
    p.extend(6, [fr(6, 31)])  # after a rollback to 5 the next commit is 6 again
    assert (p.first_seqno, p.last_seqno) == (6, 6)
    assert p.read(5, 1 << 20) is None
    assert p.read(6, 1 << 20) == [fr(6, 31)]  # the new 6, never the old one


def test_a_fresh_pool_holds_nothing():
    p = JournalPool(1000)
    p.reset(0)
    assert p.read(1, 1 << 20) == []
    p2 = JournalPool(1000)
    p2.reset(7)  # an instance opened at seqno 7
    assert p2.read(1, 1 << 20) is None and p2.read(8, 1 << 20) == []


def test_journal_pool_compacts_its_list_and_stays_correct():
    p = filled(300, 1, 20_000, size=30)
    assert (p.first_seqno, p.last_seqno) == (19_991, 20_000)
    assert len(p._frames) - p._head == 10 and p._head <= 4096 + 10
    assert p.read(19_991, 1 << 20) == [fr(s) for s in range(19_991, 20_001)]
    assert p.read(19_990, 1 << 20) is None


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 400), sizes=st.lists(st.integers(1, 120), min_size=1, max_size=60),
       start=st.integers(0, 1000), probe=st.integers(0, 2000), max_bytes=st.integers(1, 500))
def test_journal_pool_model(capacity, sizes, start, probe, max_bytes):
    """Against a model: the newest frames whose total fits (at least one), contiguous seqnos."""
    p = JournalPool(capacity)
    p.reset(start)
    frames = {start + 1 + i: fr(start + 1 + i, max(n, 8)) for i, n in enumerate(sizes)}
    for s, f in frames.items():
        p.extend(s, [f])
    last = start + len(sizes)
    kept, total = [], 0
    for s in range(last, start, -1):
        if kept and total + len(frames[s]) > capacity:
            break
        kept.insert(0, s)
        total += len(frames[s])
    assert (p.first_seqno, p.last_seqno, p.bytes) == (kept[0], last, total)
    got = p.read(probe, max_bytes)
    if probe > last:
        assert got == []
    elif probe < kept[0]:
        assert got is None
    else:
        assert got and got[0] == frames[probe]
        assert got == [frames[s] for s in range(probe, probe + len(got))]
        assert sum(map(len, got[:-1])) < max_bytes


def test_wait_beyond_wakes_on_an_append_from_another_thread():
    p = filled(1000, 1, 5)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        loop.call_soon(lambda: threading.Thread(target=p.extend, args=(6, [fr(6)])).start())
        await p.wait_beyond(5, timeout=30)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 20  # woken by the append, not by the 30 s timeout
    assert p.last_seqno == 6


def test_wait_beyond_returns_at_once_when_already_beyond():
    p = filled(1000, 1, 5)
    asyncio.run(asyncio.wait_for(p.wait_beyond(3, timeout=30), 20))


# -- receive pool ----------------------------------------------------------------------------------

def items(first: int, n: int, size: int = 100) -> list[tuple[int, bytes]]:
    return [(s, fr(s, size)) for s in range(first, first + n)]


def run(first: int, n: int, size: int = 100) -> FrameRun:
    """A received batch of ``n`` frames of ``size`` bytes from seqno ``first``."""
    return FrameRun.of(items(first, n, size))


def seqnos(runs) -> list[int]:
    return [s for r in runs for s, _ in r.frames()]


def test_receive_pool_signals_xoff_above_the_high_water_mark():
    p = ReceivePool(high_bytes=1000, low_bytes=250)
    assert p.put(run(1, 10)) is False  # exactly 1000 bytes: not above
    assert (p.bytes, len(p), p.received_seqno) == (1000, 10, 10)
    assert p.put(run(11, 1)) is True
    assert p.received_seqno == 11


def test_receive_pool_calls_on_drained_below_the_low_water_mark():
    p = ReceivePool(high_bytes=1000, low_bytes=250)
    drained: list[int] = []
    p.on_drained = lambda: drained.append(p.bytes)
    for first, n in ((1, 5), (6, 5), (11, 2)):
        p.put(run(first, n))
    gen, got = p.take(5, timeout=0)
    assert seqnos(got) == [1, 2, 3, 4, 5] and drained == []  # 700 bytes left
    gen, got = p.take(5, timeout=0)
    assert p.bytes == 200 and drained == [200]  # 200 < 250: XON may go
    gen, got = p.take(5, timeout=0)
    assert seqnos(got) == [11, 12] and p.bytes == 0 and drained == [200, 0]
    gen, got = p.take(5, timeout=0)
    assert got == [] and drained == [200, 0]  # nothing taken, no call


def test_receive_pool_take_keeps_order_and_gives_whole_batches_up_to_max_frames():
    """A received batch is never split (it is journaled as it came); a take gives at least one."""
    p = ReceivePool(10**6, 10**5)
    for first, n in ((1, 7), (8, 3), (11, 2)):
        p.put(run(first, n))
    assert [seqnos(p.take(4, timeout=0)[1]) for _ in range(3)] == [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [11, 12]]
    assert len(p) == 0 and p.bytes == 0


def test_clear_bumps_the_generation_so_taken_frames_are_known_stale():
    p = ReceivePool(10**6, 10**5)
    p.put(run(1, 2))
    p.put(run(3, 3))
    gen_before, got = p.take(2, timeout=0)
    p.clear(received_seqno=2)
    assert (len(p), p.bytes, p.received_seqno) == (0, 0, 2)
    assert p.generation == gen_before + 1
    p.put(run(3, 2))
    gen_after, got2 = p.take(10, timeout=0)
    assert gen_after == p.generation != gen_before
    assert seqnos(got2) == [3, 4]


def test_take_reports_the_generation_current_after_its_wait():
    """A take that waited while the receiver restarted the stream belongs to the new generation."""
    p = ReceivePool(10**6, 10**5)
    result: list = []
    t = threading.Thread(target=lambda: result.append(p.take(10, timeout=30)))
    t.start()
    deadline = time.monotonic() + 20
    while not p._cond._waiters:  # until the taker sleeps in its wait (CPython's Condition)
        assert time.monotonic() < deadline
    p.clear(received_seqno=0)
    p.put(run(1, 2))
    t.join(20)
    assert not t.is_alive()
    gen, got = result[0]
    assert gen == p.generation == 1 and seqnos(got) == [1, 2]


def test_quiesce_waits_for_the_batch_being_applied():
    p = ReceivePool(10**6, 10**5)
    order: list[str] = []
    p.apply_lock.acquire()
    t = threading.Thread(target=lambda: (p.quiesce(), order.append("quiesced")))
    t.start()
    order.append("applied")
    p.apply_lock.release()
    t.join(20)
    assert order == ["applied", "quiesced"]
