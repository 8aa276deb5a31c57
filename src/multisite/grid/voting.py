"""The synchronous replicas' commit vote (the seed's "minimum synchronous replica shards"), sans-IO.

A primary about to commit a transaction sends it to each of its **current** synchronous replicas.
A replica that journals it durably and can apply it votes COMMIT; one that fails (a full disk, a gap)
votes ROLLBACK. ``CommitVote`` collects the votes of one transaction and decides:

- COMMITTED once every voter has answered, or the deadline passed, with at least ``min_sync`` COMMIT
  votes. It waits for every voter, not just ``min_sync`` of them, because a synchronous replica is one
  that holds every committed transaction: one that has not answered cannot be counted as holding it.
- ROLLED_BACK as soon as ``min_sync`` COMMIT votes can no longer be reached (too many ROLLBACK votes
  and time-outs), or at the deadline. The primary then commits nothing and its client gets
  ``ReplicationVotedToRollback`` with the counts (``Decision.check``).

Every voter that voted ROLLBACK or timed out is **behind** (``Decision.behind``), and after a
ROLLBACK decision every voter is (the others hold the refused frames until an Outcome cuts them
back): ``SyncReplicas`` stops counting it, so no later vote waits on it, and counts it again only once
it has caught up (re-registered and received the primary's journal up to the last committed seqno).

The clock is the caller's: ``now`` is seconds of a monotonic clock, passed to every call; the caller
arms a timer for ``deadline`` and calls ``tick``. Legal steps are one table; a vote that breaks the
protocol (from a replica that was not asked, or contradicting its own earlier vote) moves the vote
to ERROR for good, and ERROR means rollback: nothing was committed, nothing will be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from ..errors import ConfigError, LocalProtocolError, RemoteProtocolError, ReplicationVotedToRollback

VOTE_TIMEOUT_S_DEFAULT = 2.0  # a synchronous replica silent this long is behind; the commit goes on without it


class Vote(Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"


class State(Enum):
    COLLECTING = "collecting"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"
    ERROR = "error"  # a protocol violation: rolled back, and every further call raises


class Event(Enum):
    VOTE = "vote"  # a voter's first vote
    REPEAT = "repeat"  # the same vote again from the same voter (a retransmission): no effect
    LATE = "late"  # a vote from a voter that had timed out
    ENOUGH = "enough"  # every voter answered (or the deadline passed) with min_sync COMMIT votes
    TOO_FEW = "too-few"  # min_sync COMMIT votes can no longer be reached
    VIOLATION = "violation"  # a vote from a replica not asked, or one contradicting its own


C, K, R, E = State.COLLECTING, State.COMMITTED, State.ROLLED_BACK, State.ERROR

TRANSITIONS: dict[tuple[State, Event], State] = {
    (C, Event.VOTE): C,
    (C, Event.REPEAT): C,
    (C, Event.ENOUGH): K,
    (C, Event.TOO_FEW): R,
    (C, Event.VIOLATION): E,
    (K, Event.REPEAT): K,
    (K, Event.LATE): K,
    (R, Event.REPEAT): R,
    (R, Event.LATE): R,
    # A decided vote is final: a violation after it raises but cannot undo what the primary did.
    (K, Event.VIOLATION): K,
    (R, Event.VIOLATION): R,
}


@dataclass(frozen=True)
class Decision:
    txn: int
    commit: bool
    min_sync: int
    voters: tuple[str, ...]
    commit_votes: tuple[str, ...]
    rollback_votes: tuple[str, ...]
    timed_out: tuple[str, ...]
    why: str = ""  # for a rollback: the reason in words

    @property
    def behind(self) -> tuple[str, ...]:
        """Voters that do not hold this transaction as the others do: not synchronous until caught up."""
        return tuple(sorted(self.rollback_votes + self.timed_out))

    def check(self) -> None:
        """Raise ReplicationVotedToRollback for a rollback; nothing for a commit."""
        if self.commit:
            return
        raise ReplicationVotedToRollback(
            f"transaction {self.txn} was committed nowhere: {self.why}", commit_votes=len(self.commit_votes),
            min_sync=self.min_sync, voters=len(self.voters), rollback_votes=len(self.rollback_votes),
            timed_out=len(self.timed_out))

    def to_dict(self) -> dict:
        return {"txn": self.txn, "commit": self.commit, "min_sync": self.min_sync, "voters": list(self.voters),
                "commit_votes": list(self.commit_votes), "rollback_votes": list(self.rollback_votes),
                "timed_out": list(self.timed_out), "why": self.why}


class CommitVote:
    """The vote on one transaction ``txn`` among ``voters`` (the primary's current synchronous
    replicas), started at ``now``, timing out at ``now + timeout_s``."""

    def __init__(self, txn: int, voters: Iterable[str], min_sync: int, now: float,
                 timeout_s: float = VOTE_TIMEOUT_S_DEFAULT):
        # inf: a silent voter would never time out and the commit would hang; nan: it times out at once
        if min_sync < 0 or not 0 < timeout_s < math.inf:
            raise ConfigError(f"min_sync must be >= 0 and timeout_s finite and > 0, got {min_sync} and {timeout_s}")
        self.txn = txn
        self.voters = tuple(sorted(set(voters)))
        self.min_sync = min_sync
        self.deadline = now + timeout_s
        self.state = State.COLLECTING
        self.votes: dict[str, Vote] = {}
        self.timed_out: tuple[str, ...] = ()
        self.late: dict[str, Vote] = {}  # votes that came after their voter timed out
        self.decision: Decision | None = None
        self._decide()  # min_sync = 0 with no voters, or too few voters to ever reach min_sync

    @property
    def decided(self) -> bool:
        return self.decision is not None

    def pending(self) -> tuple[str, ...]:
        """Voters still to answer (none once decided)."""
        if self.state is not State.COLLECTING:
            return ()
        return tuple(v for v in self.voters if v not in self.votes)

    # -- steps ---------------------------------------------------------------------------------------
    def _step(self, event: Event) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:  # not reachable from the public calls; a guard for the table itself
            was, self.state = self.state, State.ERROR
            raise LocalProtocolError(f"vote on transaction {self.txn}: {event.value} in state {was.value}")
        self.state = nxt

    def vote(self, replica: str, vote: Vote, now: float) -> Decision | None:
        """``replica`` voted ``vote``. Returns the decision if this vote made it."""
        if self.state is State.ERROR:
            raise LocalProtocolError(f"vote on transaction {self.txn} already failed; it was rolled back")
        # A vote that arrives after the deadline is late, whatever order the caller saw; if the deadline
        # decides the vote on this call, that decision is returned (as from ``tick``), or the caller would
        # never learn it: a primary whose timer had not fired yet kept the decided vote in flight for good,
        # and no replica could count current again (every later commit VOTED_ROLLBACK).
        by_deadline = self.tick(now)
        if replica not in self.voters:
            self._violate(f"replica {replica!r} voted on transaction {self.txn} but was not asked "
                          f"(voters: {', '.join(self.voters) or 'none'})")
        earlier = self.votes.get(replica) or self.late.get(replica)
        if earlier is not None:
            if earlier is not vote:
                self._violate(f"replica {replica!r} voted {vote.value} on transaction {self.txn} after voting "
                              f"{earlier.value}")
            self._step(Event.REPEAT)
            return by_deadline
        if replica in self.timed_out or self.state is not State.COLLECTING:
            # timed out, or the vote was decided without it (early rollback): late, the decision stands
            self.late[replica] = vote
            self._step(Event.LATE)
            return by_deadline
        self.votes[replica] = vote
        self._step(Event.VOTE)
        return self._decide()

    def tick(self, now: float) -> Decision | None:
        """The caller's timer: at or after the deadline, every voter yet to answer has timed out."""
        if self.state is State.ERROR:
            raise LocalProtocolError(f"vote on transaction {self.txn} already failed; it was rolled back")
        if self.state is not State.COLLECTING or now < self.deadline:
            return None
        self.timed_out = self.pending()
        return self._decide(deadline=True)

    # -- deciding ------------------------------------------------------------------------------------
    def _decide(self, deadline: bool = False) -> Decision | None:
        yes = tuple(v for v in self.voters if self.votes.get(v) is Vote.COMMIT)
        no = tuple(v for v in self.voters if self.votes.get(v) is Vote.ROLLBACK)
        waiting = () if deadline else tuple(v for v in self.voters if v not in self.votes)
        if len(yes) + len(waiting) < self.min_sync:
            why = (f"{len(yes)} of {len(self.voters)} synchronous replicas voted to commit, min_sync is "
                   f"{self.min_sync}" + (f"; voted not to: {', '.join(no)}" if no else "")
                   + (f"; timed out: {', '.join(self.timed_out)}" if self.timed_out else ""))
            if not self.voters:
                why = f"no synchronous replica is current, min_sync is {self.min_sync}"
            return self._final(Event.TOO_FEW, False, yes, no, why)
        if not waiting:
            return self._final(Event.ENOUGH, True, yes, no, "")
        return None

    def _final(self, event: Event, commit: bool, yes, no, why: str) -> Decision:
        self._step(event)
        self.decision = Decision(self.txn, commit, self.min_sync, self.voters, yes, no, self.timed_out, why)
        return self.decision

    def _violate(self, why: str) -> None:
        if self.state is State.COLLECTING:
            self.decision = Decision(self.txn, False, self.min_sync, self.voters,
                                     tuple(v for v in self.voters if self.votes.get(v) is Vote.COMMIT),
                                     tuple(v for v in self.voters if self.votes.get(v) is Vote.ROLLBACK),
                                     self.timed_out, f"protocol error: {why}")
        self._step(Event.VIOLATION)
        raise RemoteProtocolError(why)


