"""Log offsets: a byte position in the journal for every committed transaction.

Guaranteed message delivery (``delivery/``) orders transactions by the offset of their COMMIT, as SQL
Remote does with its transaction log offsets. A transaction's offset is where its frame ends::

    offset = segment index << 40 | byte position just past the frame in that segment

Segments are at most 1 TiB (``engine.create`` refuses more), so the position fits in the low 40 bits;
the segment index only grows (a switch makes the next index, a restart reopens the same file), and
within a segment frames only go forward: offsets only grow, across segment switches and restarts. An
offset names a point in the journal even after its segment is sealed, and reading "from an offset"
means from the first frame after that point: at the end of a segment that is the next segment's first
frame. The offset just past a segment's header (``start_offset``) is the offset before any record.

A rollback cuts the journal back, so offsets past the cut may later name other transactions: delivery
refuses to run across a rollback (see ``delivery/DESIGN.md``).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterator

from ..errors import JournalCorrupt, JournalGap
from .records import FRAME_HEADER, FRAME_HEADER_SIZE, parse_header
from .segments import SEGMENT_HEADER_SIZE, SegmentView, list_segments

POSITION_BITS = 40
POSITION_MASK = (1 << POSITION_BITS) - 1
OFFSET_DIGITS = 10  # the text form's least width, as the seed's 0000923357


def make_offset(index: int, position: int) -> int:
    return index << POSITION_BITS | position


def split_offset(offset: int) -> tuple[int, int]:
    """``(segment index, byte position)`` of an offset."""
    return offset >> POSITION_BITS, offset & POSITION_MASK


def format_offset(offset: int) -> str:
    """The one text form of an offset (files, messages, the CLI): zero-padded decimal."""
    return f"{offset:0{OFFSET_DIGITS}d}"


def start_offset(journal_dir: Path) -> int:
    """The offset before the oldest record still in the journal (just past its first segment's header)."""
    infos = list_segments(journal_dir)
    if not infos:
        raise JournalGap(f"{journal_dir} holds no journal segment")
    return make_offset(infos[0].index, SEGMENT_HEADER_SIZE)


def end_offset(journal_dir: Path) -> int:
    """The offset of the last committed transaction (``start_offset`` of the newest segment if empty)."""
    infos = list_segments(journal_dir)
    if not infos:
        raise JournalGap(f"{journal_dir} holds no journal segment")
    last = infos[-1]
    end = SEGMENT_HEADER_SIZE
    with SegmentView(last) as view:
        for off, hdr in view.headers(tail=True):
            end = off + hdr.total
    return make_offset(last.index, end)


def iter_commits(journal_dir: Path, after: int) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, seqno, payload)`` of every transaction committed after offset ``after``, in
    offset order, checking each frame's CRCs. ``after`` must be a transaction's offset or a segment's
    ``start_offset``; one inside a frame or in a pruned segment is an error naming it."""
    index, pos = split_offset(after)
    infos = list_segments(journal_dir)
    if not infos or index < infos[0].index:
        raise JournalGap(f"log offset {format_offset(after)} is in segment {index}, which is no longer in "
                         f"the journal at {journal_dir} (pruned); re-extract the subscriber")
    chosen = [i for i in infos if i.index >= index]
    for k, info in enumerate(chosen):
        tail = k + 1 == len(chosen)
        with SegmentView(info) as view:
            start = pos if info.index == index else SEGMENT_HEADER_SIZE
            if start < SEGMENT_HEADER_SIZE or start > max(view.size, SEGMENT_HEADER_SIZE):
                raise JournalCorrupt(f"log offset {format_offset(after)} is outside journal segment {info.path}",
                                     path=str(info.path), offset=start)
            if start >= view.size:
                continue
            seqno = _seqno_at(view, start, after, tail)
            if seqno is None:
                continue
            yield from _frames(view, info.index, start, seqno, tail)


def _frames(view: SegmentView, index: int, off: int, expect: int, tail: bool) -> Iterator[tuple[int, int, bytes]]:
    """The checked frames of one segment from ``off`` (the checks of ``SegmentView.frames``, inlined:
    this is the hot loop of a delivery scan). In the newest segment a frame that does not check ends
    the records (zeros never written, or a record being written); in a sealed one it is corruption."""
    buf, size, path = view.buf, view.size, view.info.path
    unpack, crc32, hsize, base = FRAME_HEADER.unpack, zlib.crc32, FRAME_HEADER_SIZE, index << POSITION_BITS
    while off < size:
        bad = None
        if size - off < hsize:
            bad = "frame header is truncated"
        else:
            head = buf[off:off + hsize]
            length, seqno, pcrc, hcrc = unpack(head)
            end = off + hsize + length
            if crc32(head[:16]) != hcrc:
                bad = "frame header is damaged"
            elif end > size:
                bad = "frame runs past the end of the file"
            else:
                payload = buf[off + hsize:end]
                if crc32(payload) != pcrc:
                    bad = "payload checksum mismatch"
                elif seqno != expect:
                    bad = f"seqno {seqno} where {expect} was expected"
        if bad is not None:
            if tail:
                return
            raise JournalCorrupt(f"journal segment {path} is corrupt at offset {off}: {bad} (in a sealed segment)",
                                 path=str(path), offset=off)
        yield base | end, seqno, payload
        off = end
        expect += 1


def _seqno_at(view: SegmentView, start: int, after: int, tail: bool) -> int | None:
    """The seqno of the frame at ``start`` (None at the records' end in the newest segment)."""
    if view.size - start < FRAME_HEADER_SIZE:
        if tail:
            return None
        raise JournalCorrupt(f"log offset {format_offset(after)} does not start a frame in {view.info.path}",
                             path=str(view.info.path), offset=start)
    hdr = parse_header(view.buf, start)
    if hdr is None:
        if tail:
            return None  # zeros past the last record, or a record being written
        raise JournalCorrupt(f"log offset {format_offset(after)} does not start a frame in {view.info.path}",
                             path=str(view.info.path), offset=start)
    return hdr.seqno
