"""The replication connection as a sans-IO state machine (in the manner of h11).

Feed it bytes with ``receive_data`` (``b""`` for end of stream), take messages out with
``next_event`` (``NEED_DATA`` when it needs more bytes), and turn messages into bytes with ``send``.
No sockets, no clock: the Source and Receiver Servers own the I/O; tests join two of these in memory
and fuzz the parser.

Legal transitions are one table per role. A message that is not legal in the current state, a
malformed or oversized frame, or a transaction batch whose journal frames are damaged or out of
order raises ``RemoteProtocolError`` (for what the peer sent) or ``LocalProtocolError`` (for what
we tried to send), and the connection moves to ``ERROR`` for good. A batch is checked whole before
it is returned, so nothing from a bad frame is ever applied.

Compression (``compress_level`` on the source): when both Hellos carry ``zstd_stream`` (every Hello
this version sends), batches travel as pieces of one zstd stream for the whole connection, flushed
per batch: a batch of one transaction is compressed with everything the earlier ones taught the
compressor, and its journal frames travel without their headers (``packed.py``: the receiver
rebuilds them, the primary's CRCs still checked end to end). With an older peer each batch is its
own zstd frame, as before. A streamed piece that does not decompress, or decompresses to another
length than it declares, fails the connection like any damaged frame (the stream cannot continue past it; the next connection starts a new one).
"""

from __future__ import annotations

import struct
import zlib
from enum import Enum

import msgspec
import zstandard

from ..errors import LocalProtocolError, RemoteProtocolError
from ..journal.records import FRAME_HEADER, FRAME_HEADER_SIZE, MAX_RECORD_BYTES, FrameRun
from .messages import (COMPRESSED, FRAME_PREFIX, HANDSHAKE_FRAME_BYTES, MAX_FRAME_BYTES, MESSAGE_TYPES,
                       PROTOCOL_VERSION, STREAM_LENGTH, STREAMED, ZSTD_STREAM_FLAG, Error, Heartbeat, HeartbeatAck, Hello, Message, Start,
                       TxnBatch, Xoff, Xon, decode_body, encode_message, encode_streamed)
from . import packed

TXN_BATCH = TxnBatch.__struct_config__.tag

# A streamed body is decompressed this many of its bytes at a time, its output counted after each:
# zstd can turn a few bytes into a 128 KiB block, so a hostile body overshoots the limit by at most
# ~STREAM_INPUT_SLICE_BYTES / 4 * 128 KiB (32 MiB) before it is refused, however large it is.
STREAM_INPUT_SLICE_BYTES = 1024
# The stream compresses with the parameters zstd's own tables give ``compress_level`` for inputs of
# this size (a 256 KiB window, matches from 4 bytes at level 3) rather than for unknown sizes (2 MiB,
# from 5 bytes): each piece is a batch of a few hundred bytes to 1 MiB, the stream's recent batches
# are what it resembles, and the per-connection context is smaller. 5% fewer bytes at 4 transactions
# a batch (docs/decisions.md).
STREAM_TUNING_BYTES = 256 * 1024
# The largest zstd window a streamed peer may declare (zstd's own default limit is 128 MiB, allocated
# per connection on a few bytes' say-so); ours stream with a 256 KiB one (STREAM_TUNING_BYTES).
MAX_STREAM_WINDOW_BYTES = 8 * 1024 * 1024


class State(Enum):
    IDLE = "idle"  # nothing exchanged yet
    HELLO_SENT = "hello-sent"  # source: sent Hello, awaiting the receiver's
    NEGOTIATING = "negotiating"  # source: has the receiver's Hello, must send Start or Error
    HELLO_RECEIVED = "hello-received"  # receiver: has the source's Hello, must answer Hello or Error
    WAIT_START = "wait-start"  # receiver: answered Hello, awaiting Start
    STREAMING = "streaming"
    CLOSED = "closed"
    ERROR = "error"


class Role(Enum):
    SOURCE = "source"
    RECEIVER = "receiver"


NEED_DATA = object()
S, R = Role.SOURCE, Role.RECEIVER
SEND, RECV = "send", "recv"

