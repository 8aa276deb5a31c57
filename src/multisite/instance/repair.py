"""``multisite journal repair``: cut the newest segment at damage that a power loss can leave.

Recovery calls a damaged frame with an intact frame after it corruption, and the instance does not
open: the frames after the damage prove the damaged one was written, so it may have been
acknowledged. After a power loss that is not always so. Group commit writes one batch of frames with
one write and writes the next batch while the previous one's fdatasync runs; the disk may keep any
of the pages these writes dirtied and lose others, so an unacknowledged frame can be lost (zeros, or
old bytes) with later unacknowledged frames intact behind it. The journal alone cannot tell which
case it is, so opening stays strict and the operator decides, with what this module shows:

- where the damage is, the last intact seqno before it, and every intact record after it;
- whether the store proves the damaged records were acknowledged: the store is flushed only once
  the journal is hard up to the same seqno, so a store at or past the damaged seqno means they were,
  and the repair is refused (restore from a backup, or fail over to a replica that has them);
- which secondaries confirmed records past the cut: they hold them, and must roll back to the cut
  (``multisite rollback --fetchresync``) when they next connect, as after any failover.

The repair writes the intact records after the damage to a lost-transaction file (``lost/``, the
format rollback uses), trims the instance file as a rollback does (history, slots), removes the
sidecars past the cut and cuts the segment at the damage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JournalCorrupt
from ..fsutil import fsync_dir, make_dir, truncate_file
from ..journal.lostfile import write_lost_file
from ..journal.records import FRAME_HEADER_SIZE, Record, decode_payload
from ..journal.segments import SegmentView, ScanResult, list_segments
from ..journal.sidecars import drop_after
from . import instance_file as ifile
from .layout import InstanceLock, Layout
from .maintenance import store_seqno


@dataclass
class RepairPlan:
    segment: str  # the newest segment's path
    offset: int  # where the damage starts: the segment is cut here
    last_intact_seqno: int  # the last record before the damage
    damaged_bytes: int  # from the damage to the end of what was written (zeros after it not counted)
    intact_after: list[int] = field(default_factory=list)  # seqnos of intact records after the damage
    store_seqno: int = 0
    confirmed: dict[str, int] = field(default_factory=dict)  # secondary -> confirmed seqno past the cut
    refused: str = ""  # why the cut must not be made ("" when it may)
    lost_file: str = ""  # set once done

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def plan(root: str | os.PathLike) -> RepairPlan | None:
    """What a repair would do, or None when the newest segment needs none (the owner must be gone)."""
    lay = Layout.existing(root)
    with InstanceLock(lay):  # a journal someone writes is not to be judged, nor cut
        return _plan(lay)[0]


def repair(root: str | os.PathLike) -> RepairPlan | None:
    """Make the cut of :func:`plan` (refused plans raise); returns the plan done, None if nothing to do."""
    lay = Layout.existing(root)
    with InstanceLock(lay):
        p, records = _plan(lay)
        if p is None:
            return None
        if p.refused:
            raise JournalCorrupt(f"journal of {lay.root} is damaged at offset {p.offset} of {p.segment} and will "
                                 f"not be cut: {p.refused}", path=p.segment, offset=p.offset)
        info = ifile.load(lay.instance_file)
        if records:
            make_dir(lay.lost)
            p.lost_file = str(write_lost_file(
                lay.lost, instance=info.name, group=info.group, records=records, common_seqno=p.last_intact_seqno,
                si_streams=info.si_streams(),
                reason=f"journal repair: damage at offset {p.offset} of {Path(p.segment).name}, intact records "
                       f"after it cut"))
        info.cut_at(p.last_intact_seqno)  # as a rollback does: what was cut is told apart from what follows
        ifile.save(lay.instance_file, info)
        drop_after(lay.journal, p.last_intact_seqno)
        truncate_file(p.segment, p.offset)
        fsync_dir(lay.journal)
        return p


def _plan(lay: Layout) -> tuple[RepairPlan | None, list[Record]]:
    infos = list_segments(lay.journal)
    if not infos:
        raise JournalCorrupt(f"journal {lay.journal} has no segment files (*.msj): restore them from a backup",
                             path=str(lay.journal), offset=0)
    tail = infos[-1]
    with SegmentView(tail) as view:
        res = ScanResult(tail.first_seqno - 1, 0, 0, 0)
        for _ in view.frames(tail=True, scan=res, search=False):  # up to the first bad frame, no further
            pass
        off, last = res.valid_end, res.last_seqno
        if off >= view.size or view.zeros_from(off):
            return None, []
        after = _intact_after(view, off, last + 1)
        if not after:
            return None, []  # a torn tail: opening cuts it by itself
        end = after[-1][0] + after[-1][1]
        records = [decode_payload(view.buf[o + FRAME_HEADER_SIZE : o + n]) for o, n, _ in after]
    p = RepairPlan(str(tail.path), off, last, end - off, [s for _, _, s in after])
    p.store_seqno = store_seqno(lay)
    info = ifile.load(lay.instance_file)
    p.confirmed = {n: s.last_confirmed for n, s in info.slots.items()
                   if s.kind == "secondary" and s.last_confirmed > last}
    if p.store_seqno > last:
        p.refused = (f"the store is at seqno {p.store_seqno}, past the last intact record {last}: the store is "
                     f"flushed only once the journal is hard, so the damaged records were acknowledged. Restore "
                     f"the instance from a backup, or fail over to a replica that holds them")
    return p, records


def _intact_after(view: SegmentView, off: int, seqno: int) -> list[tuple[int, int, int]]:
    """``(offset, total bytes, seqno)`` of every intact frame after the damage at ``off``, found as
    recovery finds them; across further damaged spots too, since any page the lost writes dirtied
    may be lost (their seqnos then have gaps)."""
    out: list[tuple[int, int, int]] = []
    at, s = off, seqno
    while (found := view.intact_frame_after(at, s)) is not None:
        at, s = found
        while (hdr := view.intact_frame(at, s)) is not None:
            out.append((at, hdr.total, s))
            at += hdr.total
            s += 1
    return out
