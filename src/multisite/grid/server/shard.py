"""A container's shards at work: a primary takes commits and ships them (a replica follows it: ``replica.py``).

**Primary** (``PrimaryShard``). One task per partition takes the requests queued by client
connections in batches. A batch of commits is prepared by the engine (``Database.prepare``: applied
and framed, not journaled, the commit lock held), its frames go to every *current* synchronous
replica as one ``Frames`` with a vote id, and the votes decide (``voting.SyncReplicas``): the primary
journals and hardens the batch only when at least ``min_sync`` replicas journaled it durably and voted
to commit; otherwise it undoes it (no trace) and each client gets ``VOTED_ROLLBACK`` with the counts.
Before it answers a batch that left a replica out (it voted no, timed out, or its link broke) the
primary reports its current set to the catalog and waits for the catalog's answer, so that the
catalog never promotes a replica that misses an acknowledged commit (grid/DESIGN.md). A COMMIT
decision journals the batch (``Prepared.write``) and its fdatasync runs beside the next batch's
vote (``Database.harden``); its clients are answered after it. The committed frames go to the other
live replicas (asynchronous ones, and synchronous ones still catching up): the primary never waits
for them.

A replica subscribes (``shipping.start_point`` decides how it starts: catch up from the journal
files, cut back, or a checkpoint copy); once it has every committed frame it is live, and a
synchronous one counts as current again at the next batch boundary.

**Replica** (``replica.ReplicaShard``): a replica follows its primary.

Each shard has one worker thread for its engine calls (``Database`` is used from that thread only,
so a prepared batch's lock is taken and released there, and reads wait behind a batch).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ...engine import Database
from ...engine import open as open_db
from ...engine.checkpoint import read_state
from ...errors import MultisiteError, ProtocolError, RemoteProtocolError, StorageFull, StoreLost
from ..shard_wire import (Checkpoint, CheckpointEnd, DataWire, Failed, FailCode, Frames, Outcome, Progress, Resync,
                          Rows, Subscribe, Voted, encode)
from ..shipping import TAIL_FRAMES, StartKind, digest, start_point
from ..voting import Decision, SyncReplicas, Vote
from ..wire import View
from ...journal.reader import iter_runs
from ...journal.segments import list_segments
from ..loader import LoaderError, LoaderRefused
from .loader_runner import ShardLoader, crash_point

RECONNECT_S = 0.3
CATCH_UP_RUN_BYTES = 1 << 20
LIVE_BUFFER_LIMIT = 32 << 20  # a live replica further behind than this in the socket buffer catches up from files
VOTE_TIMEOUT_S = 2.0
CHECKPOINT_ROWS = 5000
MAX_BATCH = 4096
ENGINE_ON_LOOP = os.environ.get("MULTISITE_GRID_ENGINE_ON_LOOP", "1") == "1"

log = logging.getLogger("multisite.container")


async def read_into(reader: asyncio.StreamReader, wire: DataWire):
    """The next message, or None at the end of the connection."""
    while True:
        msg = wire.next_event()
        if msg is not None:
            return msg
        data = await reader.read(1 << 18)
        if not data:
            if wire.pending():
                raise RemoteProtocolError(f"the peer closed in the middle of a frame ({wire.pending()} bytes left)")
            return None
        wire.receive_data(data)


def _joined(frames: list[tuple[int, bytes]]) -> tuple[bytes, list[int]]:
    ends, pos = [], 0
    for _, f in frames:
        pos += len(f)
        ends.append(pos)
    return b"".join(f for _, f in frames), ends


def journal_first(db: Database) -> int:
    segs = list_segments(db.layout.journal)
    return segs[0].first_seqno if segs else db.seqno + 1


def frame_digests(db: Database, lo: int, hi: int) -> dict[int, bytes]:
    """Digests of the journal's frames ``lo..hi`` that the journal files hold."""
    out: dict[int, bytes] = {}
    lo = max(lo, journal_first(db))
    if hi < lo:
        return out
    for run in iter_runs(db.layout.journal, lo, CATCH_UP_RUN_BYTES, to_seqno=hi):
        for seqno, fr in run.frames():
            out[seqno] = digest(fr)
    return out