# (role, state, direction, message type) -> next state
TRANSITIONS: dict[tuple[Role, State, str, type], State] = {
    (S, State.IDLE, SEND, Hello): State.HELLO_SENT,
    (S, State.HELLO_SENT, RECV, Hello): State.NEGOTIATING,
    (S, State.NEGOTIATING, SEND, Start): State.STREAMING,
    (S, State.STREAMING, SEND, TxnBatch): State.STREAMING,
    (S, State.STREAMING, SEND, Heartbeat): State.STREAMING,
    (S, State.STREAMING, RECV, HeartbeatAck): State.STREAMING,
    (S, State.STREAMING, RECV, Xoff): State.STREAMING,
    (S, State.STREAMING, RECV, Xon): State.STREAMING,
    (R, State.IDLE, RECV, Hello): State.HELLO_RECEIVED,
    (R, State.HELLO_RECEIVED, SEND, Hello): State.WAIT_START,
    (R, State.WAIT_START, RECV, Start): State.STREAMING,
    (R, State.STREAMING, RECV, TxnBatch): State.STREAMING,
    (R, State.STREAMING, RECV, Heartbeat): State.STREAMING,
    (R, State.STREAMING, SEND, HeartbeatAck): State.STREAMING,
    (R, State.STREAMING, SEND, Xoff): State.STREAMING,
    (R, State.STREAMING, SEND, Xon): State.STREAMING,
}


