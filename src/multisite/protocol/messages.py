"""Replication protocol messages and their framing (sans-IO: bytes in, messages out).

Every message travels as one frame::

    u32 length (of what follows) | u8 type | body

The body is msgpack of the message's struct (array-like). Type ``0x80 | t`` means the body is
zstd-compressed, one zstd frame per message. Type ``0x40 | t`` (only once both Hellos carry the flag
``zstd_stream``) means ``u32 decompressed length | zstd bytes``: one zstd stream per connection,
flushed at the end of each message, so that each batch is compressed with what the previous ones
taught the compressor (small batches at low rates compress as well as large ones); a ``TxnBatch``'s
body is then a packed batch (``packed.py``). The journal frames inside a ``TxnBatch`` are the
journal's own frames, byte for byte (rebuilt so by the receiver when packed), so their CRCs protect
them end to end. See docs/protocol.md.
"""

from __future__ import annotations

import struct
from enum import StrEnum
from typing import Union

import msgspec

from ..errors import FilterError, LocalProtocolError, ProtocolError, RemoteProtocolError

PROTOCOL_VERSION = 1
FRAME_PREFIX = struct.Struct("<IB")
COMPRESSED = 0x80
STREAMED = 0x40  # the body is the next piece of the connection's zstd stream (negotiated in the Hello)
STREAM_LENGTH = struct.Struct("<I")  # a streamed body's decompressed length, ahead of its zstd bytes
# What this version of the wire can do, in every Hello it sends; a peer without a flag (an older
# multisite) gets the older behaviour. ``zstd_stream``: streamed compression (STREAMED frames).
ZSTD_STREAM_FLAG = "zstd_stream"
CAPABILITIES: dict[str, bool] = {ZSTD_STREAM_FLAG: True}
MAX_FRAME_BYTES = 64 * 1024 * 1024
# Until streaming starts only Hello, Start and Error travel: a few history records. A peer nobody
# has vouched for yet must not make the other side hold MAX_FRAME_BYTES per connection.
HANDSHAKE_FRAME_BYTES = 1024 * 1024


class HistoryEntry(msgspec.Struct, array_like=True, frozen=True):
    start_seqno: int
    root_primary: str
    uid: int
    role: str = "originating"
    stream: int = 0
    stream_start: int = 0


class Hello(msgspec.Struct, array_like=True, tag=1):
    """Both sides, once, first: who I am and where my journal stands."""

    version: int
    name: str
    group: str
    supplementary: bool
    role: str
    seqno: int
    history: list[HistoryEntry]
    flags: dict[str, Union[bool, int, str]] = {}


class StreamEntry(msgspec.Struct, array_like=True, frozen=True):
    """SI: a stream a supplementary instance receives (1..15), its source group and that group's history."""

    stream: int
    source_group: str
    history: list[HistoryEntry]


class Start(msgspec.Struct, array_like=True, tag=2):
    """Source → receiver: the agreed restart point; records from ``from_seqno`` follow.

    ``history`` is the source's (the receiver records it as its own, or as the stream's history
    in SI mode); ``streams`` carries a supplementary source's SI streams to its BC standby."""

    from_seqno: int
    common_seqno: int
    history: list[HistoryEntry]
    streams: list[StreamEntry] = []


class TxnBatch(msgspec.Struct, array_like=True, tag=3):
    """Source → receiver: journal frames for seqnos ``first_seqno``..``last_seqno``, in order."""

    first_seqno: int
    last_seqno: int
    frames: bytes


class Heartbeat(msgspec.Struct, array_like=True, tag=4):
    seq: int
    sent_at: float
    source_seqno: int


class HeartbeatAck(msgspec.Struct, array_like=True, tag=5):
    """Receiver's answer to each heartbeat: the last seqno its Update Process applied."""

    seq: int
    sent_at: float
    applied_seqno: int
    received_seqno: int


class Xoff(msgspec.Struct, array_like=True, tag=6):
    """Receiver → source: stop sending; the receive pool passed its high-water mark."""

    received_seqno: int


class Xon(msgspec.Struct, array_like=True, tag=7):
    """Receiver → source: resume sending from ``from_seqno``."""

    from_seqno: int


class RefusalCode(StrEnum):
    """Every code an ``Error`` message carries (docs/protocol.md §9): one list that producers and
    comparers share instead of string literals. A ``StrEnum``: each member *is* its wire text, so
    it compares equal to the plain string a peer sends, prints as that text in logs and JSON, and
    encodes unchanged."""

    SAME_NAME = "SAME_NAME"
    WRONG_NAME = "WRONG_NAME"
    GROUP_MISMATCH = "GROUP_MISMATCH"
    SUPPLEMENTARY_MISMATCH = "SUPPLEMENTARY_MISMATCH"
    ROLLBACK_NEEDED = "ROLLBACK_NEEDED"
    BUSY = "BUSY"
    NO_FREE_STREAM = "NO_FREE_STREAM"
    FILTER = FilterError.code  # the receiver's filter failed on a batch (its message names the seqno)
    # A protocol failure travels with its exception's code (errors.py stays the one place it is named).
    PROTOCOL = ProtocolError.code
    LOCAL_PROTOCOL = LocalProtocolError.code
    REMOTE_PROTOCOL = RemoteProtocolError.code


class Error(msgspec.Struct, array_like=True, tag=8):
    """Either side: a refusal or failure with a stable code; the sender closes after it.

    ``code`` is a ``RefusalCode`` when sent; it decodes as a plain ``str`` (equal to its member), so
    that a code this version does not know still reads as an Error and not as a broken frame."""

    code: str
    message: str
    common_seqno: int = -1


Message = Union[Hello, Start, TxnBatch, Heartbeat, HeartbeatAck, Xoff, Xon, Error]
MESSAGE_TYPES: dict[int, type] = {c.__struct_config__.tag: c for c in Message.__args__}  # type: ignore[attr-defined]

_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(c) for t, c in MESSAGE_TYPES.items()}


def error_for(e: ProtocolError) -> Error:
    """The Error that tells the peer about a protocol failure before the connection closes."""
    return Error(RefusalCode(e.code), e.message)


def encode_message(msg: Message, *, compressor=None) -> bytes:
    t = type(msg).__struct_config__.tag
    body = _encoder.encode(msg)
    if compressor is not None and isinstance(msg, TxnBatch) and len(body) > 256:
        body = compressor.compress(body)
        t |= COMPRESSED
    return FRAME_PREFIX.pack(len(body) + 1, t) + body


def encode_streamed(t: int, body: bytes, cobj, flush_mode: int) -> bytes:
    """A STREAMED frame of type ``t``: ``body`` through the connection's zstd stream ``cobj``, flushed
    (``flush_mode``: a block flush) so that the receiver can decompress all of it now."""
    z = cobj.compress(body) + cobj.flush(flush_mode)
    return FRAME_PREFIX.pack(len(z) + 1 + STREAM_LENGTH.size, t | STREAMED) + STREAM_LENGTH.pack(len(body)) + z


def decode_body(t: int, body: bytes) -> Message:
    return _decoders[t].decode(body)
