"""The history checker: lost writes, phantom writes, duplicates and stale reads, from what clients saw.

    report = check(history, final={key: value, ...}, applied=[(key, value), ...], excused={...})
    report.assert_clean()

Pure: it reads the operations and the states it is given, and does no I/O (the rounds read the final
state and the logs from the instances and hand them in). The rules, for each key seen as a register
whose every write has a value of its own (``model.py``):

- **lost**: an acknowledged write ``w`` whose key's final value is neither ``w``'s nor that of a write
  that might have come after it (one not returned before ``w`` was invoked, acknowledged or unknown).
  A value the caller lists in ``excused`` (an acknowledged write a documented rollback took, e.g. into a
  lost-transaction file without synchronous confirmation) is counted, not reported.
- **phantom**: a value in the final state, returned by a read, or in ``applied`` that no write of that
  key could have made: its write was refused (``fail``), or was never invoked. ``initial`` values (what
  the key held before the history) are not phantoms.
- **duplicate**: a ``(key, value)`` more than once in ``applied`` (one log, e.g. a journal's updates, in
  which each write must appear exactly once).
- **stale read**: an acknowledged read by a client that returned a value older than a write of the same
  key already acknowledged to that client (a value whose write returned before that one was invoked,
  the key's initial value, or nothing), unless that write is excused.

"Older" is real-time order only (Jepsen's: ``a`` precedes ``b`` when ``a`` returned before ``b`` was
invoked), so concurrent writes never make a false alarm, and a write whose outcome was unknown may
have landed at any time after its invocation.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import Hashable, Iterable, Mapping

from .model import DUPLICATE, FAIL, LOST, OK, PHANTOM, READ, STALE_READ, WRITE, Anomaly, Op, Report

ABSENT = object()  # a key missing from the final state


def check(history: Iterable[Op], final: Mapping[Hashable, Hashable], *,
          applied: Iterable[tuple[Hashable, Hashable]] = (), initial: Mapping[Hashable, Hashable] | None = None,
          excused: Iterable[Hashable] = (), keys: Iterable[Hashable] | None = None) -> Report:
    """The anomalies of ``history`` against the ``final`` state (module docstring). ``keys``: the keys
    to check (default: every key the history wrote and every key of ``final``: a key nobody wrote is
    a phantom; pass ``keys`` when ``final`` holds keys of other histories)."""
    ops = list(history)
    initial = dict(initial or {})
    excused = set(excused)
    report = Report(counts=Counter(f"{o.kind} {o.outcome}" for o in ops))
    writes = _index_writes(ops)
    for key in (set(writes) | set(final) if keys is None else set(keys)):
        _check_key(key, writes.get(key, {}), final.get(key, ABSENT), initial, excused, report)
    _check_applied(applied, writes, initial, report)
    _check_reads(ops, writes, initial, excused, report)
    return report


def _index_writes(ops: list[Op]) -> dict[Hashable, dict[Hashable, Op]]:
    """key -> value -> its write; ValueError on a value written twice to one key (a malformed history)."""
    out: dict[Hashable, dict[Hashable, Op]] = defaultdict(dict)
    for o in ops:
        if o.kind != WRITE:
            continue
        if o.value in out[o.key]:
            raise ValueError(f"value {o.value!r} written twice to key {o.key!r}: values must be unique per key")
        out[o.key][o.value] = o
    return out


def _origin(value, by_value: dict[Hashable, Op], key, initial: dict) -> Op | str | None:
    """The write that made ``value`` (an Op), ``"initial"``, ``"absent"``, or None: no write could."""
    if value is ABSENT or value is None:
        return "absent"
    w = by_value.get(value)
    if w is not None:
        return None if w.outcome == FAIL else w
    return "initial" if key in initial and initial[key] == value else None


def _phantom(key, value, where: str, by_value: dict[Hashable, Op]) -> Anomaly:
    w = by_value.get(value)
    why = f"refused to {w.client} (fail)" if w is not None else "never written"
    return Anomaly(PHANTOM, key, value, f"{where}, yet {why}")


def _check_key(key, by_value: dict[Hashable, Op], value, initial: dict, excused: set, report: Report) -> None:
    """Lost writes of ``key`` and whether its final value is a phantom."""
    origin = _origin(value, by_value, key, initial)
    if origin is None:
        report.anomalies.append(_phantom(key, value, "in the final state", by_value))
    for w in by_value.values():
        if w.outcome != OK or w.value == value:
            continue
        if isinstance(origin, Op) and not origin.precedes(w):
            continue  # the final value's write may have come after w (or was w's concurrent rival)
        if w.value in excused:
            report.excused += 1
            continue
        shown = "absent" if value is ABSENT else repr(value)
        report.anomalies.append(Anomaly(LOST, key, w.value, f"acknowledged to {w.client}, yet the final value "
                                                            f"is {shown}"))


def _check_applied(applied, writes: dict, initial: dict, report: Report) -> None:
    """Duplicates and phantoms in a log that holds each write once."""
    seen = Counter((k, v) for k, v in applied)
    for (key, value), n in seen.items():
        by_value = writes.get(key, {})
        if _origin(value, by_value, key, initial) is None:
            report.anomalies.append(_phantom(key, value, "applied", by_value))
        if n > 1:
            report.anomalies.append(Anomaly(DUPLICATE, key, value, f"applied {n} times"))


def _check_reads(ops: list[Op], writes: dict, initial: dict, excused: set, report: Report) -> None:
    """Phantom reads, and reads older than a write acknowledged to the same client before them."""
    acked = _acked_by_client(ops)
    for r in ops:
        if r.kind != READ or r.outcome != OK:
            continue
        by_value = writes.get(r.key, {})
        origin = _origin(r.value, by_value, r.key, initial)
        if origin is None:
            report.anomalies.append(_phantom(r.key, r.value, f"read by {r.client}", by_value))
            continue
        w = _newest_before(acked.get((r.client, r.key)), r.invoke_t)
        if w is None or w.value == r.value or (isinstance(origin, Op) and not origin.precedes(w)):
            continue
        if w.value in excused:
            report.excused += 1
            continue
        report.anomalies.append(Anomaly(STALE_READ, r.key, r.value, f"read by {r.client} at {r.invoke_t:.3f} after "
                                                                     f"its write of {w.value!r} was acknowledged "
                                                                     f"at {w.complete_t:.3f}"))


def _acked_by_client(ops: list[Op]) -> dict[tuple, tuple[list[float], list[Op]]]:
    """(client, key) -> its acknowledged writes sorted by completion, with the one invoked last so far
    at each position (the write a read must not be older than)."""
    out: dict[tuple, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == WRITE and o.outcome == OK:
            out[(o.client, o.key)].append(o)
    index = {}
    for ck, ws in out.items():
        ws.sort(key=lambda o: o.complete_t)
        latest, best = [], None
        for w in ws:
            best = w if best is None or w.invoke_t > best.invoke_t else best
            latest.append(best)
        index[ck] = ([w.complete_t for w in ws], latest)
    return index


def _newest_before(entry, t: float) -> Op | None:
    """Of a client's acknowledged writes of a key returned before ``t``, the one invoked last."""
    if entry is None:
        return None
    times, latest = entry
    i = bisect.bisect_left(times, t)
    return latest[i - 1] if i else None
