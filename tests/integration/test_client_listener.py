"""The client listener: one event loop over every connection, real sockets (``server.clients``)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import msgspec
import pytest

import multisite
from multisite.server.process import start_server, stop_server
from multisite.errors import ConfigError
from multisite.server import clients
from multisite.protocol.client import LEN, encode


def _ask(sock: socket.socket, req: list) -> list:
    return _ask_raw(sock, encode(req))


def _ask_raw(sock: socket.socket, data: bytes) -> list:
    sock.sendall(data)
    head = sock.recv(4, socket.MSG_WAITALL)
    (n,) = LEN.unpack(head)
    return msgspec.msgpack.decode(sock.recv(n, socket.MSG_WAITALL))


def _op(op: str, args: dict):
    if op == "boom":
        raise ConfigError("no such thing")
    return [op, args]


def test_requests_replies_errors_and_a_malformed_frame():
    lis = clients.ClientListener("127.0.0.1", 0, _op, logging.getLogger("test"))
    try:
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            assert _ask(s, [1, "echo", {"a": 1}]) == [1, True, ["echo", {"a": 1}]]
            assert _ask(s, [2, "boom", {}]) == [2, False, [ConfigError.code, "no such thing"]]
            # not msgpack: an error naming it, then the connection is closed
            rid, ok, (code, msg) = _ask_raw(s, LEN.pack(3) + b"\xc1\xc1\xc1")
            assert (rid, ok, code) == (None, False, "REMOTE_PROTOCOL") and "malformed client frame" in msg
            assert s.recv(10) == b""
    finally:
        lis.close()


def test_connections_past_the_limit_are_closed_at_once(monkeypatch):
    monkeypatch.setattr(clients, "MAX_CONNECTIONS", 2)
    lis = clients.ClientListener("127.0.0.1", 0, _op, logging.getLogger("test"))
    try:
        a, b = (socket.create_connection(("127.0.0.1", lis.port)) for _ in range(2))
        assert _ask(a, [1, "x", {}])[1] and _ask(b, [1, "x", {}])[1]
        with socket.create_connection(("127.0.0.1", lis.port)) as c:
            c.settimeout(5)
            assert c.recv(10) == b""
        a.close()
        b.close()
    finally:
        lis.close()


def test_concurrent_clients_share_group_commits_and_stop_is_prompt(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    info = start_server(root, "127.0.0.1:0")
    addr = f"127.0.0.1:{info['client_port']}"
    multisite.connect(addr).create_region("acct")
    errors: list[BaseException] = []

    def client(t: int) -> None:
        try:
            db = multisite.connect(addr)
            for i in range(50):
                db.set("acct", (t, i), i)
        except BaseException as e:  # reported below
            errors.append(e)

    ths = [threading.Thread(target=client, args=(t,)) for t in range(16)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert errors == []
    idle = multisite.connect(addr)  # left open: stop must not wait for it
    assert idle.seqno == 800 and idle.get("acct", (15, 49)) == 49
    t0 = time.monotonic()
    stop_server(root)
    assert time.monotonic() - t0 < 3
    with multisite.open(root) as db:
        assert db.seqno == 800
        assert len(list(db.items("acct"))) == 800


def test_a_request_of_the_wrong_shape_or_with_missing_arguments_gets_a_clear_error():
    def op(op, args):
        return args["region"]  # KeyError when it is missing

    lis = clients.ClientListener("127.0.0.1", 0, op, logging.getLogger("test"))
    try:
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            rid, ok, (code, msg) = _ask(s, [7, "get", {}])
            assert (rid, ok, code) == (7, False, ConfigError.code) and "malformed 'get' request" in msg
            assert _ask(s, [8, "get", {"region": "r"}]) == [8, True, "r"]  # the connection lives on
            # not [id, op, args]: an error naming it, then the connection is closed
            rid, ok, (code, msg) = _ask(s, [9, "get"])
            assert (rid, ok, code) == (None, False, "REMOTE_PROTOCOL") and "[id, op, args]" in msg
            assert s.recv(10) == b""
    finally:
        lis.close()


def _gathering_listener(db):
    """A listener gathering a real Database's commits, as the instance server runs it."""
    from pathlib import Path

    from multisite.server.instance import InstanceServer

    srv = InstanceServer(Path(db.layout.root), None)
    srv.db = db
    return clients.ClientListener("127.0.0.1", 0, srv._client_op, logging.getLogger("test"), db=db,
                                  commit_ops=srv._commit_ops)


