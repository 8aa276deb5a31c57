"""The client listener against clients that send what they should not: each gets a clear error or is
bounded, and the other connections go on being served (``net.clients``, real sockets)."""

from __future__ import annotations

import logging
import socket

import msgspec

from multisite.errors import ConfigError
from multisite.net import clients
from multisite.protocol.client import LEN, encode


def _read_reply(s: socket.socket):
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (n,) = LEN.unpack(head)
    return msgspec.msgpack.decode(s.recv(n, socket.MSG_WAITALL))


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
