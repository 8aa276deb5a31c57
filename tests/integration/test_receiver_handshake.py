"""A real receiver refuses an oversized first frame at once, says why, and logs it.

It used to wait for the whole 64 MiB body of a connection's first frame (buffering it) until the
handshake timeout, then closed without a word: a handful of such connections took gigabytes.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from multisite.protocol.messages import FRAME_PREFIX, HANDSHAKE_FRAME_BYTES
from multisite.testing.checks import log_text, wait_until


def read_frame(s: socket.socket) -> tuple[int, bytes]:
    buf = b""
    while len(buf) < 5 or len(buf) < 4 + struct.unpack_from("<I", buf)[0]:
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {len(buf)} bytes, with no Error"
        buf += chunk
    length, t = FRAME_PREFIX.unpack_from(buf)
    return t, buf[5:4 + length]


def test_an_oversized_first_frame_gets_an_error_naming_the_limit(cluster):
    b = cluster.instance("B")
    port = b.start_receiver()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(FRAME_PREFIX.pack(64 * 1024 * 1024, 1) + b"\0" * 4096)  # "a 64 MiB Hello follows"
        t, body = read_frame(s)
    assert t == 8  # Error
    tag, code, message = msgspec.msgpack.decode(body)[:3]  # array_like, tagged
    assert code == "REMOTE_PROTOCOL" and f"1..{HANDSHAKE_FRAME_BYTES + 1}" in message and "handshake" in message
    wait_until(lambda: "handshake's limit" in log_text(b.root, "receiver.log"), what="the refusal in the log")
    assert b.call("receiver.status")["state"] == "listening"