def _traced_group_db(tmp_path, monkeypatch):
    """A group-mode instance whose every fdatasync is recorded: ``(thread, seqno durable after it)``."""
    db = multisite.open(multisite.create(tmp_path / "A", name="A", durability="group"))
    db.create_region("r")
    journal = db._core.journal
    hardened: list[tuple[str, int]] = []
    real = db.harden

    def harden(token):
        real(token)
        hardened.append((threading.current_thread().name, journal.durable_seqno))

    monkeypatch.setattr(db, "harden", harden)
    return db, hardened


def test_reads_are_answered_while_a_group_waits_for_its_fdatasync(tmp_path, monkeypatch):
    """The fdatasync runs off the loop: with one held (a slow disk), another connection's read is
    answered at once, a pipelined commit is written meanwhile and a read after it sees it, yet every
    reply waits for the replies before it on its connection, and a commit is answered only once an
    fdatasync covering it returned."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    db.set("r", ("k",), "before")
    entered, release = threading.Event(), threading.Event()
    real = db.harden

    def held_harden(token):  # the real fdatasync, after the test lets it go
        entered.set()
        assert release.wait(30)
        real(token)

    monkeypatch.setattr(db, "harden", held_harden)
    lis = _gathering_listener(db)
    lis.inline_sync_max_s = -1.0  # never on the loop (a held fdatasync stands for a slow disk)
    a = socket.create_connection(("127.0.0.1", lis.port))
    b = socket.create_connection(("127.0.0.1", lis.port))
    try:
        a.sendall(encode([1, "commit", {"ops": [[1, "r", ["k"], "a"]]}]))
        assert entered.wait(30)
        t0 = time.monotonic()
        assert _ask(b, [1, "get", {"region": "r", "key": ["k"]}]) == [1, True, "a"]  # written, not yet hard
        assert time.monotonic() - t0 < 5
        b.sendall(encode([2, "commit", {"ops": [[1, "r", ["b"], 1]]}]) + encode([3, "get", {"region": "r", "key": ["b"]}]))
        for s in (a, b):
            s.settimeout(0.5)
            with pytest.raises(socket.timeout):  # no commit answered before its fdatasync
                s.recv(1)
            s.settimeout(30)
        release.set()
        assert _read_reply(a) == [1, True, 2]
        assert _read_reply(b) == [2, True, 3] and _read_reply(b) == [3, True, 1]
        assert lis.stats()["commits"] == 2
    finally:
        release.set()
        a.close()
        b.close()
        lis.close()
        db.close()


def _read_reply(s: socket.socket):
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (n,) = LEN.unpack(head)
    return msgspec.msgpack.decode(s.recv(n, socket.MSG_WAITALL))


def test_a_lone_connections_commits_are_hardened_on_the_loop_and_answered_only_once_durable(tmp_path, monkeypatch):
    """With nothing else waiting for the loop and fdatasyncs short, a group's fdatasync runs on the
    loop itself (no hand-off to the sync thread and back), and still no commit is answered before
    the fdatasync covering it returned. The first group goes to the sync thread: until one was
    timed, how long an fdatasync takes is unknown."""
    db, hardened = _traced_group_db(tmp_path, monkeypatch)
    lis = _gathering_listener(db)
    lis.inline_sync_max_s = 60.0  # a shared test machine's disk may take milliseconds: short enough here
    try:
        with multisite.connect(f"127.0.0.1:{lis.port}") as c:
            for i in range(20):
                seqno = c.set("r", (i,), i)
                assert hardened and hardened[-1][1] >= seqno  # answered after an fdatasync covering it
            st = lis.stats()
            assert st["commits"] == 20 and st["groups"] == 20
            assert hardened[0][0] == "clients-sync" and st["inline"] == 19
            assert {name for name, _ in hardened[1:]} == {"clients-loop"}
            lis.inline_sync_max_s = 0.0  # fdatasyncs now count as slow (a slow disk): back to the sync thread
            del hardened[:]
            for i in range(5):
                assert c.set("r", ("slow", i), i) <= hardened[-1][1]
            assert {name for name, _ in hardened} == {"clients-sync"} and lis.stats()["inline"] == 19
    finally:
        lis.close()
        db.close()


def test_a_connection_that_committed_lately_keeps_the_fdatasync_off_the_loop(tmp_path, monkeypatch):
    """Two connections taking turns (issue 27): while one committed within ``active_window_s``, the
    other's groups are hardened by the sync thread, so the loop writes the next commit meanwhile
    instead of blocking in the fdatasync it would wait for; once it is quiet, the loop hardens again.
    Either way a commit is answered only after an fdatasync covering it returned."""
    db, hardened = _traced_group_db(tmp_path, monkeypatch)
    lis = _gathering_listener(db)
    lis.inline_sync_max_s = 60.0
    lis.active_window_s = 60.0  # a loaded test machine: "lately" is the whole test
    try:
        with multisite.connect(f"127.0.0.1:{lis.port}") as a, multisite.connect(f"127.0.0.1:{lis.port}") as b:
            for i in range(3):  # the first group times an fdatasync in the sync thread, then the loop's
                assert a.set("r", ("a", i), i) <= hardened[-1][1]
            assert [name for name, _ in hardened[1:]] == ["clients-loop"] * 2
            del hardened[:]
            assert b.set("r", ("b",), 1) <= hardened[-1][1]  # a committed lately: the sync thread
            for i in range(3):
                assert a.set("r", ("a2", i), i) <= hardened[-1][1]  # b committed lately
            assert {name for name, _ in hardened} == {"clients-sync"}
            lis.active_window_s = 0.0  # b is quiet now
            del hardened[:]
            for i in range(3):
                assert a.set("r", ("a3", i), i) <= hardened[-1][1]
            assert {name for name, _ in hardened} == {"clients-loop"}
    finally:
        lis.close()
        db.close()


def test_sixteen_connections_committing_at_once_share_fdatasyncs(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    lis = _gathering_listener(db)
    try:
        def client(t: int) -> None:
            with multisite.connect(f"127.0.0.1:{lis.port}") as c:
                for i in range(100):
                    c.set("r", (t, i), i)

        ths = [threading.Thread(target=client, args=(t,)) for t in range(16)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        st = lis.stats()
        assert st["commits"] == 1600 and db.seqno == 1600
        assert st["groups"] < 1600 * 0.75, st  # commits that arrive while one syncs share the next
    finally:
        lis.close()
        db.close()


def test_commits_with_nothing_to_harden_still_reach_the_store_file(tmp_path):
    """Durability none (no fdatasync to run): the store's periodic commit still runs, off the loop, so
    the store file catches up while only clients commit."""
    import sqlite3

    root = multisite.create(tmp_path / "A", name="A", durability="none")
    db = multisite.open(root)
    db.create_region("r")
    lis = _gathering_listener(db)
    try:
        with multisite.connect(f"127.0.0.1:{lis.port}") as c:
            for i in range(20):
                c.set("r", (i,), i)
        deadline = time.monotonic() + 30
        seen = -1
        while time.monotonic() < deadline:
            with sqlite3.connect(f"file:{db.layout.store_file}?mode=ro", uri=True) as con:
                seen = con.execute("SELECT count(*) FROM kv").fetchone()[0]
            if seen == 20:
                break
            time.sleep(0.1)
        assert seen == 20
    finally:
        lis.close()
        db.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_worker_threads_take_the_processs_cpus_as_they_are_when_started(monkeypatch):
    """The loop's threads share one CPU (MULTISITE_LISTENER_CPU); a worker thread, started later by
    the pinned loop, takes the CPUs the process has then (an operator's ``taskset -p`` since the
    listener started), not a set remembered from the listener's start."""
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("MULTISITE_LISTENER_CPU", str(cpus[0]))
    seen: list[set[int]] = []

    def run_op(op, args):
        seen.append(os.sched_getaffinity(0))

    lis = clients.ClientListener("127.0.0.1", 0, run_op, logging.getLogger("test"))
    try:
        os.sched_setaffinity(os.getpid(), {cpus[-1]})  # the process narrowed at runtime
        with socket.create_connection(("127.0.0.1", lis.port)) as s:
            assert _ask(s, [1, "create_region", {"name": "r"}])[1] is True
        assert seen == [{cpus[-1]}]
    finally:
        os.sched_setaffinity(os.getpid(), set(cpus))
        lis.close()
