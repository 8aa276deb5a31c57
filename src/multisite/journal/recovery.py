"""Recovery of the journal on open: check the newest segment, cut a torn tail, find the last seqno.

Only the newest segment can hold a torn write: a segment is fsynced before the next one is created.
Older segments are checked whenever they are read (replay, source servers, the Spark source).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JournalCorrupt
from ..fsutil import fsync_dir, truncate_file
from .segments import SegmentInfo, list_segments, scan
from .sidecars import drop_after


@dataclass
class JournalState:
    segments: list[SegmentInfo]
    last_seqno: int
    tail_size: int  # valid size of the newest segment
    torn_bytes: int = 0
    torn_path: str = ""
    notes: list[str] = field(default_factory=list)


def recover_journal(journal_dir: Path, *, repair: bool = True) -> JournalState:
    infos = list_segments(journal_dir)
    if not infos:
        # Every instance is created with a segment and keeps its newest one (prune, rollback): none at
        # all means they were removed. Making a new empty one here would start the journal again at
        # seqno 1, beside a store further on, and block the restore of the real ones (a segment whose
        # back pointer matches but holds none of the records it stands for).
        raise JournalCorrupt(f"journal {journal_dir} has no segment files (*.msj): they were removed; restore "
                             f"them from a backup", path=str(journal_dir), offset=0)
    tail = infos[-1]
    res = scan(tail, tail=True)  # damage in it: the open adds how to repair it (instance.maintenance.hint)
    state = JournalState(infos, res.last_seqno, res.valid_end)
    if res.torn_bytes:
        state.torn_bytes, state.torn_path = res.torn_bytes, str(tail.path)
        state.notes.append(f"cut a torn record of {res.torn_bytes} bytes at offset {res.valid_end} of "
                           f"{tail.path.name} (a write the crash interrupted; it was never acknowledged)")
        if repair:
            drop_after(journal_dir, res.last_seqno)
            truncate_file(tail.path, res.valid_end)
            fsync_dir(journal_dir)
    return state
