"""The seed's Loader protocol (002, "Replication and Loaders") as decisions without I/O.

A **transaction id** is ``TxnId(partition, seqno, digest)``: a rolled-back seqno is reused by the
next commit, but every shard holds the primary's frames byte for byte, so the frame's digest
(``shipping.digest``) tells two transactions at one seqno apart.

- ``ReplicaBuffer``: the replica side. ``receive`` buffers a prepared transaction (on a grid shard
  that is a frame journaled before its vote), ``outcome`` commits the buffered ones up to a seqno or
  discards those after it (outcomes may come late, twice, or for a transaction never received: all
  are harmless), ``to_replay`` is what a new primary hands its Loader on failover.
- ``replay_plan``: from the database's last applied id for the partition and the new primary's
  journal (seqno → digest), which transactions to hand the Loader, or why the two diverged.
- ``LoaderHealth``: up / down with a reconnect backoff, by the caller's clock.

- ``Loader``: the contract a user's database implements (``multisite.grid.Loader``), with its errors.

The I/O (the databases, the shards) is in ``server/loader_runner.py`` and ``server/primary.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from ..errors import MultisiteError


class TxnId(NamedTuple):
    partition: int
    seqno: int
    digest: str  # hex of shipping.digest(frame)

    def __str__(self) -> str:
        return f"p{self.partition}/{self.seqno}/{self.digest[:12]}"


class TxnState(StrEnum):
    BUFFERED = "buffered"
    COMMITTED = "committed"
    DISCARDED = "discarded"


@dataclass
class ReplicaBuffer:
    """The replica side of the protocol for one partition.

    ``receive(txn)`` buffers a transaction; ``outcome(commit, seqno)`` says that the primary committed
    every transaction up to ``seqno`` (commit) or rolled back every one after ``seqno`` (rollback):
    the grid's ``Outcome`` carries the last committed seqno either way. A transaction's id includes
    its digest, so a rolled-back one and the next at its seqno are two transactions.
    """

    partition: int
    buffered: dict[int, TxnId] = field(default_factory=dict)  # seqno -> the transaction held there
    committed_seqno: int = 0
    discarded: int = 0
    committed: int = 0

    def receive(self, txn: TxnId) -> None:
        if txn.partition != self.partition:
            raise ValueError(f"transaction {txn} is not of partition {self.partition}")
        if txn.seqno <= self.committed_seqno:
            return  # already committed here (a repeat after a reconnect): nothing to buffer
        old = self.buffered.get(txn.seqno)
        if old is not None and old != txn:
            # the same seqno with other bytes: the one held was rolled back without our hearing it
            self._discard_after(txn.seqno - 1)
        self.buffered[txn.seqno] = txn

    def outcome(self, commit: bool, seqno: int) -> tuple[list[TxnId], list[TxnId]]:
        """Apply an outcome; (committed now, discarded now). Late, repeated and unknown outcomes
        change nothing they should not: a commit never un-commits, a rollback never discards a
        transaction at or below a committed seqno."""
        if commit:
            done = sorted(s for s in self.buffered if s <= seqno)
            out = [self.buffered.pop(s) for s in done]
            self.committed_seqno = max(self.committed_seqno, seqno)
            self.committed += len(out)
            return out, []
        return [], self._discard_after(max(seqno, self.committed_seqno))

    def _discard_after(self, seqno: int) -> list[TxnId]:
        gone = sorted(s for s in self.buffered if s > seqno)
        out = [self.buffered.pop(s) for s in gone]
        self.discarded += len(out)
        return out

    def to_replay(self) -> list[TxnId]:
        """On failover: every transaction still buffered (no outcome heard), in seqno order."""
        return [self.buffered[s] for s in sorted(self.buffered)]

    def status(self) -> dict:
        return {"buffered": len(self.buffered), "committed_seqno": self.committed_seqno,
                "committed": self.committed, "discarded": self.discarded}


class ReplayKind(StrEnum):
    IN_STEP = "in-step"  # the database has everything the journal has
    REPLAY = "replay"  # hand the listed transactions to the loader
    DIVERGED = "diverged"  # the database holds a transaction the journal does not: refuse to serve


@dataclass(frozen=True)
class ReplayPlan:
    kind: ReplayKind
    txns: tuple[TxnId, ...]
    why: str


def replay_plan(partition: int, db_last: TxnId | None, journal: dict[int, str], journal_seqno: int,
                journal_first: int) -> ReplayPlan:
    """What a new primary hands its Loader before it serves.

    ``db_last``: the database's last applied id for the partition (None: none). ``journal``: seqno →
    digest of the journal's frames from (at most) ``db_last.seqno`` on; ``journal_seqno``: the shard's
    seqno; ``journal_first``: its journal's first seqno. Every transaction from ``db_last.seqno`` on is
    handed over (the one at ``db_last`` is skipped by the Loader by id, the rest applied)."""
    if db_last is None:
        lo = journal_first
    else:
        if db_last.seqno > journal_seqno:
            return ReplayPlan(ReplayKind.DIVERGED, (), f"the database has seqno {db_last.seqno} of partition "
                                                       f"{partition}, the shard only {journal_seqno}")
        have = journal.get(db_last.seqno)
        if have is not None and have != db_last.digest:
            return ReplayPlan(ReplayKind.DIVERGED, (), f"the database's transaction {db_last} is not the "
                                                       f"shard's at that seqno ({have[:12]})")
        if have is None and db_last.seqno >= journal_first:
            return ReplayPlan(ReplayKind.DIVERGED, (), f"the shard's journal lacks seqno {db_last.seqno}")
        lo = max(db_last.seqno, journal_first)  # the database's last one too: the Loader skips it by id
    txns = tuple(TxnId(partition, s, journal[s]) for s in range(lo, journal_seqno + 1) if s in journal)
    if len(txns) != max(0, journal_seqno - lo + 1):
        missing = [s for s in range(lo, journal_seqno + 1) if s not in journal][:5]
        return ReplayPlan(ReplayKind.DIVERGED, (), f"the shard's journal lacks seqnos {missing} to replay")
    if not txns or (len(txns) == 1 and txns[0] == db_last):
        return ReplayPlan(ReplayKind.IN_STEP, txns, "the database holds every transaction of the shard "
                                                    "(its last one handed over, to be skipped by id)" if txns else
                                                    "the database holds every transaction of the shard")
    return ReplayPlan(ReplayKind.REPLAY, txns, f"{len(txns)} transaction(s) from seqno {txns[0].seqno} to replay")


class Health(StrEnum):
    UP = "up"
    DOWN = "down"


@dataclass
class LoaderHealth:
    """Whether the database answers, and when to try it again (doubling backoff up to ``max_s``)."""

    base_s: float = 0.1
    max_s: float = 5.0
    state: Health = Health.UP
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""
    applied: int = 0
    refused: int = 0

    def ok(self) -> None:
        self.state, self.failures, self.last_error = Health.UP, 0, ""
        self.applied += 1

    def refused_write(self, error: str) -> None:
        """The database answered no (a constraint): it is up; the transaction is refused."""
        self.refused += 1
        self.last_error = error

    def down(self, now: float, error: str) -> float:
        """The database could not be reached; the time of the next attempt."""
        self.state = Health.DOWN
        self.failures += 1
        self.last_error = error
        self.retry_at = now + min(self.max_s, self.base_s * (2 ** (self.failures - 1)))
        return self.retry_at

    def may_try(self, now: float) -> bool:
        return self.state is Health.UP or now >= self.retry_at

    def status(self, now: float) -> dict:
        return {"database": self.state.value, "failures": self.failures, "last_error": self.last_error,
                "retry_in_s": round(max(0.0, self.retry_at - now), 3) if self.state is Health.DOWN else 0.0,
                "applied": self.applied, "refused": self.refused}


Change = tuple[str, str, Any]  # (table, key as JSON text, value document or None = delete)


class LoaderError(MultisiteError):
    """The database did not commit a transaction."""


class LoaderRefused(LoaderError):
    """The database answered and refused the write (a constraint, a type): the transaction is refused."""


class LoaderDown(LoaderError):
    """The database could not be reached or did not answer: try again later."""


class Loader(Protocol):
    """A database a grid map writes through to.

    ``apply`` commits ``txns`` — each ``(TxnId, changes)`` — in **one** database transaction
    together with their ids in the applied-ids table, skipping (no operation) each transaction whose
    id the table already has, and returns how many it applied; it raises ``LoaderRefused`` when the
    database refuses (nothing of the call committed) and ``LoaderDown`` when it cannot reach it.
    ``last_applied(partition)`` is the applied id of the partition with the highest seqno, or None.
    Calls come from one thread at a time."""

    def apply(self, txns: list[tuple[TxnId, list[Change]]]) -> int: ...

    def last_applied(self, partition: int) -> TxnId | None: ...

    def close(self) -> None: ...
