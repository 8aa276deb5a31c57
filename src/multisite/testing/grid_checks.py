"""A writer through the grid client and the checks made after faults (tests, bench, demo).

``GridWriter(g)`` puts unique increasing values to random keys from a thread and remembers each
outcome: acknowledged with its partition and seqno, refused by the vote, unknown, unavailable.
``check_grid(g, writer, status)`` (containers stopped) then checks, from the shards' journals:

- every acknowledged commit is in its partition's journal at the seqno it was acknowledged with,
  and its key holds its value or a later one (acknowledged, or whose outcome was unknown);
- no two acknowledged commits share a partition and a seqno: two primaries of one partition never
  took commits in overlapping epochs (each would give out the same next seqnos);
- a commit refused by the vote is in no shard's journal;
- every shard of a partition holds the same rows at the same seqno;
- the writer's history (``testing/history``: each put and, one call in four, a get of one of its keys,
  with invocation, outcome and the value read) against the final rows and the primaries' journals: no
  lost write, no phantom (a value voted to roll back, or refused, visible), no write applied twice, no
  read older than the writer's own acknowledged write (``history_report``, also in the summary).

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
from .history import READ, WRITE, Recorder, check

WRITER_KEYS = 64
READ_SHARE = 0.25  # of the writer's calls, gets of a key it writes (a stale read after its own write shows)


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
        self.history = Recorder()

    def run(self) -> None:
        rng, reads = random.Random(self.seed), random.Random(self.seed + 1)
        cl = self.g.client(timeout_s=self.timeout_s)
        n = 0
        while not self.stopping.is_set():
            if reads.random() < READ_SHARE:
                self._get(cl, reads.randrange(self.keys))
                continue
            k = rng.randrange(self.keys)
            n += 1
            self._put(cl, k, n)
        cl.close()

    def _put(self, cl, k: int, n: int) -> None:
        op = self.history.invoke("grid-writer", WRITE, k, n)
        try:
            seqno = cl.put("m", k, n)
            self.history.ok(op)
            self.acked.append(Acked(time.monotonic(), cl.partition_of((k,)), seqno, k, n))
            self.counts["acked"] += 1
        except ReplicationVotedToRollback:
            self.history.fail(op)
            self.rolled_back.add(n)
            self.counts["rolled_back"] += 1
        except CommitOutcomeUnknown:
            self.history.unknown(op)
            self.unknown.setdefault(k, []).append(n)
            self.counts["unknown"] += 1
        except GridUnavailable as e:  # every try was refused before it was taken: never committed
            self.history.fail(op)
            self.counts["unavailable"] += 1
            self.errors.append(str(e))
        except (TransactionError, MultisiteError, OSError) as e:
            self.history.unknown(op)
            self.counts["other"] += 1
            self.errors.append(f"{type(e).__name__}: {e}")

    def _get(self, cl, k: int) -> None:
        op = self.history.invoke("grid-writer", READ, k)
        try:
            value = cl.get("m", k)
        except (MultisiteError, OSError):
            self.history.unknown(op)
            self.counts["read_failed"] = self.counts.get("read_failed", 0) + 1
            return
        self.history.ok(op, value, read=True)
        self.counts["reads"] = self.counts.get("reads", 0) + 1

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
    applied: list[tuple[int, int]] = []
    for part in status["partitions"]:
        p = part["partition"]
        placed = [c for c in (part["primary"], *part["sync"], *part["async"]) if c]
        rows = [states[p][c]["rows"] for c in placed]
        assert all(r == rows[0] for r in rows), f"partition {p}: shards {placed} differ"
        assert len({states[p][c]["seqno"] for c in placed}) == 1, f"partition {p}: seqnos differ"
        final.update({k[0]: v for k, v in rows[0].items()})
        journals = {c: _journal(g.shard_dir(c, p)) for c in placed}
        applied += [(u.key[0], decode_value(u.value)) for j in journals[part["primary"]].values() for u in j
                    if u.region == "m" and u.value is not None]
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
    report = history_report(w, final, applied)
    report.assert_clean("grid writer")
    return {**w.counts, "keys": len(final), "history": report.summary()}


def history_report(w: GridWriter, final: dict, applied: list[tuple[int, int]]):
    """The writer's history checked against the final rows and the primaries' journals (its keys only)."""
    mine = range(w.keys)
    return check(w.history.history(), {k: v for k, v in final.items() if k in mine},
                 applied=[(k, v) for k, v in applied if k in mine], keys=mine)
