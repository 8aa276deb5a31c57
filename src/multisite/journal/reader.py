"""Reading the journal: frames or decoded records in seqno order, from any seqno.

Readers follow the segment chain and check every frame they pass (CRC, seqno continuity). They read
the newest segment as a tail (a torn last frame ends the read, as recovery would cut it); every older
segment must be intact.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Iterator

import msgspec

from ..errors import JournalCorrupt, JournalGap
from .records import FrameRun, Record, decode_payload
from .segments import SegmentInfo, SegmentView, list_segments


def segments_from(infos: list[SegmentInfo], from_seqno: int) -> list[SegmentInfo]:
    """The segments that may hold ``from_seqno`` and later records."""
    firsts = [s.first_seqno for s in infos]
    i = max(0, bisect.bisect_right(firsts, from_seqno) - 1)
    return infos[i:]


def _chosen(journal_dir: Path, from_seqno: int, infos: list[SegmentInfo] | None) -> list[SegmentInfo]:
    """The segments to read from ``from_seqno`` on; JournalGap if it was pruned."""
    if infos is None:
        infos = list_segments(journal_dir)
    if infos and from_seqno < infos[0].first_seqno:
        raise JournalGap(f"seqno {from_seqno} is no longer in the journal at {journal_dir} (the oldest "
                         f"segment starts at {infos[0].first_seqno}); it was pruned")
    return segments_from(infos, from_seqno) if infos else []


def _past_end(info: SegmentInfo, off: int, seqno: int, end: int) -> JournalCorrupt:
    return JournalCorrupt(f"journal segment {info.path} offset {off}: seqno {seqno} is past {end}, where the "
                          f"next segment takes over", path=str(info.path), offset=off)


def _cut_short(info: SegmentInfo, last: int, end: int, size: int) -> JournalCorrupt:
    return JournalCorrupt(f"journal segment {info.path} ends at seqno {last} but the next segment starts at "
                          f"{end + 1}: records {last + 1}..{end} are missing (the sealed segment was cut short); "
                          f"restore it from a backup", path=str(info.path), offset=size)


def iter_frames(journal_dir: Path, from_seqno: int = 1, to_seqno: int | None = None,
                infos: list[SegmentInfo] | None = None, *, whole: bool = False,
                tail_checked: bool = False) -> Iterator[tuple[int, bytes]]:
    """Yield ``(seqno, payload)`` for every record in ``[from_seqno, to_seqno]``; with ``whole``,
    the whole frame (header and payload) instead of the payload, as Source Servers send it.
    ``tail_checked``: the newest segment's CRCs were just verified (see ``SegmentView.frames``)."""
    if infos is None:
        infos = list_segments(journal_dir)
    chosen = _chosen(journal_dir, from_seqno, infos)
    for k, info in enumerate(chosen):
        if to_seqno is not None and info.first_seqno > to_seqno:
            return
        sealed = k + 1 < len(chosen)
        # A sealed segment must end just before the next one starts: frames() checks continuity
        # inside a segment, this checks it across segments (a sealed segment cut at a frame boundary).
        end = chosen[k + 1].first_seqno - 1 if sealed else None
        with SegmentView(info) as view:
            last = info.first_seqno - 1
            for off, hdr in view.frames(tail=not sealed, checked=tail_checked and info is infos[-1]):
                last = hdr.seqno
                if end is not None and last > end:
                    raise _past_end(info, off, last, end)
                if hdr.seqno < from_seqno:
                    continue
                if to_seqno is not None and hdr.seqno > to_seqno:
                    return
                yield hdr.seqno, view.frame_bytes(off, hdr) if whole else view.payload(off, hdr)
            if end is not None and last != end:
                raise _cut_short(info, last, end, view.size)


def iter_runs(journal_dir: Path, from_seqno: int, max_bytes: int, to_seqno: int | None = None
              ) -> Iterator[FrameRun]:
    """Frames from ``from_seqno`` (to ``to_seqno``) as runs of about ``max_bytes`` (whole frames; a run
    never spans two segments), each one slice of its segment: what a Source Server catching up from
    the journal files sends, checked as ``iter_frames`` checks, without a copy per frame."""
    first, start, ends = from_seqno, 0, []
    for seqno, off, end, view in _frame_spans(journal_dir, from_seqno):
        if seqno is not None and to_seqno is not None and seqno > to_seqno:
            if ends:  # past the bound: the run ends here, and so does the iteration
                yield FrameRun(first, view.buf[start:start + ends[-1]], ends)
            return
        if seqno is None:  # the segment ends (its view still open): so does the run
            if ends:
                yield FrameRun(first, view.buf[start:start + ends[-1]], ends)
            ends = []
            continue
        if not ends:
            first, start = seqno, off
        ends.append(end - start)
        if ends[-1] >= max_bytes:
            yield FrameRun(first, view.buf[start:end], ends)
            ends = []


def _frame_spans(journal_dir: Path, from_seqno: int) -> Iterator[tuple[int | None, int, int, SegmentView]]:
    """``(seqno, offset, end, view)`` of each frame from ``from_seqno``, checked, then
    ``(None, 0, 0, view)`` at the end of each segment, its view still open."""
    chosen = _chosen(journal_dir, from_seqno, None)
    for k, info in enumerate(chosen):
        sealed = k + 1 < len(chosen)
        end_seqno = chosen[k + 1].first_seqno - 1 if sealed else None
        with SegmentView(info) as view:
            last = info.first_seqno - 1
            for off, hdr in view.frames(tail=not sealed):
                last = hdr.seqno
                if end_seqno is not None and last > end_seqno:
                    raise _past_end(info, off, last, end_seqno)
                if last >= from_seqno:
                    yield last, off, off + hdr.total, view
            if end_seqno is not None and last != end_seqno:
                raise _cut_short(info, last, end_seqno, view.size)
            yield None, 0, 0, view


def iter_records(journal_dir: Path, from_seqno: int = 1, to_seqno: int | None = None,
                 infos: list[SegmentInfo] | None = None, *, tail_checked: bool = False) -> Iterator[Record]:
    for seqno, payload in iter_frames(journal_dir, from_seqno, to_seqno, infos, tail_checked=tail_checked):
        yield _decode(payload, journal_dir, seqno)


def _decode(payload: bytes, journal_dir: Path, seqno: int) -> Record:
    """A record whose frame passed its CRCs yet does not decode (a broken writer, or damage the CRC
    missed) is JournalCorrupt naming it, not the decoder's error (found by fuzzing: it leaked)."""
    try:
        return decode_payload(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise JournalCorrupt(f"journal {journal_dir}: record {seqno} passed its checksums but is not a "
                             f"transaction record ({e})", path=str(journal_dir), offset=-1) from None
