"""Compare stopped instances with a reference, key by key and journal record by journal record.

Every region's keys and values must match the reference's; so must the journal, record for record
(a BC secondary keeps each transaction's originating seqno, origin and commit time), which also
shows that nothing was lost, repeated or reordered on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

from ..journal.reader import iter_records
from ..journal.records import Record
from ..testing.cluster import Node


@dataclass
class Snapshot:
    name: str
    data: dict[str, dict[tuple, object]]  # region -> key -> value
    journal: list[Record]

    @classmethod
    def of(cls, node: Node) -> "Snapshot":
        """Read a stopped instance's data and journal."""
        data = {region: dict(items) for region, items in node.dump().items()}
        return cls(node.name, data, list(iter_records(node.root / "journal")))

    @property
    def keys(self) -> int:
        return sum(len(d) for d in self.data.values())


@dataclass
class Difference:
    name: str
    keys: int
    missing: int  # in the reference, not here
    extra: int  # here, not in the reference
    different: int  # here with another value
    journal_first: int
    journal_last: int
    journal_mismatches: int  # records that differ from the reference's, or are missing on either side
    contiguous: bool  # journal seqnos without a gap or a repeat

    @property
    def ok(self) -> bool:
        return self.contiguous and not (self.missing or self.extra or self.different or self.journal_mismatches)


def compare(ref: Snapshot, other: Snapshot) -> Difference:
    missing = extra = different = 0
    for region in ref.data.keys() | other.data.keys():
        mine, theirs = other.data.get(region, {}), ref.data.get(region, {})
        missing += sum(1 for k in theirs if k not in mine)
        extra += sum(1 for k in mine if k not in theirs)
        different += sum(1 for k, v in mine.items() if k in theirs and theirs[k] != v)
    journal_mismatches = abs(len(ref.journal) - len(other.journal)) + sum(
        1 for a, b in zip(ref.journal, other.journal) if a != b)
    seqnos = [r.seqno for r in other.journal] or [0]
    contiguous = seqnos == list(range(seqnos[0], seqnos[0] + len(seqnos)))
    return Difference(other.name, other.keys, missing, extra, different, seqnos[0], seqnos[-1], journal_mismatches,
                      contiguous)


def report(console: Console, ref: Snapshot, others: list[Snapshot]) -> bool:
    """Print a table of every instance against ``ref``; True if all of them match it."""
    diffs = [compare(ref, ref)] + [compare(ref, o) for o in others]
    table = Table(title=f"{', '.join(o.name for o in others)} compared key by key with {ref.name}",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for col in ("instance", "keys", "missing", "extra", "changed", "journal", "≠ records", ""):
        table.add_column(col, justify="left" if col in ("instance", "journal", "") else "right", no_wrap=True)
    for i, d in enumerate(diffs):
        verdict = "[bold green]OK[/]" if d.ok else "[bold red]FAILED[/]"
        table.add_row(d.name, f"{d.keys:,}", str(d.missing), str(d.extra), str(d.different),
                      f"{d.journal_first:,}..{d.journal_last:,}" + ("" if d.contiguous else " [red]gaps[/]"),
                      str(d.journal_mismatches), "reference" if i == 0 and d.ok else verdict)
    console.print(table)
    return all(d.ok for d in diffs)
