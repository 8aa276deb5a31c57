"""A writer through the grid client and the checks made after faults (tests, bench, demo).

``GridWriter(g)`` puts unique increasing values to random keys from a thread and remembers each
outcome: acknowledged with its partition and seqno, refused by the vote, unknown, unavailable.
``check_grid(g, writer, status)`` (containers stopped) then checks, from the shards' journals:

- every acknowledged commit is in its partition's journal at the seqno it was acknowledged with,
  and its key holds its value or a later one (acknowledged, or whose outcome was unknown);
- no two acknowledged commits share a partition and a seqno: two primaries of one partition never
  took commits in overlapping epochs (each would give out the same next seqnos);
- a commit refused by the vote is in no shard's journal;
- every shard of a partition holds the same rows at the same seqno.

``first_commits(writer, t0)``: how long after ``t0`` each partition acknowledged its next commit
(the pause a fault caused).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from ..errors import (CommitOutcomeUnknown, GridUnavailable, MultisiteError, ReplicationVotedToRollback,
                      TransactionError)
from ..journal.reader import iter_frames
from ..journal.records import decode_payload
from ..values import decode_value

WRITER_KEYS = 64


@dataclass
class Acked:
    t: float
    partition: int
    seqno: int
    key: int
    value: int


class GridWriter(threading.Thread):
    """Puts from a thread of its own until ``stop()`` (see the module docstring)."""

    def __init__(self, g, *, keys: int = WRITER_KEYS, seed: int = 7, timeout_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.g, self.keys, self.seed, self.timeout_s = g, keys, seed, timeout_s
        self.acked: list[Acked] = []
        self.unknown: dict[int, list[int]] = {}  # key -> values whose outcome is unknown
        self.rolled_back: set[int] = set()
        self.counts = {"acked": 0, "rolled_back": 0, "unknown": 0, "unavailable": 0, "other": 0}
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        rng = random.Random(self.seed)
        cl = self.g.client(timeout_s=self.timeout_s)
        n = 0
        while not self.stopping.is_set():
            k = rng.randrange(self.keys)
            n += 1
            try:
                seqno = cl.put("m", k, n)
                self.acked.append(Acked(time.monotonic(), cl.partition_of((k,)), seqno, k, n))
                self.counts["acked"] += 1
            except ReplicationVotedToRollback:
                self.rolled_back.add(n)
                self.counts["rolled_back"] += 1
            except CommitOutcomeUnknown:
                self.unknown.setdefault(k, []).append(n)
                self.counts["unknown"] += 1
            except GridUnavailable as e:
                self.counts["unavailable"] += 1
                self.errors.append(str(e))
            except (TransactionError, MultisiteError, OSError) as e:
                self.counts["other"] += 1
                self.errors.append(f"{type(e).__name__}: {e}")
        cl.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopping.set()
        self.join(timeout_s)


def first_commits(w: GridWriter, t0: float, partitions: int) -> dict[int, float | None]:
    """Per partition: seconds from ``t0`` to its first acknowledged commit after it (None: none yet)."""
    out: dict[int, float | None] = {p: None for p in range(partitions)}
    for a in w.acked:
        if a.t > t0 and out[a.partition] is None:
            out[a.partition] = round(a.t - t0, 3)
    return out


def _journal(path) -> dict[int, list]:
    out = {}
    for seqno, payload in iter_frames(path / "journal", 1):
        out[seqno] = decode_payload(payload).updates
    return out


def check_grid(g, w: GridWriter, status: dict) -> dict:
    """The checks of the module docstring on every placed shard (containers stopped); a summary."""
    seen: dict[tuple[int, int], int] = {}
    for a in w.acked:
        other = seen.setdefault((a.partition, a.seqno), a.value)
        assert other == a.value, (f"partition {a.partition} seqno {a.seqno} acknowledged twice (values {other} and "
                                  f"{a.value}): two primaries took commits at once")
    states = g.shard_states()
    final: dict[int, int] = {}
    for part in status["partitions"]:
        p = part["partition"]
        placed = [c for c in (part["primary"], *part["sync"], *part["async"]) if c]
        rows = [states[p][c]["rows"] for c in placed]
        assert all(r == rows[0] for r in rows), f"partition {p}: shards {placed} differ"
        assert len({states[p][c]["seqno"] for c in placed}) == 1, f"partition {p}: seqnos differ"
        final.update({k[0]: v for k, v in rows[0].items()})
        journals = {c: _journal(g.shard_dir(c, p)) for c in placed}
        for c, j in journals.items():
            for seqno, updates in j.items():
                for u in updates:
                    assert decode_value(u.value) not in w.rolled_back, (p, c, seqno, u)
        for a in (a for a in w.acked if a.partition == p):
            for c, j in journals.items():
                vals = [decode_value(u.value) for u in j.get(a.seqno, [])]
                assert a.value in vals, (f"partition {p}: acknowledged commit {a.value} (key {a.key}, seqno {a.seqno}) "
                                         f"is not at that seqno in {c}'s journal ({vals})")
    last: dict[int, int] = {}
    for a in w.acked:
        last[a.key] = a.value
    for k, v in last.items():
        later_unknown = [u for u in w.unknown.get(k, []) if u > v]
        assert final.get(k) == v or final.get(k) in later_unknown, (k, v, final.get(k), later_unknown)
    return {**w.counts, "keys": len(final)}
