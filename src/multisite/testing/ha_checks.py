"""What the HA fault tests check after the fact, from the members' files (issue 25).

**One primary at a time, from the journals.** Every journal record carries the instance that committed
it (``origin``) and its commit time. In one member's journal, or in one lost-transaction file, a run of
consecutive records with the same origin is one *leadership period* of that origin: the span of its
commit times is when that member was taking commits. Two members were never primaries accepting commits
at the same time if no two periods of different origins overlap in time, over every journal and every
lost file of the cluster: what a fenced primary committed after losing its lease would be in its lost
file, with times inside the new primary's period. The fence makes the gap between one leader's last
commit and the next one's first at least the fence margin (``decide.FENCE_MARGIN_FRACTION`` of the
lease) after a failover; a switchover closes commits before it hands over, so its gap is only positive.
The times are the machine's wall clock, which every member shares (namespaces included).

A member can lose the lead and win it back with nothing of the other leader's term in its own journal
(that leader's commits were never shipped and ended in its lost file), so one run of records can hold
two of its terms. Every promotion starts a history record in the instance file (``root_primary`` from
``start_seqno`` on: ``replication.roles.change_role``, and ``cut_at`` after a rollback), which the
members replicate; a run is cut where one of its origin's records starts (``term_starts``). A stale
primary's commits never start a record, so they stay in the run they overlap, however sparse the new
leader's stream is.

**Acknowledged commits.** A writer's acknowledged commit is on the final primary, or (without
``--min-confirm``) in a lost file; with ``--min-confirm 1`` it is on the final primary.

**The writer's history** (``history_report``, ``testing/history``): its commits and reads against the
final primary's rows and journal: no acknowledged commit lost (without ``--min-confirm``, one in a lost
file is excused: that is the documented price of asynchronous confirmation), nothing refused visible,
no key journaled twice, no read that missed a commit already acknowledged to the writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..instance.instance_file import load as load_instance_file
from ..instance.layout import Layout
from ..journal.lostfile import LostFile, list_lost_files
from ..journal.reader import iter_records
from ..values import decode_value
from .history import Report, check


@dataclass(frozen=True)
class Period:
    """A run of consecutive records committed by ``origin``: seqnos, commit times, and where it was read."""

    origin: str
    first_seqno: int
    last_seqno: int
    first_time: float
    last_time: float
    where: str  # "A journal", "A lost 2026...mslost"

    def overlaps(self, other: "Period") -> bool:
        return self.first_time <= other.last_time and other.first_time <= self.last_time


def runs(rows: Iterable[tuple[int, str, float]], where: str,
         starts: frozenset[tuple[str, int]] = frozenset()) -> list[Period]:
    """Periods of ``(seqno, origin, time)`` rows in seqno order; a period also ends before a row whose
    ``(origin, seqno)`` is in ``starts`` (a new term of that origin: ``term_starts``)."""
    out: list[Period] = []
    cur: list[tuple[int, str, float]] = []
    for row in rows:
        if cur and (row[1] != cur[0][1] or (row[1], row[0]) in starts):
            out.append(_period(cur, where))
            cur = []
        cur.append(row)
    if cur:
        out.append(_period(cur, where))
    return out


def _period(rows: list[tuple[int, str, float]], where: str) -> Period:
    times = [t for _, _, t in rows]
    return Period(rows[0][1], rows[0][0], rows[-1][0], min(times), max(times), where)


def term_starts(roots: Iterable[Path]) -> frozenset[tuple[str, int]]:
    """``(root_primary, start_seqno)`` of every history record of the members' own stream: where each
    term of each primary began."""
    return frozenset((h.root_primary, h.start_seqno) for root in roots
                     for h in load_instance_file(Layout(Path(root)).instance_file).history if h.stream == 0)


def leadership_periods(roots: Iterable[Path]) -> list[Period]:
    """Every member's journal and lost files, as periods cut into terms (read from the files: stop the
    servers first)."""
    roots = [Path(r) for r in roots]
    starts = term_starts(roots)
    out: list[Period] = []
    for root in roots:
        out += runs(((r.seqno, r.origin, r.time) for r in iter_records(root / "journal")), f"{root.name} journal",
                    starts)
        for path in list_lost_files(root / "lost"):
            txns = sorted(LostFile.read(path).transactions, key=lambda t: t["seqno"])
            out += runs(((t["seqno"], t["origin"], t["time"]) for t in txns), f"{root.name} lost {Path(path).name}",
                        starts)
    return out


def check_one_primary_at_a_time(periods: list[Period]) -> float | None:
    """AssertionError naming two periods of different origins whose commit times overlap; else the
    smallest gap between the end of one origin's period and the start of another's that follows it
    (None with a single origin)."""
    gaps = []
    for i, a in enumerate(periods):
        for b in periods[i + 1:]:
            if a.origin == b.origin:
                continue
            if a.overlaps(b):
                raise AssertionError(f"two primaries took commits at once: {a.origin} ({a.where}, seqnos "
                                     f"{a.first_seqno}..{a.last_seqno}, {a.first_time:.3f}..{a.last_time:.3f}) and "
                                     f"{b.origin} ({b.where}, seqnos {b.first_seqno}..{b.last_seqno}, "
                                     f"{b.first_time:.3f}..{b.last_time:.3f})")
            gaps.append(b.first_time - a.last_time if a.last_time < b.first_time else a.first_time - b.last_time)
    return min(gaps) if gaps else None


def unacknowledged_loss(keys: Iterable[tuple], on_primary, in_lost_files) -> tuple[list, list]:
    """Of the keys of a writer's acknowledged commits: those not on the final primary, and of those the
    ones in no lost file either (silently lost)."""
    missing = [k for k in keys if k not in on_primary]
    return missing, [k for k in missing if k not in in_lost_files]


def journal_updates(root: Path, region: str, keys) -> list[tuple[tuple, object]]:
    """``(key, value)`` of every update of ``region`` in a member's journal whose key is in ``keys``."""
    out = []
    for r in iter_records(Path(root) / "journal"):
        for u in r.updates:
            if u.region == region and tuple(u.key) in keys and u.value is not None:
                out.append((tuple(u.key), decode_value(u.value)))
    return out


def history_report(history, keys: set, on_primary: dict, in_lost_files: set, applied, *,
                   min_confirm: bool) -> Report:
    """The writer's history (its ``keys``) against the final primary's rows and journal; without
    ``min_confirm`` an acknowledged commit in a lost file is excused, not lost."""
    excused = set() if min_confirm else {o.value for o in history if o.key in in_lost_files}
    return check(history, {k: v for k, v in on_primary.items() if k in keys}, applied=applied, keys=keys,
                 excused=excused)
