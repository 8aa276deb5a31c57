"""The instance server process (``server.instance``), its client listener, control socket and client API under
bad input: each gets a clear error, nothing is lost, and the server and the connection live on (real
processes and sockets)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import msgspec
import pytest

import multisite
from multisite.server.process import start_server, stop_server
from multisite.server import clients
from multisite.net import control
from multisite.protocol.client import LEN, FrameBuffer, encode


def _read_reply(sock: socket.socket):
    sock.settimeout(30)
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None  # closed
    (n,) = LEN.unpack(head)
    return msgspec.msgpack.decode(sock.recv(n, socket.MSG_WAITALL))


def _ask(sock: socket.socket, req: list):
    sock.sendall(encode(req))
    return _read_reply(sock)


@pytest.fixture
def server(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    info = start_server(root, "127.0.0.1:0")
    yield root, info["client_port"]
    if control.is_running(root):
        stop_server(root)


def test_a_commit_with_an_unknown_opcode_or_mistyped_arguments_gets_an_error_and_changes_nothing(server):
    root, port = server
    with multisite.connect(f"127.0.0.1:{port}") as db:
        db.create_region("r")
        db.set("r", ("k",), "kept")
        with socket.create_connection(("127.0.0.1", port)) as s:
            # An opcode that is none of set/kill/zkill was applied as a zkill: the key was deleted.
            for rid, opc in ((1, 99), (2, "1"), (3, None)):
                rep = _ask(s, [rid, "commit", {"ops": [[opc, "r", ["k"], None]]}])
                assert rep[:2] == [rid, False] and rep[2][0] == "CONFIG" and "opcode" in rep[2][1], rep
            # Arguments of the wrong type: an error reply each, not a dead connection.
            bad = [["items", {"region": "r", "limit": 2**64 - 1}, "limit"],  # OverflowError in SQLite
                   ["create_region", {"name": "x", "schema": {"a": 1}}, "schema"],  # sqlite3.ProgrammingError
                   ["create_region", {"name": "y", "replicated": 5}, "replicated"],
                   ["get", {"region": "r", "key": {"k": 1}}, "key"],  # a dict read as the tuple of its keys
                   ["commit", {"ops": [[1, ["r"], ["k"], 1]]}, "region"]]
            for rid, (op, args, what) in enumerate(bad, 10):
                rep = _ask(s, [rid, op, args])
                assert rep is not None, f"{op} {args}: the server closed the connection"
                assert rep[:2] == [rid, False] and what in rep[2][1], rep
            assert _ask(s, [99, "get", {"region": "r", "key": ["k"]}]) == [99, True, "kept"]
        assert db.get("r", ("k",)) == "kept" and db.seqno == 1 and db.regions() == {"r": True}
    stop_server(root)
    assert "Traceback" not in (root / "log" / "server.out").read_text()
    with multisite.open(root) as emb:
        assert emb.seqno == 1 and emb.get("r", ("k",)) == "kept"


def _listener(op):
    return clients.ClientListener("127.0.0.1", 0, op, logging.getLogger("test"))


def test_a_request_that_fails_unexpectedly_is_answered_and_the_connection_lives():
    def op(name, args):
        if name == "boom":
            raise RuntimeError("a bug")  # OverflowError, sqlite3 errors...: not a MultisiteError
        return name

    lis = _listener(op)
    try:
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            rid, ok, (code, msg) = _ask(s, [1, "boom", {}])
            assert (rid, ok, code) == (1, False, "SERVER") and "RuntimeError: a bug" in msg
            assert _ask(s, [2, "ping", {}]) == [2, True, "ping"]
    finally:
        lis.close()


def test_an_unreadable_frame_gets_an_error_naming_it_before_the_connection_closes():
    lis = _listener(lambda name, args: name)
    try:
        deep = msgspec.msgpack.encode(1)
        for _ in range(100_000):  # nesting too deep to decode: RecursionError, not a DecodeError
            deep = b"\x91" + deep
        for body, what in ((deep, "malformed client frame"), (b"\xc1", "malformed client frame")):
            with socket.create_connection(("127.0.0.1", lis.port)) as s:
                s.sendall(LEN.pack(len(body)) + body)
                rep = _read_reply(s)
                assert rep is not None and rep[:2] == [None, False], rep
                assert rep[2][0] == "REMOTE_PROTOCOL" and what in rep[2][1]
                assert s.recv(10) == b""  # then closed
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            s.sendall(LEN.pack(2**31))
            rep = _read_reply(s)
            assert rep[2][0] == "REMOTE_PROTOCOL" and "exceeds" in rep[2][1]
    finally:
        lis.close()


def test_closing_the_listener_still_answers_the_request_in_flight():
    """`server stop` while a client commits: the commit finishes and its reply reaches the client,
    instead of a commit made durable reported as a lost connection."""
    started = threading.Event()

    def op(name, args):
        started.set()
        deadline = time.monotonic() + 30
        while not lis._closing and time.monotonic() < deadline:  # the listener is closing while this runs
            time.sleep(0.005)
        assert lis._closing
        time.sleep(0.2)
        return "done"

    lis = _listener(op)
    with socket.create_connection(("127.0.0.1", lis.port)) as s:
        s.sendall(encode([1, "commit", {}]))
        assert started.wait(30)
        closer = threading.Thread(target=lis.close)
        closer.start()
        assert _read_reply(s) == [1, True, "done"]
        assert s.recv(10) == b""  # and then the connection ends
        closer.join(30)
        assert not closer.is_alive()


def test_after_a_timeout_a_connection_never_hands_one_call_the_reply_of_another():
    srv = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def fake_server() -> None:
        conn, _ = srv.accept()
        fb = FrameBuffer()
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                fb.feed(data)
                while (req := fb.next()) is not None:
                    if req[0] == 1:
                        release.wait(30)  # answers the first request only after the client gave up on it
                    conn.sendall(encode([req[0], True, f"reply to {req[1]}"]))

    th = threading.Thread(target=fake_server, daemon=True)
    th.start()
    db = multisite.connect(f"127.0.0.1:{srv.getsockname()[1]}", timeout=0.3)
    with pytest.raises(multisite.ConnectionLost, match="timed out"):
        db._call("commit", ops=[])
    release.set()
    with pytest.raises(multisite.ConnectionLost, match="lost earlier.*'commit' took effect is unknown"):
        db._call("get", region="r", key=["x"])  # was: returned "reply to commit"
    db.close()
    srv.close()


def test_a_request_over_the_wire_limit_is_refused_by_the_client_with_the_reason(server):
    root, port = server
    with multisite.connect(f"127.0.0.1:{port}") as db:
        db.create_region("r")
        with pytest.raises(multisite.TransactionError, match="exceeds the client protocol's limit"):
            db.set("r", ("big",), b"x" * (65 * 1024 * 1024))  # was: ConnectionLost, connection reset
        assert db.set("r", ("small",), 1) == 1  # the connection is still usable
        assert db.get("r", ("big",)) is None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_the_control_socket_refuses_another_user(server):
    root, _port = server
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user on the same machine, asking the server to shut down
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(30)
            s.connect(control.control_address(root))
            s.sendall(b'{"op": "shutdown", "args": {}}\n')
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
            os.write(w, reply)
        finally:
            os._exit(0)
    os.close(w)
    reply = b""
    while chunk := os.read(r, 65536):
        reply += chunk
    os.close(r)
    os.waitpid(pid, 0)
    rep = json.loads(reply)
    assert rep["ok"] is False and "refused" in rep["error"] and "uid 65534" in rep["error"]
    assert control.is_running(root)
    assert control.call(root, "ping")["pid"]  # its own user still controls it
    assert "uid 65534 refused" in (root / "log" / "server.log").read_text()


def test_start_on_a_port_in_use_fails_clearly_every_time(tmp_path):
    root = multisite.create(tmp_path / "A", name="A")
    busy = socket.create_server(("127.0.0.1", 0))
    addr = f"127.0.0.1:{busy.getsockname()[1]}"
    try:
        for _ in range(8):  # was: now and then ConnectionResetError from the CLI, a server dying mid-ping
            with pytest.raises(multisite.errors.ServerError, match=f"cannot listen for clients on {addr}"):
                start_server(root, addr)
        assert f"cannot listen for clients on {addr}" in (root / "log" / "server.log").read_text()
    finally:
        busy.close()
    info = start_server(root, "127.0.0.1:0")  # and the instance is fine
    assert info["pid"] and info["client_port"]
    stop_server(root)


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1"])
def test_server_stop_with_a_timeout_that_is_not_a_duration_says_so_and_leaves_the_server_up(server, timeout):
    from click.testing import CliRunner

    from multisite.cli.main import cli

    root, _port = server
    res = CliRunner().invoke(cli, ["server", "stop", str(root), "--timeout", timeout])
    assert res.exit_code != 0 and "--timeout" in res.output, res.output  # was: ValueError, OverflowError
    assert control.is_running(root)
    with pytest.raises(multisite.errors.ConfigError, match="timeout_s"):
        control.call(root, "shutdown", timeout_s=float(timeout))
    assert control.is_running(root)


def test_a_remote_transaction_behaves_as_an_embedded_one_and_never_drops_an_update(server):
    root, port = server
    with multisite.connect(f"127.0.0.1:{port}") as db:
        db.create_region("r")
        # db.set inside a transaction: the embedded engine refuses it; remotely it was committed at once,
        # on its own, outside the transaction that the application believed atomic.
        with pytest.raises(multisite.TransactionError, match="would nest transactions"):
            with db.transaction() as tx:
                tx.set("r", ("a",), 1)
                db.set("r", ("b",), 1)
        assert db.seqno == 0 and db.get("r", ("b",)) is None
        # An update to a transaction that has ended: remotely it was appended and never sent.
        with db.transaction() as tx:
            tx.set("r", ("c",), 1)
        assert tx.seqno == 1
        with pytest.raises(multisite.TransactionError, match="transaction is committed"):
            tx.set("r", ("d",), 1)
        with pytest.raises(multisite.TransactionError, match="already committed"):
            tx.commit()
        assert db.get("r", ("d",)) is None and db.seqno == 1
        with pytest.raises(multisite.TransactionError, match="transaction is new"):
            db.transaction().set("r", ("e",), 1)
    stop_server(root)
    with multisite.open(root) as emb:  # the same rules, embedded
        with pytest.raises(multisite.TransactionError, match="would nest transactions"):
            with emb.transaction():
                emb.set("r", ("b",), 1)
        with pytest.raises(multisite.TransactionError, match="transaction is new"):
            emb.transaction().set("r", ("e",), 1)


def test_request_bytes_held_by_all_connections_have_a_budget_that_a_full_frame_frees():
    """Connections that each send part of a large frame hold its bytes; past the listener's budget
    the connection that would grow it gets an error naming the limit and is closed, the others go
    on, and the bytes of frames taken whole (or of closed connections) are given back."""
    lis = clients.ClientListener("127.0.0.1", 0, lambda name, args: len(args.get("pad", "")),
                                 logging.getLogger("test"), buffer_bytes=3 << 20)
    try:
        body = msgspec.msgpack.encode([1, "echo", {"pad": "x" * (2 << 20)}])  # a 2 MiB frame
        a = socket.create_connection(("127.0.0.1", lis.port))
        b = socket.create_connection(("127.0.0.1", lis.port))
        a.sendall(LEN.pack(len(body)) + body[: 1 << 20])  # A holds 1 MiB
        b.sendall(LEN.pack(len(body)) + body[: (1 << 20) + 4096])
        deadline = time.monotonic() + 30
        while lis._buffered < (2 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)
        b.sendall(body[(1 << 20) + 4096 :])  # B would hold its 2 MiB frame: 3 MiB in all, past the budget
        rep = _read_reply(b)
        assert rep[:2] == [None, False] and "limit is 3 MiB" in rep[2][1], rep
        assert _read_reply(b) is None  # closed
        b.close()
        a.sendall(body[1 << 20 :])  # A's frame completes within the budget: answered
        assert _read_reply(a) == [1, True, 2 << 20]
        a.sendall(LEN.pack(len(body)) + body)  # and again: the bytes of the first were given back
        assert _read_reply(a) == [1, True, 2 << 20]
        a.close()
        while lis._buffered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lis._buffered == 0
    finally:
        lis.close()


def test_a_receiver_that_cannot_bind_leaves_the_instance_a_primary(tmp_path):
    """``receiver start`` on a port in use made the instance a secondary before the bind failed: a
    primary demoted, with no receiver to feed it. The port is bound first now."""
    root = multisite.create(tmp_path / "R", name="R")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        start_server(root, None)
        try:
            with pytest.raises(Exception, match=f"cannot listen for a source on 127.0.0.1:{port}"):
                control.call(root, "receiver.start", listen=f"127.0.0.1:{port}")
            st = control.call(root, "status")
            assert (st["role"], st["receiver"]) == ("primary", None), st
        finally:
            stop_server(root)


def test_create_refuses_sizes_no_open_could_use_and_makes_nothing(tmp_path):
    from multisite.errors import ConfigError
    from multisite.net.tls import parse_hostport

    for kw in ({"segment_bytes": 0}, {"segment_bytes": 10**20}, {"segment_bytes": "64"},
               {"journal_pool_bytes": -1}, {"journal_pool_bytes": True}):
        with pytest.raises(ConfigError, match=next(iter(kw))):
            multisite.create(tmp_path / "X", name="X", **kw)
        assert not (tmp_path / "X").exists()
    with pytest.raises(ConfigError, match=r"not in 0\.\.65535"):
        parse_hostport("127.0.0.1:99999")


def test_closing_the_listener_does_not_wait_on_clients_that_read_no_replies():
    """A client that sends requests and never reads the replies leaves its thread blocked sending;
    shutting the reading side does not wake it, so close() waited its whole bound per connection
    and left the threads running. One bound for all, then such connections are cut."""
    lis = clients.ClientListener("127.0.0.1", 0, lambda name, args: "x" * (1 << 20), logging.getLogger("test"))
    socks = []
    try:
        req = encode([1, "big", {}])
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", lis.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(req * 64)  # 64 replies of 1 MiB, none read
            socks.append(s)
        time.sleep(0.5)  # the listener's threads are now blocked in sendall
        t0 = time.monotonic()
        lis.close(timeout_s=1.0)
        took = time.monotonic() - t0
        alive = [th for th in threading.enumerate() if th.name.startswith("client-") and th.is_alive()]
        assert took < 2.5 + 1.0 * 3 and not alive, (took, alive)  # was 3 x the bound, threads left
    finally:
        for s in socks:
            s.close()
