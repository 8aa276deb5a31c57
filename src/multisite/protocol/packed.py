"""A transaction batch packed for the compressed stream: journal frame headers left out, rebuilt exactly.

Each journal frame is ``u32 length | u64 seqno | u32 payload_crc | u32 header_crc | payload``. Of its
20 header bytes the receiver can rebuild all but the payload CRC from what it knows anyway (the seqno
follows from where the stream stands, the length travels as a small integer), and the 8 bytes
of CRCs are the part no compressor can shrink: at a few transactions per batch they are a third
of what zstd leaves. So a streamed ``TxnBatch`` travels as::

    [[payload length, ...], crc32 of the primary's header CRCs, payloads]

Its seqnos are not sent: a stream's batches are contiguous from the Start's seqno (both sides
count). The receiver frames every payload again under the seqnos it expects (the same bytes the
primary journaled: a secondary's journal stays byte-identical) and checks the CRC32 of the header
CRCs it computed against the one the primary sent. A header CRC covers the length, the seqno and
the payload's CRC, so the CRCs the primary wrote at commit still vouch for every payload and its
seqno, end to end (a lost or reordered batch fails the check), for 4 bytes per batch instead of 8
per transaction.

Sans-IO, no state: ``pack`` on the source, ``unpack`` on the receiver (which raises ``ValueError``
naming what is wrong; the connection turns that into a protocol error).
"""

from __future__ import annotations

import struct
import zlib
from typing import Annotated

import msgspec

from ..journal.records import FRAME_HEADER, FRAME_HEADER_SIZE, MAX_RECORD_BYTES
from .messages import MAX_FRAME_BYTES

_HEAD16 = struct.Struct("<IQI")
_U32 = struct.Struct("<I")


class PackedBatch(msgspec.Struct, array_like=True):
    # Each length is a 20-byte header rebuilt: refused from the array's size, before it is decoded.
    lengths: Annotated[list[int], msgspec.Meta(max_length=MAX_FRAME_BYTES // FRAME_HEADER_SIZE)]
    crcs_crc: int  # crc32 of the primary's header CRCs (u32 little-endian each, in order)
    payloads: bytes


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(PackedBatch)


def pack(first_seqno: int, frames: bytes) -> bytes:
    """The msgpack of the packed batch for journal frames ``frames`` (seqnos from ``first_seqno``)."""
    view, size, off = memoryview(frames), len(frames), 0
    lengths, crcs, payloads = [], bytearray(), []
    unpack, hsize = FRAME_HEADER.unpack_from, FRAME_HEADER_SIZE
    seqno = first_seqno
    while off < size:
        length, s, _, hcrc = unpack(frames, off)
        if s != seqno or off + hsize + length > size:
            raise ValueError(f"journal frame at byte {off} of the batch from seqno {first_seqno} holds seqno {s} "
                             f"(expected {seqno}) or overruns the batch")
        lengths.append(length)
        crcs += _U32.pack(hcrc)
        payloads.append(view[off + hsize:off + hsize + length])
        off += hsize + length
        seqno += 1
    return _encoder.encode(PackedBatch(lengths, zlib.crc32(crcs), b"".join(payloads)))


def unpack(first: int, body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> tuple[int, bytes, list[int]]:
    """(last seqno, the journal frames rebuilt, where each frame ends) of a packed batch that
    starts at seqno ``first``; ``ValueError`` if it is malformed or a payload or seqno differs from
    what the primary's CRCs say; ``msgspec.DecodeError``/``ValidationError`` if it is not a packed
    batch at all. The rebuilt frames may take at most ``max_bytes``."""
    p = _decoder.decode(body)
    lengths, data = p.lengths, p.payloads
    if not lengths:
        raise ValueError(f"the batch from seqno {first} carries no transaction")
    if len(data) + FRAME_HEADER_SIZE * len(lengths) > max_bytes:
        raise ValueError(f"the batch from seqno {first} holds {len(lengths)} frames of {len(data)} payload bytes: "
                         f"more than the frame limit of {max_bytes} bytes once framed")
    last = first + len(lengths) - 1
    where = f"batch {first}..{last}"
    if sum(lengths) != len(data) or min(lengths) < 0 or max(lengths) > MAX_RECORD_BYTES:
        raise ValueError(f"{where}: payload lengths add up to {sum(lengths)}, the payloads are {len(data)} bytes")
    view, off, seqno = memoryview(data), 0, first
    out, crcs, ends = bytearray(), bytearray(), []
    crc32, head16, u32 = zlib.crc32, _HEAD16.pack, _U32.pack
    for length in lengths:
        payload = view[off:off + length]
        pcrc = crc32(payload)
        head = head16(length, seqno, pcrc)
        hcrc = u32(crc32(head))
        out += head
        out += hcrc
        out += payload
        crcs += hcrc
        ends.append(len(out))
        off += length
        seqno += 1
    if crc32(crcs) != p.crcs_crc:
        raise ValueError(f"{where}: the frames' checksums differ from the primary's (a payload damaged in "
                         f"transit, or a batch lost before it)")
    return last, bytes(out), ends
