"""A streamed batch is bounded by the frame limit once its headers are rebuilt, not only before.

The receiver rebuilds a 20-byte journal frame header for every payload length a packed batch lists
(``protocol/packed.py``). A few hundred bytes of zstd can decompress to millions of zero lengths: without
a bound on what is rebuilt, the receiver spent seconds of its event loop and hundreds of MiB per batch
(21x the decompressed limit) before the checksum told it anything. A batch whose rebuilt frames pass the
connection's ``max_frame_bytes`` must be refused at once, whatever its checksum says, as the per-batch
path refuses a frame over the limit.
"""

from __future__ import annotations

import struct
import time
import zlib

import msgspec
import pytest
import zstandard

from multisite.errors import RemoteProtocolError
from multisite.protocol import packed
from multisite.protocol.connection import NEED_DATA, Connection, Role, State
from multisite.protocol.messages import CAPABILITIES, Hello, HistoryEntry, Start, TxnBatch, encode_streamed

HISTORY = [HistoryEntry(1, "A", 12345)]


def _streaming(max_frame_bytes: int) -> tuple[Connection, Connection]:
    src, rcv = Connection(Role.SOURCE, compress_level=3), Connection(Role.RECEIVER, max_frame_bytes=max_frame_bytes)
    _pump(src.send(Hello(1, "A", "default", False, "primary", 10, HISTORY, dict(CAPABILITIES))), rcv)
    _pump(rcv.send(Hello(1, "B", "default", False, "secondary", 0, HISTORY, dict(CAPABILITIES))), src)
    _pump(src.send(Start(1, 0, HISTORY)), rcv)
    assert src.state is rcv.state is State.STREAMING and rcv.streamed_compression
    return src, rcv


def _pump(data: bytes, to: Connection) -> None:
    to.receive_data(data)
    while to.next_event() is not NEED_DATA:
        pass


def _forged(first: int, n: int) -> bytes:
    """A packed batch of ``n`` empty payloads with the checksum a (hostile) source can compute."""
    crcs = b"".join(struct.pack("<I", zlib.crc32(struct.pack("<IQI", 0, s, 0))) for s in range(first, first + n))
    return msgspec.msgpack.encode(packed.PackedBatch([0] * n, zlib.crc32(crcs), b""))


def test_a_packed_batch_whose_rebuilt_frames_pass_the_frame_limit_is_refused():
    src, rcv = _streaming(max_frame_bytes=64 * 1024)
    body = _forged(1, 10_000)  # 10 KB decompressed, 200 KB of frames once rebuilt
    wire = encode_streamed(TxnBatch.__struct_config__.tag, body, src._cstream, zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    assert len(body) < rcv.max_frame_bytes
    rcv.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match="limit"):
        rcv.next_event()
    assert rcv.state is State.ERROR


def test_a_packed_batch_listing_millions_of_payloads_is_refused_quickly():
    """The default limit (64 MiB): a body of 4,000,000 empty payloads (4 MB, a few hundred bytes of
    zstd; 80 MB of frames once rebuilt) is refused before any header is rebuilt, not after seconds of work."""
    src, rcv = _streaming(max_frame_bytes=64 * 1024 * 1024)
    body = msgspec.msgpack.encode(packed.PackedBatch([0] * 4_000_000, 0, b""))
    wire = encode_streamed(TxnBatch.__struct_config__.tag, body, src._cstream, zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    rcv.receive_data(wire)
    t = time.process_time()
    with pytest.raises(RemoteProtocolError, match="limit|length <="):
        rcv.next_event()
    assert time.process_time() - t < 1.0