class Request:
    __slots__ = ("kind", "ops", "region", "key", "future")

    def __init__(self, kind: str, future: asyncio.Future, ops=None, region=None, key=None):
        self.kind, self.future, self.ops, self.region, self.key = kind, future, ops, region, key


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


class PrimaryShard:
    def __init__(self, host, partition: int, db: Database, view: View, executor: ThreadPoolExecutor,
                 loader: ShardLoader | None = None) -> None:
        self.host, self.partition, self.db, self.view, self.ex = host, partition, db, view, executor
        self.loader = loader  # issue 16: the write-through Loader (grid_loader.py), None without one
        self.sync = SyncReplicas(view.min_sync, view.sync, committed_seqno=db.seqno, vote_timeout_s=VOTE_TIMEOUT_S)
        self.links: dict[str, Link] = {}
        self.committed = db.seqno
        self.queue: deque[Request] = deque()
        self.wake = asyncio.Event()
        self.votes: dict[int, asyncio.Future] = {}
        self.reported: frozenset[str] | None = None  # the current set the catalog acknowledged, this epoch
        self.in_flight_reports: dict[int, frozenset[str]] = {}  # heartbeat ack id -> current set sent, unanswered
        self.stopping = False
        self.in_batch = False
        self.stopped = asyncio.Event()  # set by stop(): a batch waiting on the catalog gives up
        self.deposed = False  # the catalog said another shard leads this partition now
        self.hardening: set[asyncio.Task] = set()  # committed batches waiting for their fdatasync
        # (seqno, digest) of the last committed frames, so that a subscription compares tails without a
        # scan of the journal files (which starts at a segment's beginning)
        self.recent: deque[tuple[int, bytes]] = deque(maxlen=2 * TAIL_FRAMES)
        self.ready = True  # False: the loader's database and this shard diverged (issue 16): no commits
        self.task = asyncio.create_task(self.run())

    @property
    def epoch(self) -> int:
        return self.view.epoch

    def update(self, view: View) -> None:
        """New placement for this partition, still primary here."""
        if view.epoch != self.view.epoch:
            self.reported = None
            self.in_flight_reports.clear()
            self.deposed = False
        self.view = view
        self.sync.min_sync = view.min_sync
        self.sync.assign(view.sync)
        wanted = set(view.sync) | set(view.async_)
        for name in [n for n in self.links if n not in wanted]:
            self.drop(name, "no longer a replica of this partition")
        for link in self.links.values():
            link.role = "sync" if link.name in view.sync else "async"
        self._rejoin()  # an asynchronous replica made synchronous may hold everything already

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self.queue.append(req)
        self.wake.set()

    async def stop(self) -> None:
        """Stop taking requests: finish the batch in hand, refuse the queued ones, drop the links."""
        self.stopping = True
        self.stopped.set()
        self.wake.set()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        if self.hardening:
            await asyncio.gather(*self.hardening, return_exceptions=True)
        for r in self.queue:
            _fail(r, FailCode.NOT_PRIMARY, f"partition {self.partition}'s primary moved; ask the catalog",
                  epoch=self.epoch)
        self.queue.clear()
        for name in list(self.links):
            self.drop(name, "the primary stopped here")
        if self.loader is not None:
            self.loader.close()

    async def run(self) -> None:
        if self.loader is not None:  # issue 16: the database catches up with this shard before it serves
            self.ready = await self.loader.replay(self.db, lambda: self.stopping)
            self.committed = self.db.seqno  # a transaction the database refused on replay was rolled back
        while not self.stopping:
            await self.wake.wait()
            self.wake.clear()
            while self.queue and not self.stopping:
                batch = []
                while self.queue and len(batch) < MAX_BATCH:
                    batch.append(self.queue.popleft())
                try:
                    await self.process(batch)
                except Exception as e:  # the batch failed as a whole (the store lost, the instance closed)
                    log.exception("partition %d: batch failed", self.partition)
                    for r in batch:
                        code = FailCode.OUTCOME_UNKNOWN if r.kind == "commit" else FailCode.UNAVAILABLE
                        _fail(r, code, f"partition {self.partition}'s primary failed: {e}")

    async def process(self, batch: list[Request]) -> None:
        self._rejoin()
        commits = [r for r in batch if r.kind == "commit"]
        reads = [r for r in batch if r.kind == "read"]
        if commits:
            self.in_batch = True  # from the vote to the answers: no replica counts current again
            try:
                await self._commit(commits)
            finally:
                self.in_batch = False
        if reads and (self.deposed or not self.host.lease_ok()):  # a cut-off primary serves no stale reads
            why = "was deposed" if self.deposed else "is cut off from the catalog"
            for r in reads:
                _fail(r, FailCode.NOT_PRIMARY if self.deposed else FailCode.UNAVAILABLE,
                      f"partition {self.partition}'s primary here {why}; ask the catalog", epoch=self.epoch)
            reads = []
        if reads:
            values = await self._engine(self._read_all, reads)
            for r, v in zip(reads, values):
                if not r.future.done():
                    r.future.set_result(v)

    async def _engine(self, fn, *args):
        """Run an engine step of a batch: on the event loop (``ENGINE_ON_LOOP``: a batch's SQLite work
        is short, and a hand-off to a thread waits for the GIL behind every busy thread, up to the
        5 ms switch interval each way) or in the shard's thread."""
        if ENGINE_ON_LOOP:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.ex, fn, *args)

    def _read_all(self, reads: list[Request]) -> list[bytes | None]:
        """Each read's encoded value (None: absent), between batches (nothing prepared)."""
        return [self.db.get_encoded(r.region, r.key) for r in reads]

    def _rejoin(self) -> None:
        """At a batch boundary (no vote in flight): live synchronous replicas holding every committed
        transaction count as current again."""
        if self.in_batch or self.sync.in_flight:  # a voter it left behind may hold a batch's frames
            return
        for name in list(self.sync.behind):
            link = self.links.get(name)
            if link is not None and link.live and link.acked >= self.committed:
                if self.sync.caught_up(name, link.acked):
                    log.info("partition %d: synchronous replica %s is current at seqno %d", self.partition, name,
                             link.acked)
        if frozenset(self.sync.current) != self.reported:
            self.host.report_currency_soon()

    def _rejoin_if_ready(self, link: Link) -> None:
        """``link``'s replica may count current again now (no need to wait for a batch boundary)."""
        if link.name in self.sync.behind and link.live and link.acked >= self.committed:
            self._rejoin()

    async def _commit(self, commits: list[Request]) -> None:
        loop = asyncio.get_running_loop()
        p = self.partition
        if not self.host.lease_ok():
            for r in commits:
                _fail(r, FailCode.UNAVAILABLE, f"partition {p}'s primary is cut off from the catalog: it takes no "
                                               f"commits until it hears from it (another may be promoted)")
            return
        if self.deposed:
            for r in commits:
                _fail(r, FailCode.NOT_PRIMARY, f"partition {p}: this primary was deposed; ask the catalog",
                      epoch=self.epoch)
            return
        if not self.ready:
            for r in commits:
                _fail(r, FailCode.UNAVAILABLE, f"partition {p}: the loader's database and this shard diverged: "
                                               f"{self.loader.health.last_error if self.loader else ''}")
            return
        if len(self.sync.current) < self.sync.min_sync:
            cur = len(self.sync.current)
            for r in commits:
                _fail(r, FailCode.VOTED_ROLLBACK,
                      f"partition {p}: {cur} synchronous replica(s) current, min_sync is {self.sync.min_sync}: "
                      f"nothing committed", commit_votes=0, min_sync=self.sync.min_sync, voters=cur,
                      rollback_votes=0, timed_out=0)
            return
        regions = {op[1] for r in commits for op in r.ops} - set(self.db.regions())
        try:
            if regions:  # a map's first write makes its region (not journaled: every shard makes its own)
                await loop.run_in_executor(self.ex, lambda: [self.db.create_region(n) for n in sorted(regions)])
            prep = await self._engine(self.db.prepare, [r.ops for r in commits])
        except MultisiteError as e:  # nothing prepared: the store is lost (a full disk), the instance closed
            for r in commits:
                _fail(r, FailCode.UNAVAILABLE, f"partition {p}: the primary cannot commit now: {e}")
            if isinstance(e, (StoreLost, StorageFull)):
                await self._reopen()
            return
        decision: Decision | None = None
        try:
            if prep.frames:
                vote = self.sync.begin(time.monotonic(), prep.last_seqno)
                if not vote.decided:
                    data, ends = _joined(prep.frames)
                    fut = loop.create_future()
                    self.votes[vote.txn] = fut
                    msg = encode(Frames(prep.first_seqno, data, ends, vote.txn))
                    for name in vote.voters:
                        self.links[name].writer.write(msg)
                    try:
                        decision = await asyncio.wait_for(fut, max(0.0, vote.deadline - time.monotonic()) + 0.05)
                    except TimeoutError:
                        decision = self.sync.tick(time.monotonic() + 1e-3)[0] if vote.txn in self.sync.in_flight \
                            else vote.decision
                    finally:
                        self.votes.pop(vote.txn, None)
                else:
                    decision = vote.decision
                if not decision.commit:
                    for name in decision.commit_votes:  # they hold a transaction that is not: behind until cut back
                        self.sync.fell_behind(name)
            leader = await self._report_if_narrower()
        except BaseException:
            await self._engine(prep.abort)
            raise
        if not leader:
            # Deposed while it voted: a replica holding the batch may be the new primary, so neither
            # "committed" nor "rolled back" is certain here.
            await self._engine(prep.abort)
            for r in commits:
                _fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {p}: this primary was deposed while the commit was "
                                                   f"voted on; a replica that holds it may have been promoted")
            return
        if decision is not None and not decision.commit:
            await self._engine(prep.abort)
            self._send_outcome(decision, False, prep.first_seqno - 1)
            self._drop_holders(decision)
            counts = {"commit_votes": len(decision.commit_votes), "min_sync": decision.min_sync,
                      "voters": len(decision.voters), "rollback_votes": len(decision.rollback_votes),
                      "timed_out": len(decision.timed_out)}
            for r in commits:
                _fail(r, FailCode.VOTED_ROLLBACK, f"partition {p}: {decision.why}; nothing committed", **counts)
            return
        if self.loader is not None and prep.frames and not await self._load(commits, prep, decision):
            return
        try:
            token = await self._engine(lambda: prep.write(flush_store=False))
        except MultisiteError as e:  # the primary's own journal write failed (a full disk): undone here
            if decision is not None:
                for name in decision.commit_votes:
                    self.sync.fell_behind(name)
                self._send_outcome(decision, False, prep.first_seqno - 1)
                self._drop_holders(decision)
            code = FailCode.TRANSACTION if await self._report_if_narrower() else FailCode.OUTCOME_UNKNOWN
            for r in commits:
                _fail(r, code, f"partition {p}: the primary could not journal the commit: {e}")
            if isinstance(e, (StoreLost, StorageFull)):
                await self._reopen()
            return
        if prep.frames:
            self.committed = prep.last_seqno
            self.sync.committed(self.committed)
            self.recent.extend((seqno, digest(f)) for seqno, f in prep.frames)
            if self.loader is not None:
                crash_point("c")
            if decision is not None:
                self._send_outcome(decision, True, self.committed)
            data, ends = _joined(prep.frames)
            msg = None
            for link in self.links.values():
                if link.live and (decision is None or link.name not in decision.voters):
                    if link.writer.transport.get_write_buffer_size() > LIVE_BUFFER_LIMIT:
                        link.live = False
                        asyncio.create_task(self._catch_up(link))
                        continue
                    msg = msg or encode(Frames(prep.first_seqno, data, ends, 0))
                    link.writer.write(msg)
                    link.sent = self.committed
                elif decision is not None and link.name in decision.voters:
                    link.sent = self.committed
        if token is None:  # nothing to harden (durability none, or nothing replicated)
            self._settle(commits, prep.results)
            await self._flush_store()
        else:  # the next batch is prepared and voted on while this one's fdatasync runs
            task = asyncio.create_task(self._harden(token, commits, prep.results))
            self.hardening.add(task)
            task.add_done_callback(self.hardening.discard)

    async def _load(self, commits: list[Request], prep, decision: Decision | None) -> bool:
        """Issue 16: write the voted batch through the Loader and commit the database before the
        grid commits it. True: committed there. False: the database did not commit; the batch is undone
        here, the voters cut back (a rollback outcome, as after a rollback vote) and the clients are
        answered (a refused batch of several transactions is retried one by one, so that one bad
        transaction does not fail the others)."""
        crash_point("a")
        try:
            await self.loader.write(prep.frames)
        except LoaderError as e:
            await self._engine(prep.abort)
            if decision is not None:
                for name in decision.commit_votes:  # they hold a transaction that is not: behind until cut back
                    self.sync.fell_behind(name)
                self._send_outcome(decision, False, prep.first_seqno - 1)
            leader = await self._report_if_narrower()
            if isinstance(e, LoaderRefused) and len(commits) > 1 and leader:
                for r in commits:
                    # The voters count again at once: the rollback outcome is ahead of the next frames on
                    # their links, and should one be promoted still holding the refused batch, the
                    # Loader's replay hands it to the database, which refuses it again, and cuts it back.
                    self.in_batch = False
                    self._rejoin()
                    self.in_batch = True
                    await self._commit([r])
                return False
            code = (FailCode.TRANSACTION if isinstance(e, LoaderRefused) else FailCode.UNAVAILABLE) if leader \
                else FailCode.OUTCOME_UNKNOWN
            for r in commits:
                _fail(r, code, f"partition {self.partition}: the database did not commit; nothing committed: {e}")
            return False
        crash_point("b")
        return True

    async def _harden(self, token: tuple, commits: list[Request], results: list) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.db.harden, token)
        except Exception as e:  # noqa: BLE001 - an fsync that failed: the commit may or may not be on disk
            log.error("partition %d: fdatasync failed after a commit: %s", self.partition, e)
            for r in commits:
                _fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {self.partition}: the primary could not harden "
                                                   f"the commit: {e}")
            return
        self._settle(commits, results)
        await self._flush_store()

    def _settle(self, commits: list[Request], results: list) -> None:
        """Answer a committed batch. With ``min_sync = 0`` nobody else holds it: if the lease ran out
        while it hardened, a promotion may already have left it behind, so it is not acknowledged."""
        if self.sync.min_sync == 0 and not self.host.lease_ok():
            for r in commits:
                _fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {self.partition}: the primary lost its lease while "
                                                   f"the commit hardened (min_sync 0: another may be promoted)")
            return
        self._answer(commits, results)

    async def _flush_store(self) -> None:
        """The store's periodic commit (it fsyncs the journal first), in the shard's thread, not the loop;
        a failure is the store's (logged by the engine), never the answered commits'."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.ex, self.db.flush_if_due)
        except MultisiteError as e:
            log.warning("partition %d: the store could not be flushed: %s", self.partition, e)

    @staticmethod
    def _answer(commits: list[Request], results: list) -> None:
        for r, res in zip(commits, results):
            if isinstance(res, BaseException):
                _fail(r, FailCode.TRANSACTION, str(res))
            elif not r.future.done():
                r.future.set_result(res)

    async def _reopen(self) -> None:
        """After a full disk: close the instance and open it again (recovery rolls a lost store forward
        from the journal), retrying until it opens; the partition takes commits again after."""
        self.db = await reopen(self.db, self.ex, self.partition)
        self.committed = self.db.seqno
        self.host.shard_reopened(self.partition, self.db)

    def _send_outcome(self, decision: Decision, commit: bool, seqno: int) -> None:
        msg = encode(Outcome(decision.txn, commit, seqno))
        for name in decision.voters:
            link = self.links.get(name)
            if link is not None:
                link.writer.write(msg)

    def _drop_holders(self, decision: Decision) -> None:
        """After a rollback outcome: a voter that voted COMMIT or timed out holds (or will journal)
        the rolled-back frames until it reads the Outcome, and ``acked >= committed`` cannot tell:
        it subscribes again (its tail digests get it a Resync) before it can count current."""
        for name in decision.voters:
            if name not in decision.rollback_votes:
                self.drop(name, f"holds vote {decision.txn}, rolled back: subscribe again")

    async def _report_if_narrower(self) -> bool:
        """Before answering: the catalog must not count current a replica this primary does not.
        False if the catalog says this primary was deposed meanwhile."""
        while not self.deposed and not self._catalog_within(frozenset(self.sync.current)):
            if self.stopping:  # handing over or shutting down without the catalog's word: neither "rolled
                return False   # back" nor "committed" is certain; the caller aborts, OUTCOME_UNKNOWN
            report = asyncio.ensure_future(self.host.report_currency())
            stop = asyncio.ensure_future(self.stopped.wait())
            try:
                await asyncio.wait({report, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                report.cancel()
                stop.cancel()
        return not self.deposed

    def _catalog_within(self, current: frozenset[str]) -> bool:
        """Whether whatever the catalog may count current now (the last acknowledged report, or any
        report still on its way) is within ``current``."""
        if self.reported is None:
            return False
        may = self.reported.union(*self.in_flight_reports.values())
        return may <= current

    def on_vote(self, link: Link, msg: Voted) -> None:
        try:
            d = self.sync.vote(msg.vote, link.name, Vote.COMMIT if msg.commit else Vote.ROLLBACK, time.monotonic())
        except RemoteProtocolError as e:
            log.warning("partition %d: vote from %s: %s", self.partition, link.name, e)
            d = None
        if msg.commit:
            link.acked = max(link.acked, msg.seqno)
        else:
            log.warning("partition %d: %s voted to roll back vote %d: %s", self.partition, link.name, msg.vote,
                        msg.why)
        fut = self.votes.get(msg.vote)
        if d is not None and fut is not None and not fut.done():
            fut.set_result(d)
        if not msg.commit:  # it could not hold the prepare: behind until it subscribes again and catches up
            self.drop(link.name, f"voted to roll back: {msg.why}")

    # -- replica links -----------------------------------------------------------------------------
    def drop(self, name: str, why: str) -> None:
        link = self.links.pop(name, None)
        if link is None:
            return
        log.info("partition %d: replica %s dropped: %s", self.partition, name, why)
        # a vote in flight that asked it gets its "no" now, not at the deadline
        for txn, v in list(self.sync.in_flight.items()):
            if name in v.pending():
                d = self.sync.vote(txn, name, Vote.ROLLBACK, time.monotonic())
                fut = self.votes.get(txn)
                if d is not None and fut is not None and not fut.done():
                    fut.set_result(d)
        self.sync.fell_behind(name)
        link.closed.set()
        link.writer.close()

    async def serve(self, sub: Subscribe, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    wire: DataWire) -> None:
        """A replica's subscription, until it ends."""
        role = "sync" if sub.replica in self.view.sync else "async" if sub.replica in self.view.async_ else None
        if role is None:
            writer.write(encode(Failed(0, FailCode.NOT_ASSIGNED, f"{sub.replica} is not a replica of partition "
                                                                 f"{self.partition} at epoch {self.epoch}")))
            return
        if sub.epoch != self.epoch:
            writer.write(encode(Failed(0, FailCode.STALE_EPOCH, f"partition {self.partition} is at epoch "
                                                                f"{self.epoch}, the replica at {sub.epoch}")))
            return
        loop = asyncio.get_running_loop()
        lo = min((s for s, _ in sub.tail), default=sub.seqno + 1)
        hi = min(sub.seqno, self.committed)
        if self.recent and self.recent[0][0] <= lo:  # the usual case: a replica near the end of the journal
            mine = {s: d for s, d in self.recent if lo <= s <= hi}
        else:  # a scan of the journal files (from the start of a segment)
            mine = await loop.run_in_executor(None, frame_digests, self.db, lo, hi)
        start = start_point(primary_seqno=self.committed, journal_first=journal_first(self.db),
                            primary_digests=mine, replica_seqno=sub.seqno, replica_tail=[tuple(t) for t in sub.tail],
                            checkpoint_after=self.host.checkpoint_after)
        log.info("partition %d: %s replica %s subscribes at seqno %d: %s (%s)", self.partition, role, sub.replica,
                 sub.seqno, start.kind.value, start.why)
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

    async def _read_link(self, link: Link, reader: asyncio.StreamReader, wire: DataWire) -> None:
        try:
            while True:
                msg = await read_into(reader, wire)
                if msg is None:
                    return
                if isinstance(msg, Voted):
                    self.on_vote(link, msg)
                elif isinstance(msg, Progress):
                    link.acked = max(link.acked, msg.seqno)
                    self._rejoin_if_ready(link)
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
            if link.sent >= self.committed:
                link.live = True
                self._rejoin_if_ready(link)
                return
            runs = _runs(self.db, link.sent + 1, self.committed)
            while not link.closed.is_set():  # one run in memory at a time, whatever the replica's lag
                run = await loop.run_in_executor(None, next, runs, None)
                if run is None:
                    break
                link.send(Frames(run.first_seqno, bytes(run.data), list(run.ends), 0))
                link.sent = run.last_seqno
                await link.writer.drain()

    async def _checkpoint(self, link: Link) -> int:
        """Send the primary's state at its store's seqno; the seqno."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.db.flush)
        t0 = time.monotonic()
        with read_state(self.db.layout.root) as st:
            d = dict(self.recent).get(st.seqno)  # the store's seqno is recent: it was just flushed
            if d is None:
                d = (await loop.run_in_executor(None, frame_digests, self.db, st.seqno, st.seqno)).get(st.seqno, b"")
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

    def status(self) -> dict:
        return {"committed": self.committed, "epoch": self.epoch, "sync": self.sync.to_dict(),
                **({"loader": self.loader.status()} if self.loader is not None else {}),
                "deposed": self.deposed, "queued": len(self.queue), "hardening": len(self.hardening),
                "links": {n: {"role": lk.role, "live": lk.live, "acked": lk.acked, "sent": lk.sent,
                              "backlog": self.committed - lk.acked} for n, lk in self.links.items()}}


async def reopen(db: Database, ex: ThreadPoolExecutor, partition: int) -> Database:
    """Close ``db`` and open it again in the shard's thread, retrying while it cannot open (the disk
    still full): recovery rolls a store lost to a full disk forward from the journal."""
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(ex, db.close)
    except MultisiteError as e:
        log.info("partition %d: closing the instance after its store was lost: %s", partition, e)
    while True:
        try:
            new = await loop.run_in_executor(ex, open_db, db.layout.root)
        except MultisiteError as e:
            log.warning("partition %d: cannot reopen the instance yet: %s", partition, e)
            await asyncio.sleep(RECONNECT_S * 3)
            continue
        log.info("partition %d: instance reopened at seqno %d", partition, new.seqno)
        return new


def _runs(db: Database, lo: int, hi: int):
    return iter_runs(db.layout.journal, lo, CATCH_UP_RUN_BYTES, to_seqno=hi)


def _fail(r: Request, code: str, message: str, **detail) -> None:
    if not r.future.done():
        r.future.set_exception(ShardRefusal(code, message, detail))


class ShardRefusal(Exception):
    def __init__(self, code: str, message: str, detail: dict):
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail
