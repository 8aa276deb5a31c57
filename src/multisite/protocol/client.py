"""The client protocol: applications talking to an instance server (``multisite.connect``).

Frames are ``u32 length | msgpack body``. A request is ``[id, op, args]``; the reply is
``[id, True, result]`` or ``[id, False, [code, message]]``. Ops: ``get``, ``items``, ``commit``
(a whole transaction's updates in one request), ``create_region``, ``info``, ``history``.
Sans-IO: ``FrameBuffer`` turns received bytes into bodies; sockets live in ``net``.
"""

from __future__ import annotations

import struct

import msgspec

from ..errors import RemoteProtocolError

LEN = struct.Struct("<I")
MAX_CLIENT_FRAME_BYTES = 64 * 1024 * 1024
OPS = ("get", "items", "commit", "create_region", "info", "history", "regions")

_enc = msgspec.msgpack.Encoder()


def encode(obj: object) -> bytes:
    body = _enc.encode(obj)
    return LEN.pack(len(body)) + body


class FrameBuffer:
    def __init__(self, max_frame_bytes: int = MAX_CLIENT_FRAME_BYTES):
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes) -> None:
        self._buf += data

    def __len__(self) -> int:
        """Bytes held: received and not yet taken as whole frames."""
        return len(self._buf)

    def next(self):
        """The next decoded body, or None if more bytes are needed."""
        if len(self._buf) < 4:
            return None
        (n,) = LEN.unpack_from(self._buf, 0)
        if n > self.max_frame_bytes:
            raise RemoteProtocolError(f"client frame of {n} bytes exceeds {self.max_frame_bytes}")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        try:
            return msgspec.msgpack.decode(body)
        except (msgspec.DecodeError, RecursionError) as e:  # RecursionError: nesting too deep to decode
            raise RemoteProtocolError(f"malformed client frame: {e}") from None
