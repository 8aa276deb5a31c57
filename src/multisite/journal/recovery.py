"""Recovery of the journal on open: check the newest segment, cut a torn tail, find the last seqno.

Only the newest segment can hold a torn write: a segment is fsynced before the next one is created.
Older segments are checked whenever they are read (replay, source servers, the Spark source).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JournalCorrupt
from ..fsutil import fsync_dir
from .segments import SegmentInfo, list_segments, scan
from .sidecars import drop_after
from .writer import create_segment


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
        if not repair:
            raise JournalCorrupt(f"journal {journal_dir} has no segments", path=str(journal_dir), offset=0)
        create_segment(journal_dir, 1, 1, 0)
        infos = list_segments(journal_dir)
    tail = infos[-1]
    res = scan(tail, tail=True)
    state = JournalState(infos, res.last_seqno, res.valid_end)
    if res.torn_bytes:
        state.torn_bytes, state.torn_path = res.torn_bytes, str(tail.path)
        state.notes.append(f"cut a torn record of {res.torn_bytes} bytes at offset {res.valid_end} of "
                           f"{tail.path.name} (a write the crash interrupted; it was never acknowledged)")
        if repair:
            drop_after(journal_dir, res.last_seqno)
            fd = os.open(tail.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, res.valid_end)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(journal_dir)
    return state
