"""A simulated grid container: one shard, its journal, and the primary's or replica's part.

The decisions are the real ``SyncReplicas`` (voting.py); what ``grid/server/`` does around them is
mirrored here, each rule with the server function it copies:

- the lease (``Container.lease_ok``): a primary commits only while the catalog answered a heartbeat
  sent less than 3/4 of the heartbeat timeout ago (by its own clock);
- a new epoch's primary starts with no replica current (``SyncReplicas`` with every replica behind);
- before answering a commit, the catalog must count current no replica the primary does not
  (``Lease.report_if_narrower``: a heartbeat with the currency, and its answer awaited; a stale
  answer means deposed: OUTCOME_UNKNOWN);
- after a rollback decision, the outcome goes to the voters and the COMMIT voters' links are dropped
  (``PrimaryShard._drop_holders``): behind until they subscribe again; a replica's rollback outcome
  cuts its journal back (``ReplicaShard``), a subscription cuts it to the common prefix (``Resync``).

Links between a primary and a replica are ordered (TCP): the world delivers each (sender, receiver)
channel in order; a cut loses what was in flight and the replica subscribes again.
"""

from __future__ import annotations

from ...grid.voting import SyncReplicas, Vote
from ...grid.wire import Heartbeat
from .core import Clock

LEASE_FRACTION = 0.75  # of the heartbeat timeout (container.py's lease_ok)


class Primary:
    def __init__(self, epoch: int, min_sync: int, sync: list[str], committed: int):
        self.epoch = epoch
        self.sr = SyncReplicas(min_sync, sync, committed_seqno=committed)
        self.vote: tuple[int, int, int] | None = None  # (txn, tid, seqno) of the vote in flight
        self.reported: frozenset[str] = frozenset()  # what the catalog acknowledged as current
        self.in_flight: dict[int, frozenset[str]] = {}  # heartbeat ack -> current set it reports
        self.waiting: list[tuple[int, int, tuple]] = []  # (ack, tid, (decision, seqno)): answers held

    def catalog_within(self) -> bool:
        may = set(self.reported).union(*self.in_flight.values())
        return may <= self.sr.current


