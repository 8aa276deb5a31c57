"""Clients authenticate (issue 14): real instance server processes, real TCP and TLS on 127.0.0.1,
real Argon2id hashes. A wrong password, no certificate where one is needed, a read-only user writing,
brute-force pacing, a non-loopback listen without users, and the TLS happy paths."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import msgspec
import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import (AuthenticationFailed, AuthenticationPaced, AuthenticationRequired, ConfigError, ConnectionLost,
                              PermissionDenied)
from multisite.instance.users import add_user, remove_user
from multisite.server.client import fetch_hello
from multisite.server.process import start_server, stop_server
from multisite.net.tls import TLSConfig
from multisite.protocol.client import LEN, encode
from multisite.testing.certs import make_named_cert, make_test_pki


@pytest.fixture
def inst(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    add_user(root, "reader", "read-only", "reader-pass")
    add_user(root, "writer", "read-write", "writer-pass")
    add_user(root, "boss", "admin", "boss-pass")
    return root


@pytest.fixture
def pki(tmp_path):
    return make_test_pki(tmp_path / "pki")


@pytest.fixture
def server(inst):
    """Start a server on ``inst`` (once, with the options given); stopped afterwards."""
    started = []

    def start(listen: str = "127.0.0.1:0", **kw) -> str:
        info = start_server(inst, listen, **kw)
        started.append(inst)
        return f"127.0.0.1:{info['client_port']}"

    yield start
    for root in started:
        stop_server(root)


def _log(root) -> str:
    return (root / "log" / "server.log").read_text()


def _tls(pki) -> TLSConfig:
    return TLSConfig(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca_cert"]))


def test_a_wrong_password_is_refused_with_a_clear_error_and_a_log_line_with_the_address(inst, server):
    addr = server()
    with pytest.raises(AuthenticationFailed, match="authentication as 'writer' failed: wrong user or password"):
        multisite.connect(addr, user="writer", password="not-the-password")
    with pytest.raises(AuthenticationFailed, match="wrong user or password"):
        multisite.connect(addr, user="nobody", password="writer-pass")
    assert re.search(r"WARNING multisite: client 127\.0\.0\.1:\d+ refused: wrong password for 'writer' \(1 failures",
                     _log(inst))
    assert re.search(r"client 127\.0\.0\.1:\d+ refused: unknown user for 'nobody' \(2 failures", _log(inst))


def test_without_credentials_every_op_but_history_asks_for_authentication(inst, server):
    addr = server()
    db = multisite.connect(addr)
    with pytest.raises(AuthenticationRequired, match="requires authentication"):
        db.get("acct", ("a",))
    with pytest.raises(AuthenticationRequired):
        db.set("acct", ("a",), 1)
    assert fetch_hello(addr).name == "A"  # rollback --fetchresync against a primary with users still works
    db.close()


def test_a_read_only_user_may_read_but_not_write(inst, server):
    addr = server()
    with multisite.connect(addr, user="writer", password="writer-pass") as w:
        assert w.user == {"user": "writer", "role": "read-write", "by": "password"}
        w.create_region("acct")
        w.set("acct", ("a",), 1)
    with multisite.connect(addr, user="reader", password="reader-pass") as r:
        assert r.get("acct", ("a",)) == 1 and list(r.items("acct")) == [(("a",), 1)]
        with pytest.raises(PermissionDenied, match="'reader' has the read-only role; 'commit' needs read-write"):
            r.set("acct", ("a",), 2)
        with pytest.raises(PermissionDenied):
            with r.transaction() as tx:
                tx.set("acct", ("b",), 2)
        with pytest.raises(PermissionDenied, match="create_region"):
            r.create_region("other")
        assert r.get("acct", ("a",)) == 1 and r.seqno == 1  # nothing written; the connection still serves
    assert re.search(r"client 127\.0\.0\.1:\d+ as 'reader' \(role read-only\) denied 'commit'", _log(inst))


def _fail_once(addr: str) -> None:
    with pytest.raises(AuthenticationFailed) as ei:
        multisite.connect(addr, user="boss", password="guess-guess")
    assert type(ei.value) is AuthenticationFailed


def test_brute_force_is_paced_per_address(inst, server):
    addr = server()
    for _ in range(3):  # answered at once
        _fail_once(addr)
    for failures in range(4, 8):  # the 4th starts a 1 s wait, each further one doubles it
        wait_s = 2.0 ** (failures - 4)
        t0 = time.monotonic()
        _fail_once(addr)
        failed_at = time.monotonic()  # the server stamped the failure between t0 and this
        try:
            with multisite.connect(addr, user="boss", password="boss-pass"):  # the right one
                pass
        except AuthenticationPaced as e:  # unseen inside the wait
            assert re.search(r"too many failed authentications from 127.0.0.1: try again in", str(e))
            break
        # let in only because this machine was too slow to try again inside the wait (at load)
        assert time.monotonic() - t0 > wait_s, f"the right password was let in {time.monotonic() - t0:.2f} s " \
                                                f"after failure {failures}, inside its {wait_s:g} s wait"
    else:
        raise AssertionError("no try came inside a wait in four rounds")
    assert f"authentication as 'boss' paced ({failures} failures from this address" in _log(inst)
    time.sleep(max(0.0, wait_s + 0.05 - (time.monotonic() - failed_at)))
    with multisite.connect(addr, user="boss", password="boss-pass") as db:
        assert db.user["role"] == "admin"


def test_users_added_replaced_and_removed_apply_at_once_to_new_and_open_sessions(inst, server):
    addr = server()
    with pytest.raises(AuthenticationFailed):
        multisite.connect(addr, user="late", password="late-pass")
    add_user(inst, "late", "read-only", "late-pass")
    with multisite.connect(addr, user="late", password="late-pass") as db:
        assert db.user["role"] == "read-only"
        with pytest.raises(PermissionDenied):
            db.create_region("r")
        remove_user(inst, "late")
        time.sleep(0.2)  # open sessions look at the users file every 0.1 s (client_auth.USERS_RECHECK_S)
        with pytest.raises(AuthenticationFailed, match="user 'late' was removed: authenticate again"):
            db.seqno
        with pytest.raises(ConnectionLost):  # and the server closed it
            db.seqno
    with pytest.raises(AuthenticationFailed):
        multisite.connect(addr, user="late", password="late-pass")
    with multisite.connect(addr, user="writer", password="writer-pass") as db:
        add_user(inst, "writer", "read-write", "rotated-pass", replace=True)  # a leaked password rotated
        time.sleep(0.2)
        with pytest.raises(AuthenticationFailed, match="'writer' has a new password or token"):
            db.seqno
    assert re.search(r"client 127\.0\.0\.1:\d+ refused: user 'late' was removed, session ended", _log(inst))


def test_loopback_without_users_needs_no_authentication_as_before(tmp_path):
    root = multisite.create(tmp_path / "B", name="B", durability="none")
    info = start_server(root, "127.0.0.1:0")
    try:
        with multisite.connect(f"127.0.0.1:{info['client_port']}") as db:
            db.create_region("r")
            assert db.set("r", ("k",), 1) == 1
    finally:
        stop_server(root)


def test_a_non_loopback_listen_without_users_is_refused_unless_insecure(tmp_path):
    root = multisite.create(tmp_path / "B", name="B", durability="none")
    with pytest.raises(ConfigError, match="--listen 0.0.0.0 accepts clients from other hosts.*--insecure"):
        start_server(root, "0.0.0.0:0")
    # The server process refuses it by itself too (started by hand, not through start_server).
    out = subprocess.run([sys.executable, "-m", "multisite.server.instance", str(root), "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--listen 0.0.0.0" in out.stderr and "--insecure" in out.stderr
    info = start_server(root, "0.0.0.0:0", insecure=True)
    try:
        with multisite.connect(f"127.0.0.1:{info['client_port']}") as db:
            assert db.seqno == 0
        assert "--insecure: clients from any host" in _log(root)
    finally:
        stop_server(root)


def test_a_non_loopback_listen_with_users_requires_authentication(inst, server):
    addr = server("0.0.0.0:0")
    with pytest.raises(AuthenticationRequired):
        multisite.connect(addr).seqno
    with multisite.connect(addr, user="reader", password="reader-pass") as db:
        assert db.seqno == 0
    assert "passwords cross the network in clear" in _log(inst)


def test_tls_with_a_password_and_with_a_client_certificate_naming_a_user(inst, pki, server):
    add_user(inst, "client", "read-write", None)  # the test PKI's client certificate: CN=client
    addr = server(tls=_tls(pki))
    ca = str(pki["ca_cert"])
    with multisite.connect(addr, user="writer", password="writer-pass", tls_ca=ca) as db:
        db.create_region("acct")
        db.set("acct", ("p",), "by password over TLS")
    with multisite.connect(addr, tls_ca=ca, tls_cert=str(pki["client_cert"]), tls_key=str(pki["client_key"])) as db:
        assert db.user == {"user": "client", "role": "read-write", "by": "certificate"}
        db.set("acct", ("c",), "by certificate")
        assert db.get("acct", ("p",)) == "by password over TLS"
    assert re.search(r"client 127\.0\.0\.1:\d+ authenticated as 'client' \(role read-write\) by certificate",
                     _log(inst))


def test_no_certificate_where_one_is_required_is_refused(inst, pki, server):
    add_user(inst, "client", "read-write", None)
    addr = server(tls=_tls(pki))
    ca = str(pki["ca_cert"])
    with pytest.raises(AuthenticationFailed, match="no client certificate on this connection"):
        multisite.connect(addr, user="client", tls_ca=ca)  # a certificate-only user without its certificate
    with pytest.raises(AuthenticationFailed, match="refused this client's TLS certificate"):
        multisite.connect(addr, tls_ca=ca, tls_cert=str(pki["untrusted_cert"]), tls_key=str(pki["untrusted_key"]))
    other = make_named_cert(pki, "stranger")  # signed by the CA, but no user of that name
    with pytest.raises(AuthenticationFailed, match="common name 'stranger' is not a user"):
        multisite.connect(addr, tls_ca=ca, tls_cert=str(other["cert"]), tls_key=str(other["key"]))
    with pytest.raises(AuthenticationRequired, match="takes TLS on its client port"):
        multisite.connect(addr, user="writer", password="writer-pass")  # no TLS at all
    log = _log(inst)
    assert "refused: hello as 'client' without a password and without a client certificate" in log
    assert "client connection from 127.0.0.1:" in log and "refused: TLS handshake failed" in log
    assert "refused: the certificate's name 'stranger' is no user" in log


def test_server_start_takes_the_client_ports_tls_options_and_status_shows_authentication(inst, pki):
    r = CliRunner()
    res = r.invoke(cli, ["server", "start", str(inst), "--listen", "127.0.0.1:0", "--tls-cert", str(pki["server_cert"]),
                         "--tls-key", str(pki["server_key"]), "--tls-ca", str(pki["ca_cert"])])
    assert res.exit_code == 0, res.output
    try:
        res = r.invoke(cli, ["status", str(inst), "--json"])
        st = json.loads(res.stdout)
        ca = st["client_auth"]
        assert {k: ca[k] for k in ("users", "tls", "required", "refused")} == {"users": 3, "tls": True,
                                                                              "required": True, "refused": 0}
        with multisite.connect(f"127.0.0.1:{st['client_port']}", user="boss", password="boss-pass",
                               tls_ca=str(pki["ca_cert"])) as db:
            assert db.user["role"] == "admin"
    finally:
        stop_server(inst)
    res = r.invoke(cli, ["server", "start", str(inst), "--listen", "127.0.0.1:0", "--tls-cert", str(pki["server_cert"])])
    assert res.exit_code == 1 and "TLS needs all three of --tls-cert, --tls-key and --tls-ca" in res.output


def _ask(sock: socket.socket, req: list) -> list:
    sock.sendall(encode(req))
    (n,) = LEN.unpack(sock.recv(4, socket.MSG_WAITALL))
    return msgspec.msgpack.decode(sock.recv(n, socket.MSG_WAITALL))


def test_on_the_wire_a_refused_hello_closes_and_an_unauthenticated_client_may_not_send_large_frames(inst, server):
    host, port = server().split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert _ask(s, [1, "hello", {"user": "boss", "password": "wrong-wrong"}])[:2] == [1, False]
        assert s.recv(10) == b""  # closed by the server
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(LEN.pack(1 << 20))  # announces a 1 MiB request before authenticating
        (n,) = LEN.unpack(s.recv(4, socket.MSG_WAITALL))
        rid, ok, (code, msg) = msgspec.msgpack.decode(s.recv(n, socket.MSG_WAITALL))
        assert (rid, ok, code) == (None, False, "REMOTE_PROTOCOL") and "exceeds 65536" in msg
        assert s.recv(10) == b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert _ask(s, [1, "hello", {"user": "boss", "password": "boss-pass"}])[1] is True
        big = "x" * (1 << 20)  # authenticated: the usual 64 MiB limit
        assert _ask(s, [2, "create_region", {"name": "r"}])[1] is True
        assert _ask(s, [3, "commit", {"ops": [[1, "r", ["k"], big]]}]) == [3, True, 1]


def test_status_shows_the_client_ports_authentication(inst, server):
    server()
    res = CliRunner().invoke(cli, ["status", str(inst)])
    assert res.exit_code == 0, res.output
    assert "client port" in res.output and "required" in res.output


def test_the_server_certificate_is_checked_against_the_host_name_unless_told_not_to(inst, pki, server):
    named = make_named_cert(pki, "instance-A", loopback_names=False)  # an instance's name, not a host's
    addr = server(tls=TLSConfig(str(named["cert"]), str(named["key"]), str(pki["ca_cert"])))
    ca = str(pki["ca_cert"])
    with pytest.raises(ConnectionLost, match="TLS handshake .* failed.*(mismatch|doesn't match)"):
        multisite.connect(addr, user="boss", password="boss-pass", tls_ca=ca)
    with multisite.connect(addr, user="boss", password="boss-pass", tls_ca=ca, tls_check_hostname=False) as db:
        assert db.user["role"] == "admin"


def test_rollback_fetchresync_reads_a_primarys_history_through_a_tls_client_port_with_users(cluster, pki):
    """history needs no user, so an instance that went on alone (a promoted secondary) still finds its
    common point with a primary whose client port requires authentication; --tls-ca makes it TLS."""
    a = cluster.instance("A", group="g", start=False)
    add_user(a.root, "writer", "read-write", "writer-pass")
    a.start(tls=_tls(pki))
    b = cluster.instance("B", group="g")
    cluster.link(a, b)
    addr, ca = f"127.0.0.1:{a.client_port}", str(pki["ca_cert"])
    with multisite.connect(addr, user="writer", password="writer-pass", tls_ca=ca) as db:
        db.create_region("acct")
        db.set("acct", ("a",), 1)
    deadline = time.monotonic() + 30
    while b.seqno() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.seqno() == 1
    b.call("receiver.stop")
    b.call("role", role="primary")
    with b.client() as db:  # B goes on alone: a transaction A never had
        db.set("acct", ("b",), 2)
    r = CliRunner()
    res = r.invoke(cli, ["rollback", str(b.root), "--fetchresync", addr, "--json"])
    assert res.exit_code == 1 and "AUTHENTICATION_REQUIRED" in res.output and "takes TLS" in res.output
    res = r.invoke(cli, ["rollback", str(b.root), "--fetchresync", addr, "--tls-ca", ca, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["rolled_back"], rep["to_seqno"]) == (1, 1)
    res = r.invoke(cli, ["rollback", str(b.root), "--resync", "1", "--tls-ca", ca])
    assert res.exit_code == 1 and "--tls-ca goes with --fetchresync" in res.output


def test_a_users_file_damaged_while_the_server_runs_keeps_the_last_good_users(inst, server):
    addr = server()
    (inst / "users.json").write_text("{ damaged")
    with multisite.connect(addr, user="writer", password="writer-pass") as db:
        assert db.user["role"] == "read-write"
    with pytest.raises(AuthenticationFailed):
        multisite.connect(addr, user="writer", password="wrong-password")
    assert "INSTANCE_FILE_CORRUPT: the users file" in _log(inst) and "the users read before stay in force" in _log(inst)


def test_the_asyncio_client_authenticates_with_a_password_and_over_tls(inst, pki, server):
    """``multisite.aconnect`` takes ``connect``'s authentication arguments (issue 14: the event-loop
    listener serves both clients the same way)."""
    import asyncio

    addr = server(tls=_tls(pki))
    ca = str(pki["ca_cert"])

    async def main() -> None:
        db = await multisite.aconnect(addr, user="writer", password="writer-pass", tls_ca=ca)
        assert db.user["role"] == "read-write"
        await db.create_region("r")
        assert await db.set("r", ("k",), 1) == 1 and await db.get("r", ("k",)) == 1
        await db.close()
        ro = await multisite.aconnect(addr, user="reader", password="reader-pass", tls_ca=ca)
        assert await ro.get("r", ("k",)) == 1
        with pytest.raises(PermissionDenied):
            await ro.set("r", ("k",), 2)
        await ro.close()
        with pytest.raises(AuthenticationFailed):
            await multisite.aconnect(addr, user="writer", password="wrong-wrong", tls_ca=ca)
        with pytest.raises(AuthenticationFailed, match="refused this client's TLS certificate"):
            await multisite.aconnect(addr, tls_ca=ca, tls_cert=str(pki["untrusted_cert"]),
                                     tls_key=str(pki["untrusted_key"]))

    asyncio.run(main())


def test_a_connection_that_does_not_authenticate_in_time_is_closed_and_one_that_did_is_not(inst):
    """In-process listener (a real socket, the real ClientAuth) with a short bound, to need no long sleep."""
    import logging

    from multisite.protocol.admission import AdmissionPolicy
    from multisite.server import client_auth, clients

    auth = client_auth.ClientAuth(inst, "127.0.0.1", logging.getLogger("test"),
                                  admission=AdmissionPolicy(login_deadline_s=0.5))
    lis = clients.ClientListener("127.0.0.1", 0, lambda op, args: op, logging.getLogger("test"), auth=auth)
    try:
        with socket.create_connection(("127.0.0.1", lis.port), timeout=10) as idle, \
                socket.create_connection(("127.0.0.1", lis.port), timeout=10) as s:
            assert _ask(s, [1, "hello", {"user": "reader", "password": "reader-pass"}])[1] is True
            time.sleep(1.0)
            assert idle.recv(10) == b""  # closed by the server
            assert _ask(s, [2, "get", {}]) == [2, True, "get"]  # authenticated: no longer bound
        st = auth.admission.status()
        assert (st["timeouts"], st["logins"], st["waiting"]) == (1, 1, 0)
    finally:
        lis.close()


def test_a_tls_client_closing_its_side_gets_the_servers_close_notify(inst, pki, server):
    """A TLS client's close sends close_notify and waits for the server's (asyncio waits up to 30 s, then
    gives up): the server answers it and ends the connection."""
    import ssl

    addr = server(tls=_tls(pki))
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(pki["ca_cert"]))
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        tls = ctx.wrap_socket(raw, server_hostname=host)
        tls.unwrap()  # before: the server never answered, a TimeoutError after 10 s