class Connection:
    def __init__(self, role: Role, *, max_frame_bytes: int = MAX_FRAME_BYTES, compress_level: int = 0):
        self.role = role
        self.state = State.IDLE
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._eof = False
        self.compress_level = compress_level
        self._compressor = zstandard.ZstdCompressor(level=compress_level) if compress_level else None
        self._decompressor = zstandard.ZstdDecompressor()
        self._my_flags: dict = {}  # the flags of the Hello this side sent
        self._cstream = None  # source: the connection's zstd stream (negotiated)
        self._dstream = None  # receiver: the matching decompression stream (negotiated)
        self.next_seqno: int | None = None  # seqno the next batch must start at (from the Start on)
        self.peer_hello: Hello | None = None
        self.bytes_in = self.bytes_out = 0

    # -- state ---------------------------------------------------------------------------------
    def _transition(self, direction: str, msg: Message, mtype: type | None = None) -> None:
        if isinstance(msg, Error):  # either side may refuse or fail at any point
            self.state = State.CLOSED
            return
        mtype = mtype or type(msg)
        nxt = TRANSITIONS.get((self.role, self.state, direction, mtype))
        if nxt is None:
            what = f"{mtype.__name__} in state {self.state.value} ({self.role.value})"
            self.state = State.ERROR
            if direction == SEND:
                raise LocalProtocolError(f"cannot send {what}")
            raise RemoteProtocolError(f"peer sent {what}; closing the connection")
        self.state = nxt

    # -- sending -------------------------------------------------------------------------------
    def send(self, msg: Message) -> bytes:
        if self.state in (State.ERROR, State.CLOSED):
            what = self.state.value
            self.state = State.ERROR
            raise LocalProtocolError(f"connection is {what}; cannot send {type(msg).__name__}")
        if isinstance(msg, Hello) and msg.version != PROTOCOL_VERSION:
            self.state = State.ERROR
            raise LocalProtocolError(f"Hello must carry protocol version {PROTOCOL_VERSION}")
        self._transition(SEND, msg)
        if isinstance(msg, Hello):
            self._my_flags = msg.flags
            self._negotiate()
        elif isinstance(msg, Start):
            self.next_seqno = msg.from_seqno
        if self._cstream is not None and isinstance(msg, TxnBatch):
            try:
                if msg.first_seqno != self.next_seqno:
                    raise ValueError(f"the stream stands at seqno {self.next_seqno}")
                body = packed.pack(msg.first_seqno, msg.frames)
            except (ValueError, struct.error) as e:
                self.state = State.ERROR
                raise LocalProtocolError(f"cannot send {msg.first_seqno}..{msg.last_seqno}: {e}") from None
            self.next_seqno = msg.last_seqno + 1
            data = encode_streamed(TXN_BATCH, body, self._cstream, zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        else:
            data = encode_message(msg, compressor=self._compressor)
        self.bytes_out += len(data)
        return data

    # -- receiving -----------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
        else:
            self._buf += data
            self.bytes_in += len(data)

    def next_event(self):
        if self.state is State.ERROR:
            raise RemoteProtocolError("connection already failed")
        buf = self._buf
        if len(buf) < FRAME_PREFIX.size:
            return self._need_data()
        length, t = FRAME_PREFIX.unpack_from(buf, 0)
        limit = self._frame_limit()
        if length < 1 or length - 1 > limit:
            self._fail(f"frame length {length} is outside 1..{limit + 1}"
                       + ("" if self.state is State.STREAMING else " (the handshake's limit)"))
        if (t & ~(COMPRESSED | STREAMED)) not in MESSAGE_TYPES or (t & COMPRESSED and t & STREAMED):
            self._fail(f"unknown message type 0x{t:02x}")
        if t & STREAMED and self._dstream is None:
            self._fail(f"unknown message type 0x{t:02x} (a stream-compressed frame, but streamed compression "
                       f"was not agreed in the Hellos)")
        if len(buf) < 4 + length:
            return self._need_data()
        body = bytes(buf[FRAME_PREFIX.size : 4 + length])
        del buf[: 4 + length]
        if t & COMPRESSED:
            # zstandard ignores max_output_size when the frame declares its size, so check the
            # declared size first: a small body must not expand into gigabytes (a zstd bomb).
            try:
                size = zstandard.frame_content_size(body)
                if not 0 <= size <= limit:
                    self._fail(f"compressed body declares {'no' if size < 0 else size} decompressed size "
                               f"(limit {limit})")
                body = self._decompressor.decompress(body)
            except zstandard.ZstdError as e:
                self._fail(f"compressed body does not decompress: {e}")
            t &= ~COMPRESSED
        elif t & STREAMED:
            body = self._unstream(body, limit)
            t &= ~STREAMED
            if t == TXN_BATCH:
                return self._packed_batch(body)
        try:
            msg = decode_body(t, body)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
            # msgspec raises UnicodeDecodeError itself for a string that is not UTF-8
            self._fail(f"malformed {MESSAGE_TYPES[t].__name__} message: {e}")
        self._transition(RECV, msg)
        return self._check(msg)

    def _negotiate(self) -> None:
        """Both Hellos known: streamed compression if both sides offer it (and, on the source, a level
        is set). Called when the second of the two Hellos passes."""
        if self.peer_hello is None or not (self._my_flags.get(ZSTD_STREAM_FLAG)
                                           and self.peer_hello.flags.get(ZSTD_STREAM_FLAG)):
            return
        if self.role is Role.SOURCE and self.compress_level:
            params = zstandard.ZstdCompressionParameters.from_level(self.compress_level,
                                                                     source_size=STREAM_TUNING_BYTES)
            self._cstream = zstandard.ZstdCompressor(compression_params=params).compressobj()
        elif self.role is Role.RECEIVER:
            self._dstream = zstandard.ZstdDecompressor(max_window_size=MAX_STREAM_WINDOW_BYTES).decompressobj()

    @property
    def streamed_compression(self) -> bool:
        """Batches go (source) or may come (receiver) as pieces of one zstd stream."""
        return self._cstream is not None or self._dstream is not None

    def _unstream(self, body: bytes, limit: int) -> bytes:
        """The next piece of the connection's zstd stream, decompressed and checked against the
        length it declares (bounded: see STREAM_INPUT_SLICE_BYTES)."""
        if len(body) < STREAM_LENGTH.size:
            self._fail(f"stream-compressed body of {len(body)} bytes has no length")
        (size,) = STREAM_LENGTH.unpack_from(body, 0)
        if size > limit:
            self._fail(f"stream-compressed body declares {size} decompressed bytes (limit {limit})")
        out, got, view = [], 0, memoryview(body)
        try:
            for i in range(STREAM_LENGTH.size, len(body), STREAM_INPUT_SLICE_BYTES):
                piece = self._dstream.decompress(view[i:i + STREAM_INPUT_SLICE_BYTES])
                got += len(piece)
                if got > size:
                    self._fail(f"stream-compressed body decompresses past the {size} bytes it declares")
                out.append(piece)
        except zstandard.ZstdError as e:
            limit_hit = "memory" in str(e) or "window" in str(e).lower()
            self._fail(f"stream-compressed body does not decompress: {e}" + (
                f" (its zstd window is larger than the {MAX_STREAM_WINDOW_BYTES} bytes allowed)" if limit_hit else ""))
        if got != size:
            self._fail(f"stream-compressed body decompresses to {got} bytes, not the {size} it declares "
                       f"(truncated or damaged)")
        return out[0] if len(out) == 1 else b"".join(out)

    def _packed_batch(self, body: bytes) -> CheckedTxnBatch:
        """A streamed batch: its journal frames rebuilt and checked (``packed.unpack``), its seqnos
        continuing the stream."""
        first = self.next_seqno
        if first is None:  # cannot be: a batch is legal only once streaming, after the Start
            self._fail("a streamed batch before the Start")
        try:
            last, data, ends = packed.unpack(first, body, self.max_frame_bytes)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
            self._fail(f"malformed TxnBatch message: {e}")
        except ValueError as e:
            self._fail(str(e))
        msg = CheckedTxnBatch(first, last, data, ends)
        self._transition(RECV, msg, TxnBatch)
        self.next_seqno = last + 1
        return msg

    def _frame_limit(self) -> int:
        """Largest body accepted now: ``max_frame_bytes`` once streaming, far less before (see
        HANDSHAKE_FRAME_BYTES): an unknown peer's first frame cannot make us buffer 64 MiB."""
        if self.state is State.STREAMING:
            return self.max_frame_bytes
        return min(self.max_frame_bytes, HANDSHAKE_FRAME_BYTES)

    def pending(self) -> tuple[int, int] | None:
        """The frame being received: ``(its declared size, bytes of it received)``, or None."""
        if len(self._buf) < FRAME_PREFIX.size:
            return None
        return 4 + FRAME_PREFIX.unpack_from(self._buf, 0)[0], len(self._buf)

    def _need_data(self):
        if self._eof:
            if self._buf:
                self._fail(f"connection closed in the middle of a frame ({len(self._buf)} bytes pending)")
            self.state = State.CLOSED
            return State.CLOSED
        return NEED_DATA

    def _fail(self, why: str) -> None:
        self.state = State.ERROR
        raise RemoteProtocolError(why)

    def _check(self, msg: Message) -> Message:
        if isinstance(msg, Hello):
            if msg.version != PROTOCOL_VERSION:
                self._fail(f"peer speaks protocol version {msg.version}, this multisite speaks {PROTOCOL_VERSION}")
            self.peer_hello = msg
            self._negotiate()
        elif isinstance(msg, Start):
            if msg.from_seqno < 1:
                self._fail(f"Start from seqno {msg.from_seqno}")
            self.next_seqno = msg.from_seqno
        elif isinstance(msg, TxnBatch):
            return self._check_batch(msg)
        elif isinstance(msg, Xon) and msg.from_seqno < 1:
            self._fail(f"Xon from seqno {msg.from_seqno}")
        return msg

    def _check_batch(self, b: TxnBatch) -> CheckedTxnBatch:
        """Every journal frame intact, seqnos contiguous from where the stream stands; the batch
        with where each frame ends, so that nothing downstream parses it again."""
        data, off, expect = b.frames, 0, b.first_seqno
        if self.next_seqno is not None and b.first_seqno != self.next_seqno:
            self._fail(f"batch starts at seqno {b.first_seqno}, expected {self.next_seqno}")
        view, size, ends = memoryview(data), len(data), []
        unpack, crc32, hsize = FRAME_HEADER.unpack_from, zlib.crc32, FRAME_HEADER_SIZE
        while off < size:  # the checks of records.parse_header/payload_ok, inlined: the receive path's loop
            if size - off < hsize:
                self._fail(f"batch {b.first_seqno}..{b.last_seqno}: truncated journal frame at byte {off}")
            length, seqno, pcrc, hcrc = unpack(data, off)
            end = off + hsize + length
            if crc32(view[off:off + 16]) != hcrc or length > MAX_RECORD_BYTES or end > size:
                self._fail(f"batch {b.first_seqno}..{b.last_seqno}: damaged journal frame header at byte {off}")
            if crc32(view[off + hsize:end]) != pcrc:
                self._fail(f"batch {b.first_seqno}..{b.last_seqno}: checksum mismatch in seqno {seqno}")
            if seqno != expect:
                self._fail(f"batch {b.first_seqno}..{b.last_seqno}: seqno {seqno} where {expect} was expected")
            ends.append(end)
            off = end
            expect += 1
        if expect - 1 != b.last_seqno or expect == b.first_seqno:
            self._fail(f"batch claims seqnos {b.first_seqno}..{b.last_seqno} but holds "
                       f"{b.first_seqno}..{expect - 1}")
        self.next_seqno = expect
        return CheckedTxnBatch(b.first_seqno, b.last_seqno, data, ends)


class CheckedTxnBatch(TxnBatch):
    """A ``TxnBatch`` as ``next_event`` returns it: checked whole, with the end offset of each
    journal frame in ``frames`` (never sent: the receiving side makes it)."""

    ends: list[int] = []

    def __eq__(self, other: object) -> bool:  # equal to the batch that was sent: ends are derived
        if isinstance(other, TxnBatch):
            return (self.first_seqno, self.last_seqno, self.frames) == \
                (other.first_seqno, other.last_seqno, other.frames)
        return NotImplemented

    def __ne__(self, other: object) -> bool:  # else the Struct's own != (fields and type) answers
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def run(self) -> FrameRun:
        """The batch's frames as the engine applies them."""
        return FrameRun(self.first_seqno, self.frames, self.ends)
