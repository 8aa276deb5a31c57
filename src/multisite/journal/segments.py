"""Journal segment files: naming, the fixed header, and scanning frames out of a segment.

A segment is ``journal/NNNNNNNN.msj``: a 64-byte header, then frames (see ``records``). The header
names the segment's index, the seqno its first record has, and the previous segment (index and its
last seqno): the back pointer that lets a reader walk from any segment to older ones, as GT.M's
journal files do.

Scanning tells a torn tail from corruption: a bad frame at the end of the newest segment, with no
valid later record behind it, is a write the crash interrupted (cut off, reported). A bad frame
with a valid record after it, or a bad frame in a sealed segment, is corruption: ``JournalCorrupt``
naming the file and offset. In the newest segment, a frame header of zeros with nothing but zeros
after it is the end of the records: that space was preallocated (see ``writer``) and never written;
zeros with a valid record after them are a lost write, corruption like any other bad frame. (After
a power loss the lost write may be of records never acknowledged, with later unacknowledged ones
intact behind it: ``instance.repair`` shows that case to the operator and cuts it.) Sealed segments hold no zeros (the writer's last preallocation stops at the
segment size), so zeros there are corruption too.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import JournalCorrupt
from .records import FRAME_HEADER, FRAME_HEADER_SIZE, MAX_RECORD_BYTES, FrameHeader, parse_header, payload_ok

MAGIC = b"MSJSEG01"
VERSION = 1
_HDR = struct.Struct("<8sHHIQIQd")  # magic, version, flags, index, first_seqno, prev_index, prev_last, created
SEGMENT_HEADER_SIZE = 64
SETTLE_BYTES = 1 << 20  # the newest segment's last bytes whose payloads a header walk checks
SUFFIX = ".msj"


@dataclass(frozen=True)
class SegmentHeader:
    index: int
    first_seqno: int
    prev_index: int  # 0 = none
    prev_last_seqno: int
    created: float

    def pack(self) -> bytes:
        body = _HDR.pack(MAGIC, VERSION, 0, self.index, self.first_seqno, self.prev_index,
                         self.prev_last_seqno, self.created)
        body += struct.pack("<I", zlib.crc32(body))
        return body.ljust(SEGMENT_HEADER_SIZE, b"\0")


def segment_name(index: int) -> str:
    return f"{index:08d}{SUFFIX}"


def read_header(path: Path, data: bytes | memoryview | None = None) -> SegmentHeader:
    if data is None:
        with open(path, "rb") as f:
            data = f.read(SEGMENT_HEADER_SIZE)
    if len(data) < _HDR.size + 4:
        raise JournalCorrupt(f"journal segment {path} is shorter than its header ({len(data)} bytes)",
                             path=str(path), offset=0)
    fields = _HDR.unpack_from(data, 0)
    (crc,) = struct.unpack_from("<I", data, _HDR.size)
    if fields[0] != MAGIC or zlib.crc32(bytes(data[: _HDR.size])) != crc:
        raise JournalCorrupt(f"journal segment {path} has a damaged header (bad magic or checksum)",
                             path=str(path), offset=0)
    if fields[1] != VERSION:
        raise JournalCorrupt(f"journal segment {path} has version {fields[1]}, this multisite reads {VERSION}",
                             path=str(path), offset=0)
    return SegmentHeader(index=fields[3], first_seqno=fields[4], prev_index=fields[5],
                         prev_last_seqno=fields[6], created=fields[7])


@dataclass(frozen=True)
class SegmentInfo:
    path: Path
    header: SegmentHeader

    @property
    def index(self) -> int:
        return self.header.index

    @property
    def first_seqno(self) -> int:
        return self.header.first_seqno


_LIST_ATTEMPTS = 5  # listings of a live journal that lose a segment to a concurrent prune before it is an error


def _read_info(p: Path) -> SegmentInfo:
    info = SegmentInfo(p, read_header(p))
    if p.name != segment_name(info.index):  # the name is how the chain is followed: it must agree
        raise JournalCorrupt(f"journal segment {p} holds the header of segment {info.index} (its file would "
                             f"be {segment_name(info.index)})", path=str(p), offset=0)
    return info


def list_segments(journal_dir: Path) -> list[SegmentInfo]:
    """Every segment in index order, with the back-pointer chain checked.

    The journal may be live (backup, ``journal show``, source servers, prune beside the owner). A
    directory listing is not a snapshot: a large one takes several ``getdents`` calls, and a segment
    the writer creates meanwhile may be missed while a later one is listed. So the chain is followed
    by name (segment names follow from their indexes), not only from the listing; a segment that
    vanishes between the listing and the read of its header (pruned, or cut by a rollback) makes the
    listing start again."""
    for attempt in range(_LIST_ATTEMPTS):
        try:
            return _list_segments(journal_dir)
        except FileNotFoundError:
            if attempt + 1 == _LIST_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _list_segments(journal_dir: Path) -> list[SegmentInfo]:
    by_index: dict[int, SegmentInfo] = {}
    for p in sorted(journal_dir.glob("*" + SUFFIX)):
        info = _read_info(p)
        by_index[info.index] = info
    if not by_index:
        return []
    # Follow the back pointers from the newest listed segment, adding each previous segment the
    # listing missed that exists by name. The chain ends at a pruned (absent) segment; a listed
    # segment beyond a real hole stays apart, and the check below reports the hole.
    cur = by_index[max(by_index)]
    while 0 < cur.header.prev_index < cur.index:
        prev = cur.header.prev_index
        if prev not in by_index:
            p = journal_dir / segment_name(prev)
            if not p.exists():
                break
            by_index[prev] = _read_info(p)
        cur = by_index[prev]
    infos = [by_index[i] for i in sorted(by_index)]
    for prev, cur in zip(infos, infos[1:]):
        h = cur.header
        if h.prev_index != prev.index or h.first_seqno != h.prev_last_seqno + 1:
            raise JournalCorrupt(
                f"journal segment {cur.path} points back to segment {h.prev_index} ending at seqno "
                f"{h.prev_last_seqno}, but the previous segment is {prev.path}", path=str(cur.path), offset=0)
    return infos


ZERO_HEADER = bytes(FRAME_HEADER_SIZE)  # where the records of a preallocated segment end
_ZEROS = bytes(1024 * 1024)


@dataclass
class ScanResult:
    last_seqno: int  # seqno of the last valid record (first_seqno - 1 if none)
    valid_end: int  # offset just past the last valid record
    size: int  # file size
    records: int
    torn_bytes: int = 0  # bytes after valid_end, when they are not all zeros (a write that never completed)


class SegmentView:
    """A read-only map of one segment, iterated frame by frame with checks."""

    def __init__(self, info: SegmentInfo):
        self.info = info
        self._f = open(info.path, "rb")
        self.size = os.fstat(self._f.fileno()).st_size
        if self.size > SEGMENT_HEADER_SIZE:
            self.buf: bytes | mmap.mmap = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            self.buf = b""

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()
        self._f.close()

    def __enter__(self) -> "SegmentView":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def frames(self, *, tail: bool, scan: ScanResult | None = None, checked: bool = False, search: bool = True
               ) -> Iterator[tuple[int, FrameHeader]]:
        """Yield ``(offset, header)`` of each valid frame, checking CRCs and seqno continuity.

        ``tail`` says this is the newest segment, where a torn last frame is allowed: iteration then
        stops there, and ``scan`` (if given) records where the valid part ends. ``checked`` says the
        CRCs were verified moments ago by the same owner (recovery's scan of the newest segment,
        before its replay): only lengths and seqnos are checked then. ``search`` False (newest segment
        only): a damaged frame ends the iteration without looking for intact frames after it, as for
        a copy taken while the writer went on (see ``instance.maintenance.backup``).
        """
        buf, size, path = self.buf, self.size, self.info.path
        expect = self.info.first_seqno
        off = SEGMENT_HEADER_SIZE
        count = 0
        unpack, crc32, hsize = FRAME_HEADER.unpack, zlib.crc32, FRAME_HEADER_SIZE
        while off < size:  # the checks of records.parse_header/payload_ok, inlined: this is the hot loop
            bad = None
            if size - off < hsize:
                bad = "frame header is truncated"
            else:
                head = buf[off : off + hsize]  # one read, checked as read: a live writer may change the map
                length, seqno, pcrc, hcrc = unpack(head)
                end = off + hsize + length
                if checked and end <= size and seqno == expect:
                    pass  # safe: the caller reads no further than the scan that checked these (last_seqno)
                elif crc32(head[:16]) != hcrc or length > MAX_RECORD_BYTES:
                    bad = "frame header is damaged"
                elif end > size:
                    bad = f"frame of {length} bytes runs past the end of the file"
                elif crc32(buf[off + hsize : end]) != pcrc:
                    bad = "payload checksum mismatch"
                elif seqno != expect:
                    raise JournalCorrupt(f"journal segment {path} offset {off}: seqno {seqno} where {expect} "
                                         f"was expected", path=str(path), offset=off)
            if bad is not None:
                if tail and buf[off : off + hsize] == ZERO_HEADER and self.zeros_from(off):
                    break  # preallocated space, never written: the records end here (see journal.writer)
                if tail and (not search or not self._valid_frame_after(off, expect)):
                    break  # torn tail: the crash interrupted this write
                # An intact later frame. If the owner is live, this frame may simply have been written
                # since it was read (a write copies its bytes in order, so once a later frame is there,
                # this one is complete): read it again before calling it corruption.
                again = self.intact_frame(off, expect) if tail else None
                if again is None:
                    raise JournalCorrupt(f"journal segment {path} is corrupt at offset {off}: {bad}"
                                         + ("" if tail else " (in a sealed segment)"), path=str(path), offset=off)
                length, seqno, pcrc = again.length, again.seqno, again.payload_crc
                end = off + again.total
            yield off, FrameHeader(length, seqno, pcrc)
            off = end
            expect += 1
            count += 1
        if scan is not None:
            scan.last_seqno, scan.valid_end, scan.size, scan.records = expect - 1, off, size, count

    def headers(self, *, tail: bool, start: int = SEGMENT_HEADER_SIZE, seqno: int | None = None
                ) -> Iterator[tuple[int, FrameHeader]]:
        """Yield ``(offset, header)`` of each frame from ``start`` (whose seqno is ``seqno``), checking
        only header CRCs and seqno continuity: payloads are mostly not read, so this is cheap (planning
        readers, comparing seqno/CRC lists). In a sealed segment a damaged or cut header is
        ``JournalCorrupt``.

        In the newest segment (``tail``) the writer may be copying a record in while this walks: a
        damaged or cut header ends the walk, and so does a frame whose payload does not match its
        CRC yet (its header can be visible before the rest of it). A write copies its bytes in order,
        so only the last frames can be incomplete: the payloads of the frames in the last
        ``SETTLE_BYTES`` walked (and of the last frame, whatever its size) are checked before they
        are yielded; frames further back are yielded as they are found."""
        if not tail:
            yield from self._walk_headers(tail=False, start=start, seqno=seqno)
            return
        buf = self.buf
        held: deque[tuple[int, FrameHeader]] = deque()
        for off, hdr in self._walk_headers(tail=True, start=start, seqno=seqno):
            held.append((off, hdr))
            end = off + hdr.total
            while len(held) > 1 and held[0][0] + held[0][1].total <= end - SETTLE_BYTES:
                yield held.popleft()
        for off, hdr in held:
            if not payload_ok(hdr, buf, off):
                return
            yield off, hdr

    def _walk_headers(self, *, tail: bool, start: int, seqno: int | None) -> Iterator[tuple[int, FrameHeader]]:
        buf, size, path = self.buf, self.size, self.info.path
        expect = self.info.first_seqno if seqno is None else seqno
        off = start
        while off < size:
            hdr = parse_header(buf, off) if size - off >= FRAME_HEADER_SIZE else None
            if hdr is None or off + hdr.total > size:
                if tail:
                    return
                raise JournalCorrupt(f"journal segment {path} is corrupt at offset {off}: frame header is damaged "
                                     f"or truncated (in a sealed segment)", path=str(path), offset=off)
            if hdr.seqno != expect:
                raise JournalCorrupt(f"journal segment {path} offset {off}: seqno {hdr.seqno} where {expect} "
                                     f"was expected", path=str(path), offset=off)
            yield off, hdr
            off += hdr.total
            expect += 1

    def zeros_from(self, off: int) -> bool:
        """Is everything from ``off`` to the end of the file zeros? (Compared a MiB at a time.)"""
        buf, size = self.buf, self.size
        step = len(_ZEROS)
        for i in range(off, size, step):
            j = min(size, i + step)
            if buf[i:j] != _ZEROS[: j - i]:
                return False
        return True

    def intact_frame(self, off: int, seqno: int) -> FrameHeader | None:
        """The header of the frame at ``off`` if it is intact now and holds ``seqno``, else None."""
        if self.size - off < FRAME_HEADER_SIZE:
            return None
        hdr = parse_header(self.buf, off)
        if hdr is None or hdr.seqno != seqno or off + hdr.total > self.size or not payload_ok(hdr, self.buf, off):
            return None
        return hdr

    def _valid_frame_after(self, off: int, expect: int) -> bool:
        """Is there any intact frame for seqno ``expect``..``expect+4`` after ``off``?"""
        return self.intact_frame_after(off, expect) is not None

    def intact_frame_after(self, off: int, expect: int) -> tuple[int, int] | None:
        """``(offset, seqno)`` of the first intact frame for seqno ``expect``..``expect+4`` found
        after the damage at ``off`` (searched for by its seqno's bytes), or None."""
        buf = self.buf
        for s in range(expect, min(expect + 5, 1 << 64)):  # a seqno is a u64 (a header's may be its last)
            pat = struct.pack("<Q", s)
            pos = buf.find(pat, off + 1)
            while pos != -1:
                start = pos - 4
                if start > off and self.intact_frame(start, s) is not None:
                    return start, s
                pos = buf.find(pat, pos + 1)
        return None

    def payload(self, off: int, hdr: FrameHeader) -> bytes:
        start = off + FRAME_HEADER_SIZE
        return self.buf[start : start + hdr.length]

    def frame_bytes(self, off: int, hdr: FrameHeader) -> bytes:
        return self.buf[off : off + hdr.total]


def scan(info: SegmentInfo, *, tail: bool) -> ScanResult:
    """Check every frame of a segment; returns where its valid part ends."""
    res = ScanResult(info.first_seqno - 1, SEGMENT_HEADER_SIZE, 0, 0)
    with SegmentView(info) as view:
        for _ in view.frames(tail=tail, scan=res):
            pass
        res.size = view.size
        if not view.zeros_from(res.valid_end):
            res.torn_bytes = view.size - res.valid_end
    return res
