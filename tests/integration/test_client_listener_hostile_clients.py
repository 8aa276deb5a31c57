"""The client listener against clients that send what they should not: each gets a clear error or is
bounded, and the other connections go on being served (``server.clients``, real sockets)."""

from __future__ import annotations

import logging
import socket
import threading

from multisite.errors import ConfigError
from multisite.server import clients
from multisite.protocol.client import encode

from .test_client_listener import _read_reply


def _op(op, args):
    if op not in ("echo",):
        raise ConfigError(f"unknown client operation {op!r:.40}")
    return args


def test_a_request_whose_op_is_not_a_string_is_answered_and_the_connection_lives_on():
    """An op that is a list or a map (unhashable) used to raise out of the loop's read callback: the
    connection was dropped without a reply, and the requests pipelined behind it with it."""
    lis = clients.ClientListener("127.0.0.1", 0, _op, logging.getLogger("test"))
    try:
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            s.settimeout(30)
            s.sendall(encode([1, ["get"], {}]) + encode([2, {"op": 1}, {}]) + encode([3, "echo", {"a": 1}]))
            rid, ok, (code, msg) = _read_reply(s)
            assert (rid, ok, code) == (1, False, ConfigError.code) and "['get']" in msg
            rid, ok, (code, _msg) = _read_reply(s)
            assert (rid, ok, code) == (2, False, ConfigError.code)
            assert _read_reply(s) == [3, True, {"a": 1}]
    finally:
        lis.close()


def test_requests_pipelined_behind_a_slow_one_count_against_the_listeners_buffer_budget():
    """Whole frames read and waiting behind a request that runs (a hello's hash, a create_region) are
    held too: only partial frames used to count, so a connection pipelining 1024 frames of 64 MiB
    (64 KiB before it authenticates) behind one slow request held that much each, past the budget
    that keeps 256 connections from taking the instance's memory."""
    release = threading.Event()

    def op(op, args):
        if op == "slow":
            assert release.wait(30)
        return len(args.get("pad", b""))

    budget = 2 << 20
    lis = clients.ClientListener("127.0.0.1", 0, op, logging.getLogger("test"), buffer_bytes=budget)
    s = socket.create_connection(("127.0.0.1", lis.port))
    try:
        s.settimeout(30)
        pad = b"x" * (200 << 10)
        frames = encode([0, "slow", {}]) + b"".join(encode([i, "echo", {"pad": pad}]) for i in range(1, 41))

        def send() -> None:
            try:
                s.sendall(frames)
            except OSError:  # the server stopped reading this connection: what the test looks for
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        sender.join(3)  # all sent, or the server stopped reading this connection
        release.set()
        replies = []
        while len(replies) < 41 and (r := _read_reply(s)) is not None:
            replies.append(r)
            if r[0] is None:
                break
        assert replies[-1][0] is None and replies[-1][2][0] == "REMOTE_PROTOCOL", replies[-3:]
        assert "limit is 2 MiB" in replies[-1][2][1]
        assert len(replies) - 1 < 41
    finally:
        release.set()
        s.close()
        lis.close()

