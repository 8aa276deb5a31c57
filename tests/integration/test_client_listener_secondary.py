"""The client listener on a secondary: commits are not gathered there (the engine's own path decides),
yet a connection's pipelined commits still run one after another, in order (real sockets)."""

from __future__ import annotations

import socket
import threading

import multisite
from multisite.protocol.client import encode

from .test_client_listener import _gathering_listener, _read_reply


def test_pipelined_commits_to_a_secondarys_local_region_apply_in_order(tmp_path):
    """A secondary takes commits to its unreplicated regions. Its commits went to the worker pool but
    the connection's session counted them as gathered, not running, so the next one started at once
    in another worker: two pipelined sets of one key could land in the wrong order."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("local", replicated=False)
    db.update_info(lambda i: setattr(i, "role", "secondary"))
    second_done = threading.Event()
    calls = []
    real = db.commit_updates

    def commit_updates(ops):  # the first commit lets the second one go first, if it can start
        calls.append(ops)
        if len(calls) == 1:
            second_done.wait(2)
            return real(ops)
        try:
            return real(ops)
        finally:
            second_done.set()

    db.commit_updates = commit_updates
    lis = _gathering_listener(db)
    try:
        with socket.create_connection(("127.0.0.1", lis.port), timeout=30) as s:
            s.sendall(encode([1, "commit", {"ops": [[1, "local", ["k"], "first"]]}])
                      + encode([2, "commit", {"ops": [[1, "local", ["k"], "second"]]}])
                      + encode([3, "get", {"region": "local", "key": ["k"]}]))
            assert [_read_reply(s) for _ in range(3)] == [[1, True, 0], [2, True, 0], [3, True, "second"]]
    finally:
        lis.close()
        db.close()
