"""Checks shared by the replication tests: polling with deadlines, data and journal comparisons, logs.

Tests of real processes must not sleep for a fixed time and hope; they poll a condition until a
deadline and, on timeout, fail with the last value seen, so that a slow machine only makes them
slower and a real failure says what was wrong.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from .. import engine as database
from ..journal.reader import iter_frames, iter_records

T = TypeVar("T")


def filled_instance(path: Path, records: int, *, segment_bytes: int = 4096) -> Path:
    """A closed instance ``A`` of ``records`` single-set transactions (region ``acct``, key
    ``("k", i)``, value ``{"i": i, "pad": 100 x's}``) in small segments: about 30 records each."""
    root = database.create(path, name="A", durability="none", segment_bytes=segment_bytes)
    with database.open(root) as db:
        db.create_region("acct")
        for i in range(records):
            db.set("acct", ("k", i), {"i": i, "pad": "x" * 100})
    return root


def wait_until(probe: Callable[[], T], *, timeout_s: float = 30.0, what: str = "condition",
               poll_s: float = 0.02) -> T:
    """Call ``probe`` until it returns something truthy (returned) or ``timeout_s`` passes (AssertionError,
    with the last value). Exceptions from ``probe`` propagate."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last value: {got!r}")
        time.sleep(poll_s)


def replicated_data(root: Path) -> dict[str, list]:
    """Every non-empty replicated region's content, read from a stopped instance's files."""
    with database.open(root) as db:
        out = {r: list(db.items(r)) for r, replicated in sorted(db.regions().items()) if replicated}
    return {r: rows for r, rows in out.items() if rows}


def assert_same_data(primary: Path, secondary: Path) -> dict[str, list]:
    """The secondary holds exactly the primary's replicated data (both stopped); returns it."""
    a, b = replicated_data(primary), replicated_data(secondary)
    if a != b:
        diffs = []
        for r in sorted(set(a) | set(b)):
            ra, rb = dict(a.get(r, [])), dict(b.get(r, []))
            for k in sorted(set(ra) | set(rb), key=repr):
                if ra.get(k, "<absent>") != rb.get(k, "<absent>"):
                    diffs.append(f"{r}{k}: {ra.get(k, '<absent>')!r} != {rb.get(k, '<absent>')!r}")
        raise AssertionError(f"{secondary.name} differs from {primary.name} in {len(diffs)} key(s): "
                             + "; ".join(diffs[:10]))
    return a


def journal_seqnos(root: Path) -> list[int]:
    """The seqnos of every record in an instance's journal, in file order (decoding each record)."""
    return [rec.seqno for rec in iter_records(Path(root) / "journal")]


def assert_contiguous_journal(root: Path, last: int) -> None:
    """The journal holds seqnos 1..last exactly once each, in order: no gap, no duplicate."""
    got = journal_seqnos(root)
    if got != list(range(1, last + 1)):
        dup = sorted({s for s in got if got.count(s) > 1})[:5]
        missing = sorted(set(range(1, last + 1)) - set(got))[:5]
        raise AssertionError(f"journal of {Path(root).name}: {len(got)} records, expected 1..{last}; "
                             f"duplicates {dup}, missing {missing}, first/last {got[:1]}/{got[-1:]}")


def journal_records(root: Path) -> list[Any]:
    """Every record as (seqno, stream, stream_seqno, origin, updates) for cross-instance comparison."""
    return [(r.seqno, r.stream, r.stream_seqno, r.origin, [(u.op, u.region, tuple(u.key), u.value)
                                                           for u in r.updates])
            for r in iter_records(Path(root) / "journal")]


def journal_frames(root: Path) -> list[bytes]:
    """Every journal frame, header and payload, byte for byte (a BC secondary's equal its primary's)."""
    return [fr for _, fr in iter_frames(Path(root) / "journal", whole=True)]


def log_text(root: Path, filename: str) -> str:
    """A component's log (``server.log``, ``receiver.log``, ``source-NAME.log``, ``update.log``)."""
    p = Path(root) / "log" / filename
    return p.read_text(errors="replace") if p.exists() else ""


@contextmanager
def held_fdatasync(journal: Any) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold ``journal``'s fdatasyncs, as a slow disk does: yields ``(in_sync, release)``; ``in_sync`` is
    set once one has begun, and each waits (up to 10 s) for ``release``, set on leaving the block.
    For tests of what may be said while a batch is written but not yet hard."""
    in_sync, release = threading.Event(), threading.Event()
    real = journal._fdatasync

    def slow_disk(fd: int) -> None:
        in_sync.set()
        release.wait(10)
        real(fd)

    journal._fdatasync = slow_disk
    try:
        yield in_sync, release
    finally:
        release.set()
        journal._fdatasync = real
