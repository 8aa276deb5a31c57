"""A primary shard: the batch and vote pipeline (``PrimaryShard``).

**How the pipeline works.** One task per partition takes the requests queued by client connections
in batches. A batch of commits is prepared by the engine (``Database.prepare``: applied and framed,
not journaled, the commit lock held), its frames go to every *current* synchronous replica as one
``Frames`` with a vote id, and the votes decide (``voting.SyncReplicas``): the primary journals and
hardens the batch only when at least ``min_sync`` replicas journaled it durably and voted to commit;
otherwise it undoes it (no trace) and each client gets ``VOTED_ROLLBACK`` with the counts. Before it
answers a batch that left a replica out (it voted no, timed out, or its link broke) the primary
reports its current set to the catalog and waits for the catalog's answer, so that the catalog never
promotes a replica that misses an acknowledged commit (grid/DESIGN.md). A COMMIT decision journals
the batch (``Prepared.write``) and its fdatasync runs beside the next batch's vote
(``Database.harden``); its clients are answered after it. The committed frames go to the other live
replicas (asynchronous ones, and synchronous ones still catching up): the primary never waits for
them.

A replica subscribes (``shipping.start_point`` decides how it starts: catch up from the journal
files, cut back, or a checkpoint copy); once it has every committed frame it is live, and a
synchronous one counts as current again at the next batch boundary.

**Its parts.** This module is the pipeline: taking queued commits, preparing, sending the prepare
to the voters and collecting their votes, deciding, journaling, answering, and which synchronous
replicas count current (``_rejoin``). The links to the replicas (catch-up from the files, live
streaming, checkpoint copy) are ``feeds.Feeds``; the catalog's lease and its word on currency
(what lets the primary take commits and answer them) are ``lease.Lease``. The batch loop binds what
it reaches per batch once (``links``, ``_lease_ok``, ``_report_if_narrower``): the split costs it
no lookups and no awaits.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ...engine import Database
from ...errors import MultisiteError, RemoteProtocolError, StorageFull, StoreLost
from ..loader import LoaderError, LoaderRefused
from ..shard_wire import FailCode, Frames, Outcome, Voted, encode
from ..voting import Decision, SyncReplicas, Vote
from ..wire import View
from .feeds import Feeds, Link
from .lease import Lease
from .loader_runner import ShardLoader, crash_point
from .shard import Request, fail, joined, log, reopen

VOTE_TIMEOUT_S = 2.0
MAX_BATCH = 4096
ENGINE_ON_LOOP = os.environ.get("MULTISITE_GRID_ENGINE_ON_LOOP", "1") == "1"


class PrimaryShard:
    """A partition's primary on this container (see the module docstring)."""

    def __init__(self, host, partition: int, db: Database, view: View, executor: ThreadPoolExecutor,
                 loader: ShardLoader | None = None) -> None:
        self.host, self.partition, self.db, self.view, self.ex = host, partition, db, view, executor
        self.loader = loader  # issue 16: the write-through Loader (loader_runner.py), None without one
        self.sync = SyncReplicas(view.min_sync, view.sync, committed_seqno=db.seqno, vote_timeout_s=VOTE_TIMEOUT_S)
        self.committed = db.seqno
        self.queue: deque[Request] = deque()
        self.wake = asyncio.Event()
        self.votes: dict[int, asyncio.Future] = {}
        self.stopping = False
        self.in_batch = False
        self.hardening: set[asyncio.Task] = set()  # committed batches waiting for their fdatasync
        self.ready = True  # False: the loader's database and this shard diverged (issue 16): no commits
        self.lease = Lease(host, self.sync, view.epoch)
        self._lease_ok = self.lease.ok
        self._report_if_narrower = self.lease.report_if_narrower
        self.feeds = Feeds(self)
        self.links = self.feeds.links  # the same dict, mutated in place: the voters' links
        self.task = asyncio.create_task(self.run())

    @property
    def epoch(self) -> int:
        return self.view.epoch

    def update(self, view: View) -> None:
        """New placement for this partition, still primary here."""
        self.lease.update(view.epoch)
        self.view = view
        self.sync.min_sync = view.min_sync
        self.sync.assign(view.sync)
        self.feeds.update(view)
        self._rejoin()  # an asynchronous replica made synchronous may hold everything already

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self.queue.append(req)
        self.wake.set()

    async def stop(self) -> None:
        """Stop taking requests: finish the batch in hand, refuse the queued ones, drop the links."""
        self.stopping = True
        self.lease.stop()
        self.wake.set()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        if self.hardening:
            await asyncio.gather(*self.hardening, return_exceptions=True)
        for r in self.queue:
            fail(r, FailCode.NOT_PRIMARY, f"partition {self.partition}'s primary moved; ask the catalog",
                 epoch=self.epoch)
        self.queue.clear()
        self.feeds.close("the primary stopped here")
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
                        fail(r, code, f"partition {self.partition}'s primary failed: {e}")

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
        if reads and (self.lease.deposed or not self._lease_ok()):  # a cut-off primary serves no stale reads
            deposed = self.lease.deposed
            why = "was deposed" if deposed else "is cut off from the catalog"
            for r in reads:
                fail(r, FailCode.NOT_PRIMARY if deposed else FailCode.UNAVAILABLE,
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

    # -- currency ----------------------------------------------------------------------------------
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
        if frozenset(self.sync.current) != self.lease.reported:
            self.host.report_currency_soon()

    def replica_ready(self, link: Link) -> None:
        """``link``'s replica may count current again now (no need to wait for a batch boundary)."""
        if link.name in self.sync.behind and link.live and link.acked >= self.committed:
            self._rejoin()

    # -- a batch of commits ------------------------------------------------------------------------
    async def _commit(self, commits: list[Request]) -> None:
        sync, lease_ok = self.sync, self._lease_ok()
        if not lease_ok or self.lease.deposed or not self.ready or len(sync.current) < sync.min_sync:
            self._refuse(commits, lease_ok)
            return
        loop = asyncio.get_running_loop()
        regions = {op[1] for r in commits for op in r.ops} - set(self.db.regions())
        try:
            if regions:  # a map's first write makes its region (not journaled: every shard makes its own)
                await loop.run_in_executor(self.ex, lambda: [self.db.create_region(n) for n in sorted(regions)])
            prep = await self._engine(self.db.prepare, [r.ops for r in commits])
        except MultisiteError as e:  # nothing prepared: the store is lost (a full disk), the instance closed
            await self._not_prepared(commits, e)
            return
        decision: Decision | None = None
        try:
            if prep.frames:
                decision = await self._vote(prep)
            leader = await self._report_if_narrower()
        except BaseException:
            await self._engine(prep.abort)
            raise
        if not leader or (decision is not None and not decision.commit):
            await self._not_committed(commits, prep, decision, leader)
            return
        if self.loader is not None and prep.frames and not await self._load(commits, prep, decision):
            return
        try:
            token = await self._engine(lambda: prep.write(flush_store=False))
        except MultisiteError as e:  # the primary's own journal write failed (a full disk): undone here
            await self._not_written(commits, prep, decision, e)
            return
        if prep.frames:
            self._committed(prep, decision)
        if token is None:  # nothing to harden (durability none, or nothing replicated)
            self._settle(commits, prep.results)
            await self._flush_store()
        else:  # the next batch is prepared and voted on while this one's fdatasync runs
            task = asyncio.create_task(self._harden(token, commits, prep.results))
            self.hardening.add(task)
            task.add_done_callback(self.hardening.discard)

    async def _vote(self, prep) -> Decision:
        """Ship a prepared batch to its synchronous replicas and wait for the vote's decision (or its
        deadline); replicas that voted for a batch that is not committed are behind until cut back."""
        sync, loop = self.sync, asyncio.get_running_loop()
        vote = sync.begin(time.monotonic(), prep.last_seqno)
        if not vote.decided:
            data, ends = joined(prep.frames)
            fut = loop.create_future()
            self.votes[vote.txn] = fut
            msg = encode(Frames(prep.first_seqno, data, ends, vote.txn))
            for name in vote.voters:
                self.links[name].writer.write(msg)
            try:
                decision = await asyncio.wait_for(fut, max(0.0, vote.deadline - time.monotonic()) + 0.05)
            except TimeoutError:
                if vote.txn in sync.in_flight:
                    sync.tick(time.monotonic() + 1e-3)
                decision = vote.decision
            finally:
                self.votes.pop(vote.txn, None)
        else:
            decision = vote.decision
        if not decision.commit:
            for name in decision.commit_votes:  # they hold a transaction that is not: behind until cut back
                sync.fell_behind(name)
        return decision

    def _refuse(self, commits: list[Request], lease_ok: bool) -> None:
        """Refuse a batch before anything is prepared, for the first reason that holds."""
        p, detail = self.partition, {}
        if not lease_ok:
            code, why = FailCode.UNAVAILABLE, (f"partition {p}'s primary is cut off from the catalog: it takes no "
                                               f"commits until it hears from it (another may be promoted)")
        elif self.lease.deposed:
            code, why = FailCode.NOT_PRIMARY, f"partition {p}: this primary was deposed; ask the catalog"
            detail = {"epoch": self.epoch}
        elif not self.ready:
            code, why = FailCode.UNAVAILABLE, (f"partition {p}: the loader's database and this shard diverged: "
                                               f"{self.loader.health.last_error if self.loader else ''}")
        else:
            cur = len(self.sync.current)
            code, why = FailCode.VOTED_ROLLBACK, (f"partition {p}: {cur} synchronous replica(s) current, min_sync "
                                                  f"is {self.sync.min_sync}: nothing committed")
            detail = {"commit_votes": 0, "min_sync": self.sync.min_sync, "voters": cur, "rollback_votes": 0,
                      "timed_out": 0}
        for r in commits:
            fail(r, code, why, **detail)

    async def _not_prepared(self, commits: list[Request], e: MultisiteError) -> None:
        for r in commits:
            fail(r, FailCode.UNAVAILABLE, f"partition {self.partition}: the primary cannot commit now: {e}")
        if isinstance(e, (StoreLost, StorageFull)):
            await self._reopen()

    async def _not_committed(self, commits: list[Request], prep, decision: Decision | None, leader: bool) -> None:
        """The vote is over and the batch is undone: the catalog deposed this primary meanwhile (not
        ``leader``), or the voters decided to roll back."""
        await self._engine(prep.abort)
        if not leader:
            # Deposed while it voted: a replica holding the batch may be the new primary, so neither
            # "committed" nor "rolled back" is certain here.
            if decision is not None and decision.commit:
                # Its lease may have run out without a deposition: the primary goes on, so the vote's
                # COMMIT must not stay counted (a replica could never count current again).
                self.sync.aborted(decision, prep.first_seqno - 1)
            for r in commits:
                fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {self.partition}: this primary was deposed while "
                                                  f"the commit was voted on; a replica that holds it may have been "
                                                  f"promoted")
            return
        self._send_outcome(decision, False, prep.first_seqno - 1)
        self._drop_holders(decision)
        counts = {"commit_votes": len(decision.commit_votes), "min_sync": decision.min_sync,
                  "voters": len(decision.voters), "rollback_votes": len(decision.rollback_votes),
                  "timed_out": len(decision.timed_out)}
        for r in commits:
            fail(r, FailCode.VOTED_ROLLBACK, f"partition {self.partition}: {decision.why}; nothing committed",
                 **counts)

    async def _not_written(self, commits: list[Request], prep, decision: Decision | None,
                           e: MultisiteError) -> None:
        """The primary's own journal write failed (a full disk): the batch is undone here, and the voters
        that hold it cut back."""
        if decision is not None:
            for name in decision.commit_votes:
                self.sync.fell_behind(name)
            self._send_outcome(decision, False, prep.first_seqno - 1)
            self._drop_holders(decision)
        code = FailCode.TRANSACTION if await self._report_if_narrower() else FailCode.OUTCOME_UNKNOWN
        for r in commits:
            fail(r, code, f"partition {self.partition}: the primary could not journal the commit: {e}")
        if isinstance(e, (StoreLost, StorageFull)):
            await self._reopen()

    def _committed(self, prep, decision: Decision | None) -> None:
        """The batch is journaled: it counts committed, the voters learn the outcome, the live replicas
        get its frames."""
        self.committed = prep.last_seqno
        self.sync.committed(self.committed)
        if self.loader is not None:
            crash_point("c")
        if decision is not None:
            self._send_outcome(decision, True, self.committed)
        self.feeds.ship(prep.first_seqno, prep.frames, self.committed, decision)

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
                fail(r, code, f"partition {self.partition}: the database did not commit; nothing committed: {e}")
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
                fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {self.partition}: the primary could not harden "
                                                  f"the commit: {e}")
            return
        self._settle(commits, results)
        await self._flush_store()

    def _settle(self, commits: list[Request], results: list) -> None:
        """Answer a committed batch. With ``min_sync = 0`` nobody else holds it: if the lease ran out
        while it hardened, a promotion may already have left it behind, so it is not acknowledged."""
        if self.sync.min_sync == 0 and not self._lease_ok():
            for r in commits:
                fail(r, FailCode.OUTCOME_UNKNOWN, f"partition {self.partition}: the primary lost its lease while "
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
                fail(r, FailCode.TRANSACTION, str(res))
            elif not r.future.done():
                r.future.set_result(res)

    async def _reopen(self) -> None:
        """After a full disk: close the instance and open it again (recovery rolls a lost store forward
        from the journal), retrying until it opens; the partition takes commits again after."""
        self.db = await reopen(self.db, self.ex, self.partition)
        self.committed = self.db.seqno
        self.host.shard_reopened(self.partition, self.db)

    # -- the voters --------------------------------------------------------------------------------
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
                self.feeds.drop(name, f"holds vote {decision.txn}, rolled back: subscribe again")

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
            self.feeds.drop(link.name, f"voted to roll back: {msg.why}")

    def replica_dropped(self, name: str) -> None:
        """``name``'s link was dropped: a vote in flight that asked it gets its "no" now, not at the
        deadline, and it is behind until it subscribes again and catches up."""
        for txn, v in list(self.sync.in_flight.items()):
            if name in v.pending():
                d = self.sync.vote(txn, name, Vote.ROLLBACK, time.monotonic())
                fut = self.votes.get(txn)
                if d is not None and fut is not None and not fut.done():
                    fut.set_result(d)
        self.sync.fell_behind(name)

    def status(self) -> dict:
        return {"committed": self.committed, "epoch": self.epoch, "sync": self.sync.to_dict(),
                **({"loader": self.loader.status()} if self.loader is not None else {}),
                "deposed": self.lease.deposed, "queued": len(self.queue), "hardening": len(self.hardening),
                "links": self.feeds.status(self.committed)}