class Container:
    def __init__(self, world, name: str, clock: Clock):
        self.world, self.name, self.clock = world, name, clock
        self.journal: list[int] = []  # transaction numbers, durable
        self.lost: list[int] = []  # what rollbacks took off (the lost-transaction files)
        self.up = True
        self.view = None
        self.role: str | None = None
        self.primary: Primary | None = None
        self.sub = 0  # this replica's subscription number (a new one after every cut)
        self.synced = -1  # the subscription the primary answered (a Resync): until then, retry
        self.full = False  # ENOSPC armed: votes ROLLBACK
        self._ack = 0
        self._sent: dict[int, float] = {}
        self._reports: dict[int, int | None] = {}  # heartbeat ack -> the epoch its currency report was of
        self.last_answer = float("-inf")
        self.view_version = 0  # the placement version last applied (reported in heartbeats)
        self.links: dict[str, int] = {}  # as a primary: each subscribed replica's subscription number
        self.progressed: dict[str, int] = {}  # ... and the subscription whose progress it last read

    def local(self) -> float:
        return self.clock.read(self.world.now)

    def lease_ok(self) -> bool:
        return self.local() - self.last_answer < LEASE_FRACTION * self.world.catalog.heartbeat_timeout_s

    def send(self, dst: str, msg: tuple) -> None:
        self.world.send(self.name, dst, msg)

    # -- life ----------------------------------------------------------------------------------------
    def crash(self) -> None:
        self.up = False
        self.primary, self.view, self.role = None, None, None
        self._sent.clear()
        self.links.clear()
        self.last_answer = float("-inf")

    def restart(self) -> None:
        self.up = True
        self.sub += 1
        self.send("catalog", ("register",))

    def heartbeat(self) -> None:
        """container.py's ``heartbeat``: numbered; its currency counts as what the catalog may hold."""
        self._ack += 1
        self._sent[self._ack] = self.local()
        currency = {}
        self._reports[self._ack] = None
        if self.primary is not None:
            cur = frozenset(self.primary.sr.current)
            currency = {0: (self.primary.epoch, sorted(cur))}
            self.primary.in_flight[self._ack] = cur
            self._reports[self._ack] = self.primary.epoch
        hb = Heartbeat(self.name, self.view_version, {0: len(self.journal)}, currency, self._ack)
        self.send("catalog", ("hb", hb, self._ack))

    def catalog_restarted(self) -> None:
        """The catalog's connection ended: heartbeats in flight get no answer (an unanswered currency
        report still counts as what the catalog may hold); register again."""
        self._sent.clear()
        self._reports.clear()
        if self.up:
            self.send("catalog", ("register",))

    # -- messages ------------------------------------------------------------------------------------
    def receive(self, src: str, msg: tuple) -> None:
        if not self.up:
            return
        getattr(self, f"on_{msg[0]}")(src, *msg[1:])

    def on_refused(self, src: str) -> None:
        self.send("catalog", ("register",))

    def on_assign(self, src: str, a) -> None:
        self.view_version = a.epoch
        v, role = a.views.get(0), a.shards.get(0)
        old_primary = self.view.primary if self.view is not None else None
        self.view, self.role = v, role
        if role == "primary":
            if self.primary is None or self.primary.epoch != v.epoch:
                self.primary = Primary(v.epoch, v.min_sync, v.sync, len(self.journal))
                self.world.stats.note("primaries-taken")
            else:
                self.primary.sr.assign(v.sync)
            return
        self._deposed()
        if v is not None and v.primary and v.primary != self.name and (v.primary != old_primary or self.sub == 0):
            self.subscribe()

    def _deposed(self) -> None:
        p, self.primary = self.primary, None
        if p is not None:
            for _, tid, _ in p.waiting:
                self.world.stats.note("outcome-unknown")
            if p.vote is not None:
                self.world.stats.note("outcome-unknown")

    def subscribe(self) -> None:
        if self.view is not None and self.view.primary and self.view.primary != self.name:
            self.sub += 1
            self.send(self.view.primary, ("subscribe", self.view.epoch, tuple(self.journal), self.sub))

    def on_hback(self, src: str, ack: int, stale: list[int]) -> None:
        sent = self._sent.pop(ack, None)
        if sent is not None:
            self.last_answer = max(self.last_answer, sent)
        for old in [a for a in self._sent if a < ack]:
            del self._sent[old]
        for old in [a for a in self._reports if a < ack]:
            del self._reports[old]
        p = self.primary
        if p is None or self._reports.pop(ack, None) != p.epoch:  # container.py's _answered: its epoch only
            return
        if 0 in stale:
            self._deposed()
            return
        for a in sorted(x for x in p.in_flight if x <= ack):
            if a == ack:
                p.reported = p.in_flight[a]
            del p.in_flight[a]
        self._answer_waiting()

    # -- the replica's part --------------------------------------------------------------------------
    def _from_my_primary(self, src: str, epoch: int) -> bool:
        v = self.view
        return self.primary is None and v is not None and v.epoch == epoch and v.primary == src

    def on_prepare(self, src: str, epoch: int, txn: int, seqno: int, tid: int, sub: int) -> None:
        if not self._from_my_primary(src, epoch) or sub != self.sub:
            return
        j = self.journal
        if self.full or len(j) != seqno - 1:
            ok = len(j) >= seqno and j[seqno - 1] == tid and not self.full  # a repeat: it holds it
        else:
            j.append(tid)  # journaled (and hardened) before the vote
            ok = True
        self.send(src, ("vote", epoch, txn, ok, len(j)))
        if not ok and not self.full:  # replica.py: apply_frames failed (a gap, a seqno it holds): the link ends
            self.subscribe()

    def on_outcome(self, src: str, epoch: int, txn: int, commit: bool, seqno: int, sub: int) -> None:
        if self._from_my_primary(src, epoch) and sub == self.sub and not commit and len(self.journal) > seqno:
            self.lost += self.journal[seqno:]  # the rolled-back frames go to a lost file
            del self.journal[seqno:]
            self.world.stats.note("replica-cut-back")

    def on_frames(self, src: str, epoch: int, seqno: int, tid: int, sub: int) -> None:
        """Committed frames on a live link (a replica that is not a voter: behind, catching up)."""
        if not self._from_my_primary(src, epoch) or sub != self.sub or self.full:
            return
        if len(self.journal) == seqno - 1:
            self.journal.append(tid)
            self.send(src, ("progress", epoch, len(self.journal), tid, sub))
        elif len(self.journal) < seqno or self.journal[seqno - 1] != tid:
            self.subscribe()  # replica.py: apply_frames fails on a gap or a seqno it holds otherwise: subscribe again

    def on_close(self, src: str, sub: int) -> None:
        """The primary dropped the link (``_drop_holders``): subscribe again."""
        if sub == self.sub:
            self.subscribe()

    def on_resync(self, src: str, epoch: int, common: int, tail: tuple, sub: int) -> None:
        if not self._from_my_primary(src, epoch) or sub != self.sub:
            return
        self.lost += self.journal[common:]  # a Resync cuts back into a lost file (Database.rollback)
        del self.journal[common:]
        self.journal.extend(tail)
        self.synced = sub
        self.send(src, ("progress", epoch, len(self.journal), self.journal[-1] if self.journal else 0, sub))

    # -- the primary's part --------------------------------------------------------------------------
    def _mine(self, epoch: int) -> Primary | None:
        p = self.primary
        return p if p is not None and p.epoch == epoch else None

    def on_subscribe(self, src: str, epoch: int, tids: tuple, sub: int) -> None:
        p = self._mine(epoch)
        if p is None:
            return
        self.replica_dropped(p, src)
        j, common = self.journal, 0
        while common < min(len(j), len(tids)) and j[common] == tids[common]:
            common += 1
        self.send(src, ("resync", epoch, common, tuple(j[common:]), sub))  # the journal holds only commits
        self.links[src] = sub

    def on_progress(self, src: str, epoch: int, seqno: int, last: int, sub: int) -> None:
        p = self._mine(epoch)
        if p is None or self.links.get(src) != sub:
            return
        self.progressed[src] = sub
        if seqno == len(self.journal) and (last == (self.journal[-1] if self.journal else 0)) and p.vote is None:
            p.sr.caught_up(src, seqno)

    def replica_dropped(self, p: Primary, name: str) -> None:
        """primary.py's ``replica_dropped``: a vote in flight that asked it gets its "no" now."""
        for txn, v in list(p.sr.in_flight.items()):
            if name in v.pending():
                d = p.sr.vote(txn, name, Vote.ROLLBACK, self.local())
                if d is not None:
                    self.decided(p, d)
        p.sr.fell_behind(name)

    def on_vote(self, src: str, epoch: int, txn: int, commit: bool, seqno: int) -> None:
        p = self._mine(epoch)
        if p is None:
            return
        d = p.sr.vote(txn, src, Vote.COMMIT if commit else Vote.ROLLBACK, self.local())
        if d is not None:
            self.decided(p, d)

    def commit(self) -> None:
        """A client's commit: one vote at a time, only with the lease."""
        p = self.primary
        if not self.up or p is None or p.vote is not None or p.waiting or not self.lease_ok():
            return
        tid = self.world.new_tid()
        self.world.taken(self, p.epoch)
        seqno = len(self.journal) + 1
        v = p.sr.begin(self.local(), seqno)
        p.vote = (v.txn, tid, seqno)
        if v.decided:
            self.decided(p, v.decision)
            return
        links = self.links
        for r in v.voters:
            self.send(r, ("prepare", p.epoch, v.txn, seqno, tid, links.get(r, -1)))

    def decided(self, p: Primary, d) -> None:
        """primary.py's ``_commit`` after the vote: report if narrower, then commit (``_committed``) or
        undo (``_not_committed``: the outcome to the voters, the COMMIT voters dropped, VOTED_ROLLBACK)."""
        if p.vote is None or p.vote[0] != d.txn:
            return
        _, tid, seqno = p.vote
        p.vote = None
        self._answer(p, tid, (d, seqno))

    def _not_committed(self, p: Primary, d, seqno: int) -> None:
        for r in d.voters:
            self.send(r, ("outcome", p.epoch, d.txn, False, seqno - 1, self.links.get(r, -1)))
            if r not in d.rollback_votes:  # _drop_holders
                p.sr.fell_behind(r)
                if r in self.links:
                    self.send(r, ("close", self.links.pop(r)))

    def _answer(self, p: Primary, tid: int, what) -> None:
        """``report_if_narrower``: answer once the catalog counts current no replica this primary does
        not; until then the answer waits for the heartbeat that reports it."""
        if p.catalog_within():
            self._give(p, tid, what)
            return
        self.heartbeat()
        p.waiting.append((self._ack, tid, what))

    def _answer_waiting(self) -> None:
        p = self.primary
        while p is not None and p.waiting and p.catalog_within():
            _, tid, what = p.waiting.pop(0)
            self._give(p, tid, what)

    def _give(self, p: Primary, tid: int, what) -> None:
        d, seqno = what
        if d.commit:  # journaled only now (``prep.write`` after the report), then the outcome, then the answer
            self.journal.append(tid)
            for r in d.voters:
                self.send(r, ("outcome", p.epoch, d.txn, True, seqno, self.links.get(r, -1)))
            for r, sub in self.links.items():  # feeds.ship: the frames go to every live link but the voters'
                if r not in d.voters:
                    self.send(r, ("frames", p.epoch, seqno, tid, sub))
            if p.sr.min_sync == 0 and not self.lease_ok():  # primary.py's _settle: nobody else may hold it
                self.world.stats.note("outcome-unknown")
                return
            self.world.acknowledged(self, tid, p.epoch)
        else:
            self._not_committed(p, d, seqno)
            self.world.voted_rollback(tid)

    def tick(self) -> None:
        if not self.up:
            return
        p = self.primary
        if p is None and self.synced != self.sub:
            self.subscribe()  # replica.py's run loop: connect again (the primary may not have been one yet)
        if p is not None:
            for r in p.sr.behind & set(self.links):  # a behind replica catches up through a new subscription
                if self.progressed.get(r) == self.links[r]:
                    self.send(r, ("close", self.links.pop(r)))
            if not self.lease_ok() and p.waiting:  # cut off: OUTCOME_UNKNOWN within the lease
                for _, _, (d, seqno) in p.waiting:
                    if d.commit and self.world.abort_tells_sync:  # the batch is undone: so is its decision
                        p.sr.aborted(d, seqno - 1)
                p.waiting.clear()
                self.world.stats.note("outcome-unknown")
            for d in p.sr.tick(self.local()):
                self.decided(p, d)
        self.heartbeat()
