"""The demo's key-by-key comparison: it must see every kind of difference, and pass only identical instances."""

from __future__ import annotations

import io

from rich.console import Console

from multisite.demo.compare import Snapshot, compare, report
from multisite.journal.records import SET, Record, Update


def _journal(*seqnos: int) -> list[Record]:
    return [Record(s, 0, 0, "A", 1000.0 + s, [Update(SET, "acct", ("k", s), b"\x01")]) for s in seqnos]


REF = Snapshot("A", {"acct": {("k", 1): 1, ("k", 2): 2}}, _journal(1, 2, 3))


def test_identical_instances_match():
    d = compare(REF, Snapshot("B", {"acct": {("k", 1): 1, ("k", 2): 2}}, _journal(1, 2, 3)))
    assert d.ok and (d.keys, d.journal_first, d.journal_last) == (2, 1, 3)


def test_every_kind_of_difference_is_counted():
    d = compare(REF, Snapshot("B", {"acct": {("k", 2): 20, ("k", 3): 3}}, _journal(1, 2, 3)))
    assert (d.missing, d.extra, d.different, d.ok) == (1, 1, 1, False)
    assert not compare(REF, Snapshot("B", {"acct": {}, "other": {}}, _journal(1, 2, 3))).ok


def test_journal_gaps_and_differing_records_fail():
    gap = compare(REF, Snapshot("B", REF.data, _journal(1, 3)))
    assert not gap.contiguous and gap.journal_mismatches and not gap.ok
    changed = _journal(1, 2, 3)
    changed[1].origin = "B"
    assert compare(REF, Snapshot("B", REF.data, changed)).journal_mismatches == 1


def test_report_prints_a_verdict_per_instance():
    console = Console(file=io.StringIO(), width=100)
    assert report(console, REF, [Snapshot("B", REF.data, _journal(1, 2, 3))])
    assert not report(console, REF, [Snapshot("C", {}, [])])
    out = console.file.getvalue()
    assert "reference" in out and "OK" in out and "FAILED" in out