class SyncReplicas:
    """A primary's synchronous replicas across transactions: which are current (voters), which are
    behind, and when a behind one counts again.

    ``committed_seqno`` is the primary's last committed seqno (the caller reports it with
    ``committed``). A replica is current again once it has every committed transaction
    (``caught_up`` with a seqno at least ``committed_seqno``) while no vote is in flight: a vote begun
    before it rejoined did not ask it, so if that vote commits, the replica would miss its transaction."""

    def __init__(self, min_sync: int, replicas: Iterable[str] = (), *, committed_seqno: int = 0,
                 vote_timeout_s: float = VOTE_TIMEOUT_S_DEFAULT):
        self.min_sync = min_sync
        self.vote_timeout_s = vote_timeout_s
        self.committed_seqno = committed_seqno
        self.current: set[str] = set()
        self.behind: set[str] = set(replicas)  # a new replica has copied nothing yet
        self.in_flight: dict[int, CommitVote] = {}
        self._seqno: dict[int, int] = {}  # txn -> the primary's seqno of the transaction voted on
        self._next_txn = 1

    @property
    def replicas(self) -> set[str]:
        return self.current | self.behind

    def assign(self, replicas: Iterable[str]) -> None:
        """The catalog's placement says these are the synchronous replicas now: keep the state of those
        that stay, new ones start behind, dropped ones are forgotten."""
        want = set(replicas)
        self.current &= want
        self.behind = (self.behind & want) | (want - self.current)

    def begin(self, now: float, seqno: int | None = None) -> CommitVote:
        """A vote on a new transaction among the current replicas. ``seqno``: the transaction's seqno on
        the primary; with it, a COMMIT decision raises ``committed_seqno`` at once, so that no replica
        can be counted current between the decision and the caller's ``committed`` without holding it."""
        txn = self._next_txn
        self._next_txn += 1
        if seqno is not None:
            self._seqno[txn] = seqno
        v = CommitVote(txn, self.current, self.min_sync, now, self.vote_timeout_s)
        if v.decided:
            self._settle(v)
        else:
            self.in_flight[txn] = v
        return v

    def vote(self, txn: int, replica: str, vote: Vote, now: float) -> Decision | None:
        v = self.in_flight.get(txn)
        if v is None:
            return None  # a vote on a transaction already decided (a late one): the decision stands
        try:
            d = v.vote(replica, vote, now)
        except RemoteProtocolError:
            self._settle(v)
            raise
        if d is not None or v.decided:  # a decided vote never stays in flight
            self._settle(v)
        return d

    def tick(self, now: float) -> list[Decision]:
        """Time out every vote past its deadline; the decisions made."""
        out = []
        for v in list(self.in_flight.values()):
            d = v.tick(now)
            if d is not None:
                self._settle(v)
                out.append(d)
        return out

    def next_deadline(self) -> float | None:
        return min((v.deadline for v in self.in_flight.values()), default=None)

    def _settle(self, v: CommitVote) -> None:
        self.in_flight.pop(v.txn, None)
        seqno = self._seqno.pop(v.txn, None)
        if seqno is not None and v.decision.commit:
            self.committed(seqno)
        # After a rollback, the voters that did not vote ROLLBACK hold the refused frames (or will journal
        # them: an early rollback leaves prepares in flight) until an Outcome cuts them back: behind at
        # once, so that the primary's currency report, made before the client hears VOTED_ROLLBACK, tells
        # the catalog. Left current until the primary dropped their links afterwards, one could be promoted
        # holding the refused transaction (found by testing.sim, grid_vote seed 290).
        for r in (v.decision.behind if v.decision.commit else v.decision.voters):
            self.fell_behind(r)

    def committed(self, seqno: int) -> None:
        """The primary committed up to ``seqno`` (after a COMMIT decision)."""
        self.committed_seqno = max(self.committed_seqno, seqno)

    def aborted(self, decision: Decision, seqno: int) -> None:
        """The primary did not commit a transaction the vote ``decision`` decided to COMMIT (it was
        deposed, or its lease ran out while it reported to the catalog: OUTCOME_UNKNOWN) and its journal
        still ends at ``seqno``. ``committed_seqno`` goes back to ``seqno``: raised at the decision, it
        would stay past the primary's journal, and no replica could count current again (each would
        need a seqno the primary never reaches until a commit, and none is taken without them). The
        COMMIT voters hold frames the primary does not: behind until they are cut back and catch up."""
        self.committed_seqno = min(self.committed_seqno, seqno)
        for r in decision.commit_votes:
            self.fell_behind(r)

    def fell_behind(self, replica: str) -> None:
        """``replica`` voted no, timed out, crashed or was cut off: not a voter until it catches up."""
        if replica in self.replicas:
            self.current.discard(replica)
            self.behind.add(replica)

    def caught_up(self, replica: str, seqno: int) -> bool:
        """``replica`` holds every transaction up to ``seqno``; True if it counts as synchronous now."""
        if replica in self.current:
            return True
        if replica not in self.behind or seqno < self.committed_seqno or self.in_flight:
            return False
        self.behind.discard(replica)
        self.current.add(replica)
        return True

    def can_commit(self) -> bool:
        """Whether a vote begun now could commit (enough current replicas); for status, not a decision."""
        return len(self.current) >= self.min_sync

    def to_dict(self) -> dict:
        return {"min_sync": self.min_sync, "current": sorted(self.current), "behind": sorted(self.behind),
                "committed_seqno": self.committed_seqno, "in_flight": sorted(self.in_flight)}
