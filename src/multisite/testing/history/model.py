"""What a client's history is made of: operations with their outcome, and what the checker reports.

An operation is one call a client made: a ``write`` of a value to a key, or a ``read`` of a key and the
value it returned (None: the key was absent). Its ``outcome`` is what the client learned:

- ``ok``: acknowledged (a write is durable by the system's promise; a read returned ``value``);
- ``fail``: definitely not done (refused, or never sent: a connection refused, a vote to roll back);
- ``unknown``: sent, and no answer came (a timeout, a connection broken mid-call): it may or may not
  have taken effect, now or later.

``invoke_t`` and ``complete_t`` are the client's clock when the call started and when it returned (an
operation never completed has ``complete_t = inf``). One write, one value: a value is written once per
key in a history, so that a value seen anywhere names the one write it came from (Elle's trick of
unique values, which turns "which write did this read see?" from a search into a look-up).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
OUTCOMES = (OK, FAIL, UNKNOWN)
WRITE, READ = "write", "read"

LOST = "lost"  # acknowledged, then absent from the final state (nor a later write's value there)
PHANTOM = "phantom"  # visible (final state, a read, a log) yet refused or never written
DUPLICATE = "duplicate"  # one write applied more than once in a log that should hold it once
STALE_READ = "stale_read"  # a read older than a write already acknowledged to the same client
KINDS = (LOST, PHANTOM, DUPLICATE, STALE_READ)


@dataclass(frozen=True)
class Op:
    """One call of one client (see the module docstring)."""

    client: str
    kind: str
    key: Hashable
    value: Hashable
    outcome: str
    invoke_t: float
    complete_t: float = math.inf

    def __post_init__(self) -> None:
        if self.kind not in (WRITE, READ):
            raise ValueError(f"an operation is a {WRITE} or a {READ}, not {self.kind!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"an outcome is one of {OUTCOMES}, not {self.outcome!r}")
        if self.complete_t < self.invoke_t:
            raise ValueError(f"{self.client}'s {self.kind} of {self.key!r} completed before it was invoked")

    def precedes(self, other: "Op") -> bool:
        """Real-time order: this call returned before ``other`` was invoked."""
        return self.complete_t < other.invoke_t


@dataclass(frozen=True)
class Anomaly:
    kind: str
    key: Hashable
    value: Hashable
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: key {self.key!r} value {self.value!r}: {self.detail}"


@dataclass
class Report:
    """What ``check`` found: counts of the history's operations, the anomalies, and what was excused
    (acknowledged writes the caller says a rollback legitimately took, e.g. into a lost file)."""

    counts: Counter = field(default_factory=Counter)  # "write ok", "read unknown", ...
    anomalies: list[Anomaly] = field(default_factory=list)
    excused: int = 0

    @property
    def ops(self) -> int:
        return sum(self.counts.values())

    def by_kind(self) -> Counter:
        return Counter(a.kind for a in self.anomalies)

    def summary(self) -> str:
        ops = ", ".join(f"{k} {n}" for k, n in sorted(self.counts.items()))
        found = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind().items())) or "none"
        return f"{self.ops} operations ({ops}); anomalies: {found}; excused: {self.excused}"

    def assert_clean(self, where: str = "") -> None:
        """AssertionError listing the first anomalies, if any."""
        if self.anomalies:
            first = "; ".join(str(a) for a in self.anomalies[:10])
            raise AssertionError(f"history checker{' (' + where + ')' if where else ''}: "
                                 f"{len(self.anomalies)} anomalies ({self.summary()}): {first}")
