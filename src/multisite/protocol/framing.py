"""Length-prefixed msgpack frames, sans-IO: the framing every multisite wire shares.

One frame is ``u32 length (of what follows) | u8 type | msgpack body``. ``Frames`` buffers the bytes
a peer sent and cuts them into messages with a decoder per type; a frame over the limit, an unknown
type, a malformed body or a close in the middle of a frame raises ``RemoteProtocolError`` naming
the wire (``what``). The wires keep their own states and who may send what (the grid's catalog wire,
the document servers' replicator wire); this is only the bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from ..errors import RemoteProtocolError

FRAME_PREFIX = struct.Struct("<IB")
NEED_DATA = object()  # no whole message yet


class Frames:
    def __init__(self, decoders: dict[int, msgspec.msgpack.Decoder], max_frame_bytes: int, what: str,
                 peer: str) -> None:
        self.decoders, self.max_frame_bytes, self.what, self.peer = decoders, max_frame_bytes, what, peer
        self._buf = bytearray()
        self._eof = False

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer; ``b""`` means the peer closed."""
        if data:
            self._buf += data
        else:
            self._eof = True

    def next_message(self) -> Any:
        """The next whole message, ``NEED_DATA``, or ``None`` once the peer closed cleanly."""
        buf = self._buf
        if len(buf) < FRAME_PREFIX.size:
            return self._end() if self._eof else NEED_DATA
        length, t = FRAME_PREFIX.unpack_from(buf)
        if length < 1 or length > self.max_frame_bytes:
            raise RemoteProtocolError(f"{self.what} frame of {length} bytes (at most {self.max_frame_bytes}): "
                                      f"not {self.peer}, or a broken one")
        if len(buf) < 4 + length:
            return self._end() if self._eof else NEED_DATA
        body = bytes(buf[FRAME_PREFIX.size:4 + length])
        del buf[:4 + length]
        dec = self.decoders.get(t)
        if dec is None:
            raise RemoteProtocolError(f"unknown {self.what} message type {t}")
        try:
            return dec.decode(body)
        # msgspec raises UnicodeDecodeError itself for a string that is not UTF-8, and RecursionError
        # for nesting too deep in a field of any type (found by fuzzing: both leaked out of the wire)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as e:
            raise RemoteProtocolError(f"malformed {self.what} message of type {t}: {e}") from None

    def _end(self) -> None:
        if self._buf:
            raise RemoteProtocolError(f"the peer closed in the middle of a frame ({len(self._buf)} bytes left)")
        return None


class FramedWire:
    """One end of a connection whose messages pass a state machine: the subclass has ``state``,
    ``peer`` (the other end's side), ``_frames`` and ``_step(sender, msg, error_type)``, and names its
    ``ERROR`` and ``CLOSED`` states; a protocol error leaves it in ``ERROR`` for good."""

    ERROR: Any
    CLOSED: Any

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer; ``b""`` means the peer closed."""
        self._frames.receive_data(data)

    def next_event(self) -> Any:
        """The next whole message, ``NEED_DATA``, or ``None`` once the peer closed cleanly."""
        if self.state is self.ERROR:
            raise RemoteProtocolError(f"the {self._frames.what} connection is broken")
        try:
            msg = self._frames.next_message()
        except RemoteProtocolError:
            self.state = self.ERROR
            raise
        if msg is NEED_DATA:
            return msg
        if msg is None:
            self.state = self.CLOSED
            return None
        self._step(self.peer, msg, RemoteProtocolError)
        return msg


def encode_frame(encoder: msgspec.msgpack.Encoder, msg: Any) -> bytes:
    body = encoder.encode(msg)
    return FRAME_PREFIX.pack(len(body) + 1, type(msg).__struct_config__.tag) + body
