"""A primary shard's replica feeds: one link per subscribed replica (``Feeds``, ``Link``).

A replica subscribes (``serve``); ``shipping.start_point`` decides how it starts: catch up from the
journal files (``_catch_up``, one run in memory at a time, whatever its lag), cut back (``Resync``:
it subscribes again), or a checkpoint copy (``_checkpoint``: the store's state at its seqno, then
the frames after it from the files). Once a link has every committed frame it is *live*: each
committed batch goes to it as it commits (``ship``), and a synchronous replica may count current
again. A live link whose socket buffer holds more than ``LIVE_BUFFER_LIMIT`` drops back to reading
the files, so a slow replica never holds the primary's memory. The primary never waits for a feed.

It is its own object because the links live as long as their replicas' connections, not as long as
a batch: the batch pipeline (``primary.py``) writes the vote's frames and outcomes to the voters'
links and hands each committed batch to ``ship``; the feeds hand back what their replicas say
(a vote, a dropped link, a replica that holds everything) through the primary's ``on_vote``,
``replica_dropped`` and ``replica_ready``. They read the primary's ``db``, ``committed`` (its last
committed seqno), ``view``, ``partition`` and ``host.checkpoint_after``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from ...engine.checkpoint import read_state
from ...errors import ProtocolError
from ..shard_wire import (Checkpoint, CheckpointEnd, DataWire, FailCode, Failed, Frames, Progress, Resync, Rows,
                          Subscribe, Voted, encode)
from ..shipping import TAIL_FRAMES, StartKind, digest, start_point
from ..wire import View
from .shard import frame_digests, joined, journal_first, log, read_into, runs

LIVE_BUFFER_LIMIT = 32 << 20  # a live replica further behind than this in the socket buffer catches up from files
CHECKPOINT_ROWS = 5000


class Link:
    """A replica's subscription, on its primary."""

    def __init__(self, name: str, role: str, writer: asyncio.StreamWriter):
        self.name, self.role, self.writer = name, role, writer
        self.live = False  # gets each committed batch as it commits (else: catching up from files)
        self.acked = 0  # the replica's last Progress
        self.sent = 0  # the last seqno sent
        self.closed = asyncio.Event()

    def send(self, msg) -> None:
        self.writer.write(encode(msg))


