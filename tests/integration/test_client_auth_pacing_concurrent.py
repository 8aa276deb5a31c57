"""Brute-force pacing holds when the guesses come at once, over many connections from one address
(real instance server process, real Argon2id hashes)."""

from __future__ import annotations

import socket

import msgspec

import multisite
from multisite.instance.users import add_user
from multisite.server.process import start_server, stop_server
from multisite.protocol.auth import PacingPolicy
from multisite.protocol.client import LEN, encode


def test_guesses_sent_at_once_on_many_connections_are_paced_as_if_sent_one_after_another(tmp_path):
    """Each hello checked the pacer's wait before its hash was verified, in one of the listener's
    worker threads: guesses running at once all passed the check before any failure was counted, so
    16 guesses at once had 7 verified where the pacing allows 4 (and 4 per wait, not 1, later on)."""
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    add_user(root, "boss", "admin", "boss-pass")
    info = start_server(root, "127.0.0.1:0")
    try:
        socks = [socket.create_connection(("127.0.0.1", info["client_port"]), timeout=60) for _ in range(16)]
        for i, s in enumerate(socks):
            s.sendall(encode([1, "hello", {"user": "boss", "password": f"guess-{i}"}]))
        codes = []
        for s in socks:
            (n,) = LEN.unpack(s.recv(4, socket.MSG_WAITALL))
            codes.append(msgspec.msgpack.decode(s.recv(n, socket.MSG_WAITALL))[2][0])
            s.close()
        allowed = PacingPolicy().free_failures + 1  # the next one waits first_delay_s (1 s): far longer
        assert codes.count("AUTHENTICATION_FAILED") == allowed, codes
        assert codes.count("AUTHENTICATION_PACED") == 16 - allowed
    finally:
        stop_server(root)
