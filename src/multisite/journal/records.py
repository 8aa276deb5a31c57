"""Journal records and their framing.

A transaction is one record: its seqno, stream tag, origin instance, commit time and every update
with its before-image (so that rollback can undo it). Records are msgpack (msgspec, array-like structs).

On disk each record is a frame::

    u32 payload_len | u64 seqno | u32 payload_crc | u32 header_crc | payload

``header_crc`` covers the first 16 bytes, so a damaged length is detected before it is trusted;
``payload_crc`` covers the payload. The seqno sits in the clear header so that readers can skip
records without decoding them. All integers are little-endian.
"""

from __future__ import annotations

import struct
import zlib
from typing import Optional, Union

import msgspec

SET, KILL, ZKILL = 1, 2, 3
OP_NAMES = {SET: "set", KILL: "kill", ZKILL: "zkill"}
OP_CODES = {v: k for k, v in OP_NAMES.items()}

FRAME_HEADER = struct.Struct("<IQII")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 20
_HEAD16 = struct.Struct("<IQI")
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a frame claiming more than this is corrupt

KeyT = tuple[Union[int, str], ...]


class Update(msgspec.Struct, array_like=True, gc=False):
    """One update. ``value`` and ``before`` are msgpack-encoded documents (None = absent).

    ``killed`` (kill only) lists every ``(key, encoded value)`` the kill removed, in key order:
    the kill's before-image.
    """

    op: int
    region: str
    key: KeyT
    value: Optional[bytes] = None
    before: Optional[bytes] = None
    killed: Optional[list[tuple[KeyT, bytes]]] = None


class Record(msgspec.Struct, array_like=True, gc=False):
    """One committed transaction as journaled."""

    seqno: int
    stream: int
    stream_seqno: int
    origin: str
    time: float
    updates: list[Update]


_encoder = msgspec.msgpack.Encoder()
record_decoder = msgspec.msgpack.Decoder(Record)  # decode_payload, without the call


def encode_payload(rec: Record) -> bytes:
    return _encoder.encode(rec)


def decode_payload(payload: bytes | memoryview) -> Record:
    return record_decoder.decode(payload)


def frame(seqno: int, payload: bytes) -> bytes:
    """Frame an encoded record for the journal (and for the wire: the same bytes travel)."""
    pcrc = zlib.crc32(payload)
    head = _HEAD16.pack(len(payload), seqno, pcrc)
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def encode_record(rec: Record) -> bytes:
    return frame(rec.seqno, encode_payload(rec))


class FrameHeader(msgspec.Struct, frozen=True):
    length: int
    seqno: int
    payload_crc: int

    @property
    def total(self) -> int:
        return FRAME_HEADER_SIZE + self.length


def parse_header(buf: bytes | memoryview, offset: int = 0) -> FrameHeader | None:
    """Parse a frame header at ``offset``; None if its checksum or length is wrong.

    The header is read once and checked on those bytes: a live segment (a map of it) can change
    between two reads, and a checksum taken on a second read would vouch for fields of the first."""
    head = bytes(buf[offset : offset + FRAME_HEADER_SIZE])
    length, seqno, pcrc, hcrc = FRAME_HEADER.unpack(head)
    if zlib.crc32(head[:16]) != hcrc or length > MAX_RECORD_BYTES:
        return None
    return FrameHeader(length, seqno, pcrc)


def payload_ok(hdr: FrameHeader, buf: bytes | memoryview, offset: int) -> bool:
    start = offset + FRAME_HEADER_SIZE
    return zlib.crc32(buf[start : start + hdr.length]) == hdr.payload_crc


class FrameRun:
    """Consecutive journal frames as they travel (a received batch): frame ``i`` holds seqno
    ``first_seqno + i`` and is ``data[ends[i - 1]:ends[i]]`` (from 0 for the first). Whoever makes
    one has checked every frame's CRCs and seqno (the protocol's batch check): the engine journals
    these very bytes, so the CRCs a primary wrote protect them end to end."""

    __slots__ = ("first_seqno", "data", "ends")

    def __init__(self, first_seqno: int, data: bytes, ends: list[int]):
        self.first_seqno, self.data, self.ends = first_seqno, data, ends

    @classmethod
    def of(cls, frames: list[tuple[int, bytes]]) -> "FrameRun":
        """The run of ``(seqno, frame)`` pairs with consecutive seqnos (as a source reads them)."""
        ends, size = [], 0
        for _, fr in frames:
            size += len(fr)
            ends.append(size)
        return cls(frames[0][0], b"".join(fr for _, fr in frames), ends)

    @property
    def last_seqno(self) -> int:
        return self.first_seqno + len(self.ends) - 1

    def __len__(self) -> int:
        return len(self.ends)

    def frames(self):
        """``(seqno, frame bytes)`` for each frame."""
        data, start, seqno = self.data, 0, self.first_seqno
        for end in self.ends:
            yield seqno, data[start:end]
            start, seqno = end, seqno + 1


def update_count(rec: Record) -> int:
    return len(rec.updates)
