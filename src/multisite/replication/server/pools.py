"""The journal pool (primary side) and the receive pool (secondary side).

Journal pool: a bounded in-memory window of the newest journal frames, filled by the commit path
(under the commit lock, so in seqno order) and read by Source Servers. It never blocks a commit:
when full it forgets its oldest frames, and a Source Server that needs them reads journal files
instead, returning to the pool once caught up. Seqnos in the pool are contiguous, so a read is an
index computation.

Receive pool: the batches of frames a Receiver Server has received and the Update Process has not
yet applied, in order, with a byte count that drives XOFF/XON flow control.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from ...journal.records import FrameRun


class JournalPool:
    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._frames: list[bytes] = []
        self._head = 0  # index of the oldest kept frame in _frames
        self.first_seqno = 0  # seqno of _frames[_head]
        self.last_seqno = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.appended = 0
        self.evicted = 0

    def reset(self, last_seqno: int) -> None:
        """Start empty after ``last_seqno`` (at server start, and after a rollback)."""
        with self._lock:
            self._frames, self._head, self.bytes = [], 0, 0
            self.last_seqno = last_seqno
            self.first_seqno = last_seqno + 1

    def extend(self, first_seqno: int, frames: list[bytes]) -> None:
        """Commit listener: the frames of seqnos ``first_seqno``.. (consecutive), called under the
        commit lock, in seqno order."""
        with self._lock:
            if first_seqno != self.last_seqno + 1:  # discontinuity (a rollback): start over
                self._frames, self._head, self.bytes = [], 0, 0
            if self._head == len(self._frames):
                self.first_seqno = first_seqno
            self._frames.extend(frames)
            self.bytes += sum(map(len, frames))
            self.last_seqno = first_seqno + len(frames) - 1
            self.appended += len(frames)
            while self.bytes > self.capacity_bytes and len(self._frames) - self._head > 1:
                self.bytes -= len(self._frames[self._head])
                self._head += 1
                self.first_seqno += 1
                self.evicted += 1
            if self._head > 4096 and self._head * 2 > len(self._frames):
                del self._frames[: self._head]
                self._head = 0
            waiters, self._waiters = self._waiters, []
        for loop, ev in waiters:
            loop.call_soon_threadsafe(ev.set)

    def read(self, from_seqno: int, max_bytes: int) -> list[bytes] | None:
        """Frames from ``from_seqno`` on (up to about ``max_bytes``); [] if none yet; None if
        ``from_seqno`` is older than the pool holds (read the journal files instead)."""
        with self._lock:
            if from_seqno > self.last_seqno:
                return []
            if from_seqno < self.first_seqno or self._head == len(self._frames):
                return None
            i = self._head + (from_seqno - self.first_seqno)
            out, size = [], 0
            frames = self._frames
            while i < len(frames) and size < max_bytes:
                out.append(frames[i])
                size += len(frames[i])
                i += 1
            return out

    async def wait_beyond(self, seqno: int, timeout: float) -> None:
        """Wait until a frame after ``seqno`` is in the pool, or ``timeout`` seconds."""
        ev = asyncio.Event()
        with self._lock:
            if self.last_seqno > seqno:
                return
            self._waiters.append((asyncio.get_running_loop(), ev))
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class ReceivePool:
    """Received batches (``FrameRun``s, checked) not yet applied, in order, with their byte and
    frame counts; the bytes drive XOFF/XON. ``put`` from the receiver, ``take`` from the Update
    Process. A batch stays whole from the wire to the journal: nothing here parses it."""

    def __init__(self, high_bytes: int, low_bytes: int):
        self.high_bytes, self.low_bytes = high_bytes, low_bytes
        self._q: deque[FrameRun] = deque()
        self.bytes = 0
        self.frames = 0
        self.received_seqno = 0
        self._cond = threading.Condition()
        self.generation = 0  # bumped by clear(): batches taken before it must not be applied
        # Held while a batch is taken and applied (by the Update Process's thread, or on the receiver's
        # loop, ``UpdateProcess.apply_here``): batches are taken and applied in order, one applier at a time;
        # and by a rollback, from before its source's Hello is fetched until it is done (``InstanceServer``).
        self.apply_lock = threading.Lock()
        self.on_drained = None  # called (by whoever took, under apply_lock) when bytes fall below low

    def put(self, run: FrameRun, wake: bool = True) -> bool:
        """Add a received batch; True if the pool is now above its high-water mark (send XOFF). With
        ``wake`` False the Update Process is not woken for it: the receiver then either applies it on
        its own loop or calls ``wake`` (no thread wake-up per batch when it applies them itself)."""
        with self._cond:
            self._q.append(run)
            self.bytes += len(run.data)
            self.frames += len(run)
            self.received_seqno = run.last_seqno
            if wake:
                self._cond.notify()
            return self.bytes > self.high_bytes

    def wake(self) -> None:
        """Wake the Update Process if it waits (for batches put with ``wake`` False)."""
        with self._cond:
            self._cond.notify()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a batch; whether one is there (it may be taken by the time the
        caller holds ``apply_lock``: ``take`` under that lock is the one that counts)."""
        with self._cond:
            if not self._q:
                self._cond.wait(timeout)
            return bool(self._q)

    def take(self, max_frames: int, timeout: float) -> tuple[int, list[FrameRun]]:
        """Whole batches holding up to about ``max_frames`` frames (at least one batch; waiting up
        to ``timeout`` s for one), with the generation they belong to."""
        with self._cond:
            if not self._q:
                self._cond.wait(timeout)
            gen = self.generation
            out: list[FrameRun] = []
            n = 0
            while self._q and (not out or n + len(self._q[0]) <= max_frames):
                run = self._q.popleft()
                self.bytes -= len(run.data)
                self.frames -= len(run)
                n += len(run)
                out.append(run)
            below = self.bytes < self.low_bytes
        if out and below and self.on_drained is not None:
            self.on_drained()
        return gen, out

    def put_back(self, gen: int, runs: list[FrameRun]) -> None:
        """Return batches ``take`` gave out (and that were not applied) to the front of the pool, in
        order, unless the pool was cleared since (generation ``gen``): they come again then."""
        with self._cond:
            if gen != self.generation or not runs:
                return
            self._q.extendleft(reversed(runs))
            self.bytes += sum(len(r.data) for r in runs)
            self.frames += sum(len(r) for r in runs)
            self._cond.notify()

    def clear(self, received_seqno: int) -> None:
        with self._cond:
            self._q.clear()
            self.bytes = self.frames = 0
            self.received_seqno = received_seqno
            self.generation += 1

    def quiesce(self) -> None:
        """Wait for the batch being applied to be finished (call after clear)."""
        with self.apply_lock:
            pass

    def __len__(self) -> int:
        """Frames (transactions) waiting."""
        return self.frames