class Feeds:
    """The links of one primary shard to its replicas (see the module docstring)."""

    def __init__(self, primary) -> None:
        self.primary, self.partition = primary, primary.partition
        self.links: dict[str, Link] = {}
        # (seqno, digest) of the last committed frames, so that a subscription compares tails without a
        # scan of the journal files (which starts at a segment's beginning)
        self.recent: deque[tuple[int, bytes]] = deque(maxlen=2 * TAIL_FRAMES)

    def update(self, view: View) -> None:
        """New placement: drop the links of replicas no longer assigned, give the others their role."""
        wanted = set(view.sync) | set(view.async_)
        for name in [n for n in self.links if n not in wanted]:
            self.drop(name, "no longer a replica of this partition")
        for link in self.links.values():
            link.role = "sync" if link.name in view.sync else "async"

    def close(self, why: str) -> None:
        for name in list(self.links):
            self.drop(name, why)

    def drop(self, name: str, why: str) -> None:
        link = self.links.pop(name, None)
        if link is None:
            return
        log.info("partition %d: replica %s dropped: %s", self.partition, name, why)
        self.primary.replica_dropped(name)
        link.closed.set()
        link.writer.close()

    def ship(self, first_seqno: int, frames: list[tuple[int, bytes]], committed: int, decision) -> None:
        """A batch committed at ``committed``: its frames go to every live link but the voters' (they
        hold them), and a link too far behind in its socket buffer drops back to the files."""
        self.recent.extend((seqno, digest(f)) for seqno, f in frames)
        data, ends = joined(frames)
        msg = None
        for link in self.links.values():
            if link.live and (decision is None or link.name not in decision.voters):
                if link.writer.transport.get_write_buffer_size() > LIVE_BUFFER_LIMIT:
                    link.live = False
                    asyncio.create_task(self._catch_up(link))
                    continue
                msg = msg or encode(Frames(first_seqno, data, ends, 0))
                link.writer.write(msg)
                link.sent = committed
            elif decision is not None and link.name in decision.voters:
                link.sent = committed

    def status(self, committed: int) -> dict:
        return {n: {"role": lk.role, "live": lk.live, "acked": lk.acked, "sent": lk.sent,
                    "backlog": committed - lk.acked} for n, lk in self.links.items()}

    # -- a subscription ----------------------------------------------------------------------------
    async def serve(self, sub: Subscribe, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    wire: DataWire) -> None:
        """A replica's subscription, until it ends."""
        role = self._role(sub, writer)
        if role is None:
            return
        start = await self._start(sub, role)
        if start.kind is StartKind.RESYNC:
            writer.write(encode(Resync(start.seqno, start.why)))
            return
        self.drop(sub.replica, "subscribed again")
        link = Link(sub.replica, role, writer)
        self.links[sub.replica] = link
        try:
            if start.kind is StartKind.CHECKPOINT:
                link.sent = await self._checkpoint(link)
            else:
                link.sent = start.seqno
            link.acked = link.sent
            reading = asyncio.create_task(self._read_link(link, reader, wire))
            await self._catch_up(link)
            await asyncio.wait([reading, asyncio.create_task(link.closed.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            reading.cancel()
        finally:
            if self.links.get(sub.replica) is link:
                self.drop(sub.replica, "its connection ended")

    def _role(self, sub: Subscribe, writer: asyncio.StreamWriter) -> str | None:
        """The subscriber's role at this epoch; None (and the refusal written) if it has none."""
        view, epoch = self.primary.view, self.primary.epoch
        role = "sync" if sub.replica in view.sync else "async" if sub.replica in view.async_ else None
        if role is None:
            writer.write(encode(Failed(0, FailCode.NOT_ASSIGNED, f"{sub.replica} is not a replica of partition "
                                                                 f"{self.partition} at epoch {epoch}")))
            return None
        if sub.epoch != epoch:
            writer.write(encode(Failed(0, FailCode.STALE_EPOCH, f"partition {self.partition} is at epoch "
                                                                f"{epoch}, the replica at {sub.epoch}")))
            return None
        return role

    async def _start(self, sub: Subscribe, role: str):
        """Where the subscriber starts (``shipping.start_point``), from the digests of its last frames."""
        lo = min((s for s, _ in sub.tail), default=sub.seqno + 1)
        hi = min(sub.seqno, self.primary.committed)
        if self.recent and self.recent[0][0] <= lo:  # the usual case: a replica near the end of the journal
            mine = {s: d for s, d in self.recent if lo <= s <= hi}
        else:  # a scan of the journal files (from the start of a segment)
            mine = await asyncio.get_running_loop().run_in_executor(None, frame_digests, self.primary.db, lo, hi)
        start = start_point(primary_seqno=self.primary.committed, journal_first=journal_first(self.primary.db),
                            primary_digests=mine, replica_seqno=sub.seqno, replica_tail=[tuple(t) for t in sub.tail],
                            checkpoint_after=self.primary.host.checkpoint_after)
        log.info("partition %d: %s replica %s subscribes at seqno %d: %s (%s)", self.partition, role, sub.replica,
                 sub.seqno, start.kind.value, start.why)
        return start

    async def _read_link(self, link: Link, reader: asyncio.StreamReader, wire: DataWire) -> None:
        try:
            while True:
                msg = await read_into(reader, wire)
                if msg is None:
                    return
                if isinstance(msg, Voted):
                    self.primary.on_vote(link, msg)
                elif isinstance(msg, Progress):
                    link.acked = max(link.acked, msg.seqno)
                    self.primary.replica_ready(link)
                elif isinstance(msg, Failed):
                    log.warning("partition %d: replica %s: %s: %s", self.partition, link.name, msg.code, msg.message)
                    return
        except (ProtocolError, OSError) as e:
            log.info("partition %d: replica %s link: %s", self.partition, link.name, e)
        finally:
            if self.links.get(link.name) is link:
                self.drop(link.name, "its connection ended")

    async def _catch_up(self, link: Link) -> None:
        """Send the committed frames after ``link.sent`` from the journal files, then go live."""
        loop = asyncio.get_running_loop()
        while not link.closed.is_set():
            if link.sent >= self.primary.committed:
                link.live = True
                self.primary.replica_ready(link)
                return
            it = runs(self.primary.db, link.sent + 1, self.primary.committed)
            while not link.closed.is_set():  # one run in memory at a time, whatever the replica's lag
                run = await loop.run_in_executor(None, next, it, None)
                if run is None:
                    break
                link.send(Frames(run.first_seqno, bytes(run.data), list(run.ends), 0))
                link.sent = run.last_seqno
                await link.writer.drain()

    async def _checkpoint(self, link: Link) -> int:
        """Send the primary's state at its store's seqno; the seqno."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.primary.db.flush)
        t0 = time.monotonic()
        with read_state(self.primary.db.layout.root) as st:
            d = dict(self.recent).get(st.seqno)  # the store's seqno is recent: it was just flushed
            if d is None:
                d = (await loop.run_in_executor(None, frame_digests, self.primary.db, st.seqno, st.seqno)).get(
                    st.seqno, b"")
            link.send(Checkpoint(st.seqno, d, st.regions, st.keys))
            it = st.batches(CHECKPOINT_ROWS)
            sent = 0
            while True:
                rows = await loop.run_in_executor(None, next, it, None)
                if rows is None:
                    break
                link.send(Rows(rows))
                sent += len(rows)
                await link.writer.drain()
            link.send(CheckpointEnd(sent))
        log.info("partition %d: checkpoint at seqno %d (%d keys) sent to %s in %.1f s", self.partition, st.seqno,
                 sent, link.name, time.monotonic() - t0)
        return st.seqno
