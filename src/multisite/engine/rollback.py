"""Rollback: take every transaction after a seqno off an instance, into a lost-transaction file.

The engine's "cut the journal at seqno S and reset positions" (GT.M's ``mupip journal -rollback``),
public as ``Database.rollback``. Steps, each safe to repeat (so a crash at any point is finished
by the next open):

1. read the records after ``to_seqno`` from the journal (checked);
2. write a marker ``run/rollback.json`` naming the target and the file, then the records, in
   commit order, to that Unreplicated Transaction Log in ``lost/`` (fsynced);
3. undo them in the store, newest first, with their before-images, and commit the store at
   ``to_seqno``;
4. cut the journal back to ``to_seqno`` (later segments removed, the one holding it truncated);
5. trim the instance file's history (a primary starts a new history record at ``to_seqno + 1``,
   so that its later transactions are told apart from the ones it rolled off) and its slots;
6. remove the marker.

If the marker is found on open, recovery has already rolled the store forward over whatever the
journal still holds, and the rollback simply runs again to the same target and file name.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import RollbackError
from ..fsutil import atomic_write, fsync_dir, truncate_file
from ..instance import archives
from ..journal.lostfile import lost_file_path, write_lost_file
from ..journal.reader import iter_records
from ..journal.records import KILL, Record
from ..journal.segments import SEGMENT_HEADER_SIZE, SegmentView, list_segments
from ..journal.sidecars import drop_after
from ..journal.writer import JournalWriter
from ..keys import encode_key
from .core import Core


@dataclass
class RollbackReport:
    instance: str
    from_seqno: int  # seqno before the rollback
    to_seqno: int  # seqno after it
    rolled_back: int
    lost_file: str | None
    seconds: float

    def summary(self) -> str:
        if not self.rolled_back:
            return f"{self.instance} is at seqno {self.to_seqno}: nothing to roll back"
        rate = self.rolled_back / self.seconds if self.seconds else 0
        return (f"{self.instance} rolled back {self.rolled_back} transaction(s), seqno {self.from_seqno} -> "
                f"{self.to_seqno}, in {self.seconds:.2f} s ({rate:,.0f}/s); lost transactions in {self.lost_file}")


def rollback(core: Core, to_seqno: int, *, reason: str = "rollback", common_seqno: int | None = None,
             common_stream: int | None = None) -> RollbackReport:
    """Roll the instance back to ``to_seqno``. A no-op if it is not ahead of it. ``common_seqno``
    (default ``to_seqno``) goes into the lost file, in SI stream ``common_stream``'s numbering if given."""
    with core.lock:
        core.check_open()
        return _rollback_locked(core, to_seqno, reason, to_seqno if common_seqno is None else common_seqno,
                                common_stream)


def _rollback_locked(core: Core, to_seqno: int, reason: str, common: int, common_stream: int | None = None
                     ) -> RollbackReport:
    t0 = time.perf_counter()
    start = core.seqno
    if to_seqno < 0:
        raise RollbackError(f"cannot roll back to seqno {to_seqno}")
    if to_seqno >= start:
        return RollbackReport(core.name, start, start, 0, None, 0.0)
    lay = core.layout
    infos = list_segments(lay.journal)
    if infos and to_seqno + 1 < infos[0].first_seqno:
        raise RollbackError(f"cannot roll {core.name} back to seqno {to_seqno}: the journal starts at "
                            f"{infos[0].first_seqno} (older segments were pruned); restore from a backup")
    core.flush()
    records = list(iter_records(lay.journal, to_seqno + 1, start, infos))
    if len(records) != start - to_seqno:
        raise RollbackError(f"journal of {core.name} holds {len(records)} of the {start - to_seqno} records after "
                            f"seqno {to_seqno}; cannot roll back")
    marker = lay.rollback_marker
    lost = None
    if marker.exists():
        m = json.loads(marker.read_text())
        if m.get("to_seqno") == to_seqno and m.get("lost_file"):
            lost = Path(m["lost_file"])
    if lost is None:
        # The marker goes first and names the file: a lost file never exists without its rollback
        # being under way, so a crash between the two cannot leave transactions both in the
        # database and in a lost file; the next open finishes the rollback with this very file.
        lost = lost_file_path(lay.lost, core.name, records[0].seqno, records[-1].seqno)
        atomic_write(marker, json.dumps({"to_seqno": to_seqno, "lost_file": str(lost)}).encode())
    if not lost.exists():
        write_lost_file(lay.lost, instance=core.name, group=core.info.group, records=records, common_seqno=common,
                        reason=reason, path=lost, si_streams=core.info.si_streams(), common_stream=common_stream)
    archives.cap(lay, to_seqno)  # before the cut: a crash after it must not leave the old marks
    _undo_store(core, records, to_seqno)
    _cut_journal(core, to_seqno)
    archives.cap(lay, to_seqno)  # again: an archiver may have recorded what it read before the cut
    _trim_info(core, to_seqno)
    marker.unlink(missing_ok=True)
    fsync_dir(lay.run)
    for listener in core.rollback_listeners:
        listener(to_seqno)
    return RollbackReport(core.name, start, to_seqno, len(records), str(lost), time.perf_counter() - t0)


