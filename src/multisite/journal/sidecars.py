"""Columnar sidecars of journal frames: names, validity keys, and their removal.

The Spark pipeline keeps, beside the journal, columnar copies of runs of frames
(``journal/index/*.parquet``, written by ``multisite.pipeline``) so that reading a run again needs no
msgpack decoding. This module is the journal's side of that contract and needs no pyarrow: which
frames a sidecar covers and how to tell that it still matches the segment, so that whoever cuts or
removes segments (rollback, recovery, prune, fold) can drop the sidecars that no longer match.

A sidecar covers frames ``first..last`` of one segment, from byte ``start`` to the frame at
``last_offset``. Its name carries its validity key::

    <segment index>-<start>-<last_offset>-<first>-<last>-<segment header crc32><last payload crc32>.parquet

It is valid while the segment's header has the same CRC (a segment re-created under the same index
has another ``created`` time) and the frame at ``last_offset`` still parses with seqno ``last`` and
that payload CRC. Frames before it cannot change without the frame itself changing: segments are
append-only, and the only writers that cut them (rollback, torn-tail recovery) drop the sidecars
past the cut first. The check is the second line of defence, for a cut made some other way.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from .records import FRAME_HEADER_SIZE, parse_header
from .segments import SEGMENT_HEADER_SIZE

INDEX_DIR = "index"
SUFFIX = ".parquet"
_NAME = re.compile(r"^(\d{8})-(\d+)-(\d+)-(\d+)-(\d+)-([0-9a-f]{8})([0-9a-f]{8})\.parquet$")


@dataclass(frozen=True, order=True)
class Sidecar:
    segment: int
    start: int  # byte offset of the first frame
    last_offset: int  # byte offset of the last frame
    first: int  # seqno of the first frame
    last: int  # seqno of the last frame
    header_crc: int  # crc32 of the segment's 64-byte header
    last_crc: int  # payload crc32 of the last frame

    @property
    def name(self) -> str:
        return (f"{self.segment:08d}-{self.start}-{self.last_offset}-{self.first}-{self.last}-"
                f"{self.header_crc:08x}{self.last_crc:08x}{SUFFIX}")

    @classmethod
    def parse(cls, name: str) -> "Sidecar | None":
        m = _NAME.match(name)
        if m is None:
            return None
        g = m.groups()
        return cls(int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5], 16), int(g[6], 16))

    def matches(self, buf, size: int) -> int | None:
        """The byte offset just past the last frame if ``buf`` (the segment, ``size`` bytes) still
        holds what this sidecar was made from; else None."""
        if size < SEGMENT_HEADER_SIZE or size - self.last_offset < FRAME_HEADER_SIZE:
            return None
        if zlib.crc32(buf[:SEGMENT_HEADER_SIZE]) != self.header_crc:
            return None
        hdr = parse_header(buf, self.last_offset)
        if hdr is None or hdr.seqno != self.last or hdr.payload_crc != self.last_crc:
            return None
        end = self.last_offset + hdr.total
        return end if end <= size else None


def index_dir(journal_dir: Path) -> Path:
    return Path(journal_dir) / INDEX_DIR


def list_sidecars(journal_dir: Path) -> list[tuple[Sidecar, Path]]:
    """Every sidecar in the journal's index directory, by segment and offset (unknown files skipped)."""
    d = index_dir(journal_dir)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        s = Sidecar.parse(n)
        if s is not None:
            out.append((s, d / n))
    out.sort()
    return out


def drop_after(journal_dir: Path, seqno: int) -> int:
    """Remove the sidecars covering any seqno after ``seqno`` (before the journal is cut there)."""
    n = 0
    for s, p in list_sidecars(journal_dir):
        if s.last > seqno:
            p.unlink(missing_ok=True)
            n += 1
    return n


def drop_segments(journal_dir: Path, segments) -> int:
    """Remove the sidecars of the given segment indexes (segments being pruned or moved away)."""
    gone = set(segments)
    n = 0
    for s, p in list_sidecars(journal_dir):
        if s.segment in gone:
            p.unlink(missing_ok=True)
            n += 1
    return n