def _undo_store(core: Core, records: list[Record], to_seqno: int) -> None:
    """Put every touched key back to its state at ``to_seqno``: the before-image of the first
    rolled-off update that touched it (a kill's before-image lists every key it removed)."""
    st = core.store
    state: dict[tuple[str, bytes], bytes | None] = {}
    for rec in records:
        for u in rec.updates:
            if u.op == KILL:
                for k, v in u.killed or []:
                    state.setdefault((u.region, encode_key(tuple(k))), v)
            else:
                state.setdefault((u.region, encode_key(u.key)), u.before)
    for rec in reversed(records):
        if rec.stream or core.info.supplementary:
            prev = core.stream_seqnos.get(rec.stream)
            if prev is None or rec.stream_seqno - 1 < prev:
                core.stream_seqnos[rec.stream] = rec.stream_seqno - 1
    by_region: dict[str, tuple[list, list]] = {}
    for (region, kb), vb in state.items():
        puts, dels = by_region.setdefault(region, ([], []))
        (dels.append(kb) if vb is None else puts.append((kb, vb)))
    for region, (puts, dels) in by_region.items():
        r = st.regions.get(region) or st.create_region(region, True)
        st.delete_many(r.id, dels)
        st.put_many(r.id, puts) if puts else None
    st.cut_positions(to_seqno)
    st.flush()


def _cut_journal(core: Core, to_seqno: int) -> None:
    lay = core.layout
    core.journal.close()
    infos = list_segments(lay.journal)
    keep = infos[0]
    for s in infos:
        if s.first_seqno <= to_seqno + 1:
            keep = s
    cut = SEGMENT_HEADER_SIZE
    with SegmentView(keep) as view:
        for off, hdr in view.frames(tail=keep is infos[-1]):
            if hdr.seqno > to_seqno:
                cut = off
                break
            cut = off + hdr.total
    drop_after(lay.journal, to_seqno)  # columnar copies of the frames being cut (pipeline index)
    # Newest segment first, then the cut: after each step the journal is still a whole prefix of
    # itself ending at or after to_seqno, which a crash leaves for the next open to roll back again.
    # (Cutting first left a short segment followed by newer ones: records missing, no open possible.)
    for s in sorted((s for s in infos if s.index > keep.index), key=lambda s: s.index, reverse=True):
        _remove_segment(s.path)
    _truncate_segment(keep.path, cut)
    core.journal = JournalWriter(lay.journal, index=keep.index, path=keep.path, last_seqno=to_seqno,
                                 durability=core.journal.durability, segment_bytes=core.journal.segment_bytes)


def _remove_segment(path) -> None:
    path.unlink()
    fsync_dir(path.parent)


def _truncate_segment(path, size: int) -> None:  # a step of its own: the crash tests kill the process here
    truncate_file(path, size)


def _trim_info(core: Core, to_seqno: int) -> None:
    info = core.info
    info.cut_at(to_seqno)
    for num, st in info.streams.items():
        st.last_stream_seqno = core.stream_seqnos.get(num, st.last_stream_seqno)
        if st.history:
            st.history = [h for h in st.history if h.start_seqno <= st.last_stream_seqno + 1] or st.history[:1]
    core.seqno = to_seqno
    core.save_info()


def finish_interrupted(core: Core) -> RollbackReport | None:
    """On open: complete a rollback that a crash interrupted (its marker is still there)."""
    marker = core.layout.rollback_marker
    if not marker.exists():
        return None
    to = int(json.loads(marker.read_text())["to_seqno"])
    if core.seqno > to:
        return rollback(core, to, reason="completing an interrupted rollback")
    with core.lock:  # journal and store were already cut back: finish the instance file
        _trim_info(core, to)
        marker.unlink(missing_ok=True)
    return RollbackReport(core.name, to, to, 0, None, 0.0)
