"""TLS and authentication on every grid wire (issue 24), with real processes: catalog ⇄ container,
container ⇄ container (the data and vote wire), client ⇄ catalog and container.

- A grid with the grid's CA and users: a read-write user commits (replicated to its sync replica over
  TLS), a read-only user reads and cannot put, a wrong password, no credentials and a plain client are
  refused, a user by certificate commits.
- Containers refused before they register: without TLS, with a certificate of another CA, of another
  grid (told by the catalog, or by the container itself when it knows its grid); on etcd, by the
  catalog it asks before registering.
- Garbage and oversized frames on every grid port, in plain and inside TLS: the connection ends, the
  port goes on serving.
- A non-loopback --listen without TLS or without users is refused at start unless --insecure.
- The threads of one client share one TLS connection per container (one handshake, requests
  pipelined), and every commit of every thread is answered to its own thread.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading

import pytest

from multisite.errors import AuthenticationFailed, ConfigError, PermissionDenied, ServerError
from multisite.grid.server.process import catalog_status, start_catalog, start_container, stop_process
from multisite.net import control
from multisite.instance.users import add_user
from multisite.server.client import client_tls_context
from multisite.testing.certs import make_grid_cert, make_test_pki
from multisite.testing.grid import GridCluster
from multisite.net.tls import TLSConfig

APP, VIEWER = ("app", "app-password-1"), ("viewer", "viewer-password-1")


@pytest.fixture
def secured(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    users = tmp_path / "users"
    add_user(users, APP[0], "read-write", APP[1], instance=False)
    add_user(users, VIEWER[0], "read-only", VIEWER[1], instance=False)
    add_user(users, "certuser", "read-write", None, instance=False)
    g = GridCluster(tmp_path / "grid", partitions=2, min_sync=1, max_sync=1, max_async=0, pki=pki, users=users)
    try:
        g.start_catalog()
        g.start_container("c1")
        g.start_container("c2")
        g.wait_settled()
        yield g, pki
    finally:
        g.stop_all()


def refused(match: str, root, *args, **kw) -> None:
    """``start_container`` must fail with ``match``; a container that started anyway is stopped."""
    try:
        with pytest.raises(ServerError, match=match):
            start_container(root, *args, **kw)
    finally:
        if control.is_running(root):
            stop_process(root, "container")


def connect(g: GridCluster, pki: dict, **kw):
    from multisite.grid import connect as grid_connect

    return grid_connect(g.address, timeout_s=5.0, **{"tls_ca": str(pki["ca_cert"]), **kw})


def test_users_and_roles_on_a_grid_whose_every_wire_is_tls(secured):
    g, pki = secured
    with connect(g, pki, user=APP[0], password=APP[1]) as app:
        for k in range(20):
            app.put("m", k, f"v{k}")
        assert app.get("m", 3) == "v3"
    st = g.wait("the sync replicas hold every commit (over TLS)", g.caught_up)
    assert all(p["current"] for p in st["partitions"])

    with connect(g, pki, user=VIEWER[0], password=VIEWER[1]) as viewer:
        assert viewer.get("m", 5) == "v5"
        with pytest.raises(PermissionDenied, match="read-only"):
            viewer.put("m", 5, "no")
    with pytest.raises(AuthenticationFailed, match="wrong user or password"):
        connect(g, pki, user=APP[0], password="not-the-password")
    with pytest.raises(AuthenticationFailed, match="requires authentication"):
        connect(g, pki)  # TLS, but nobody
    with pytest.raises(AuthenticationFailed, match="TLS only"):
        from multisite.grid import connect as plain
        plain(g.address, timeout_s=2.0, user=APP[0], password=APP[1])
    user_cert = make_grid_cert(pki, "certuser", None)
    with connect(g, pki, tls_cert=str(user_cert["cert"]), tls_key=str(user_cert["key"])) as by_cert:
        by_cert.put("m", 99, "by certificate")
    with pytest.raises((OSError, AuthenticationFailed)):  # a certificate the grid's CA did not sign
        connect(g, pki, tls_cert=str(pki["untrusted_cert"]), tls_key=str(pki["untrusted_key"]))
    st = catalog_status(g.address, tls=client_tls_context(str(pki["ca_cert"]), None, None, check_hostname=False),
                        user=VIEWER[0], password=VIEWER[1])
    assert st["security"]["tls"] and st["security"]["users"] == 3


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port``, from /proc (the kernel's count)."""
    mine = {os.readlink(f"/proc/self/fd/{fd}")[8:-1] for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}") and os.readlink(f"/proc/self/fd/{fd}").startswith("socket:[")}
    rows = [ln.split() for ln in open("/proc/self/net/tcp").read().splitlines()[1:]]
    return sum(1 for r in rows if r[3] == "01" and int(r[2].split(":")[1], 16) == port and r[9] in mine)


def test_a_clients_threads_share_one_tls_connection_per_container(secured):
    g, pki = secured
    answers: dict[int, list] = {}
    with connect(g, pki, user=APP[0], password=APP[1]) as app:
        def writer(t: int) -> None:
            answers[t] = [(k, app.put("m", (t, k), {"t": t, "k": k})) for k in range(25)]

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        st = g.status()
        port = {c["name"]: int(c["address"].rsplit(":", 1)[1]) for c in st["containers"]}
        primaries = {p["primary"] for p in st["partitions"]}
        assert {n: connections_to(port[n]) for n in primaries} == {n: 1 for n in primaries}  # not one per thread
        assert sorted(answers) == list(range(16)) and all(len(a) == 25 for a in answers.values())
        assert all(seqno > 0 for a in answers.values() for _, seqno in a)
        assert all(app.get("m", (t, k)) == {"t": t, "k": k} for t in (0, 7, 15) for k in (0, 24))
    assert all(connections_to(p) == 0 for p in port.values())  # close() ends them


def test_containers_without_the_grids_certificate_are_refused_before_they_register(secured, tmp_path):
    g, pki = secured
    refused("TLS_REQUIRED", tmp_path / "plain", g.address, "127.0.0.1:0", name="plain")
    rogue = TLSConfig(str(pki["untrusted_cert"]), str(pki["untrusted_key"]), str(pki["ca_cert"]))
    refused("NOT_A_MEMBER.*certificate", tmp_path / "rogue", g.address, "127.0.0.1:0", name="untrusted", tls=rogue)
    other = g.member_tls("c9", grid="other")
    refused("NOT_A_MEMBER.*names grid 'other'", tmp_path / "other", g.address, "127.0.0.1:0", tls=other)
    refused("names grid 'other', not 'orders'", tmp_path / "other2", g.address, "127.0.0.1:0", grid="orders",
            tls=other)
    assert sorted(c["name"] for c in g.status()["containers"]) == ["c1", "c2"]


def test_a_container_on_etcd_asks_a_catalog_before_it_registers(tmp_path, etcd_cluster):
    pki = make_test_pki(tmp_path / "pki")
    g = GridCluster(tmp_path / "grid", name="tlsetcd", partitions=2, min_sync=0, max_sync=0, max_async=0,
                    etcd=etcd_cluster.endpoints, pki=pki)
    try:
        g.start_catalog(name="k1")
        g.start_container("c1")
        other = g.member_tls("c9", grid="other")  # refused by the container itself: it knows its grid
        refused("names grid 'other', not 'tlsetcd'", tmp_path / "c9", None, "127.0.0.1:0", grid="tlsetcd",
                etcd=etcd_cluster.endpoints, tls=other)
        other_ca = make_grid_cert(make_test_pki(tmp_path / "rogue-pki"), "c8", "tlsetcd")  # of another CA
        rogue = TLSConfig(str(other_ca["cert"]), str(other_ca["key"]), str(pki["ca_cert"]))
        refused("refused this container.*TLS", tmp_path / "rogue", None, "127.0.0.1:0", grid="tlsetcd",
                etcd=etcd_cluster.endpoints, tls=rogue)
        assert [c["name"] for c in g.status()["containers"]] == ["c1"]
    finally:
        g.stop_all()


def _ports(g: GridCluster) -> dict[str, str]:
    st = g.status()
    return {"catalog": g.address, **{c["name"]: c["address"] for c in st["containers"]}}


def _send(address: str, data: bytes, tls: ssl.SSLContext | None) -> bytes:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    if tls is not None:
        s = tls.wrap_socket(s)
    try:
        s.sendall(data)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
    except OSError:
        return b""
    finally:
        s.close()


def test_garbage_and_oversized_frames_on_every_grid_port(secured):
    g, pki = secured
    member = g.member_tls("prober")
    tls = client_tls_context(member.ca, member.cert, member.key, check_hostname=False)
    garbage = bytes(range(256)) * 8
    oversized = struct.pack(">IB", 1 << 30, 20) + b"\x00" * 64  # a 1 GiB frame announced
    for name, address in _ports(g).items():
        for data in (garbage, oversized, b"\x00\x00\x00\x01"):
            _send(address, data, tls)  # inside TLS: the grid wires' framing refuses and closes
            _send(address, data, None)  # plain to a TLS port: refused, closed
    with connect(g, pki, user=APP[0], password=APP[1]) as app:  # every port still serves
        app.put("m", 1, "after the garbage")
        assert app.get("m", 1) == "after the garbage"
    assert {c["name"] for c in g.status()["containers"] if c["up"]} == {"c1", "c2"}


def test_a_listen_other_hosts_reach_needs_tls_and_users_or_insecure(tmp_path):
    toml = tmp_path / "grid.toml"
    toml.write_text('name = "g"\npartitions = 1\n[maps.m]\n')
    with pytest.raises(ConfigError, match="--tls-cert"):
        start_catalog(tmp_path / "k", toml, "0.0.0.0:0", 1.0)
    pki = make_test_pki(tmp_path / "pki")
    c = make_grid_cert(pki, "k", "g")
    with pytest.raises(ConfigError, match="no users"):
        start_catalog(tmp_path / "k", toml, "0.0.0.0:0", 1.0, tls=TLSConfig(str(c["cert"]), str(c["key"]),
                                                                            str(c["ca"])))
    with pytest.raises(ConfigError, match="--tls-cert"):
        start_container(tmp_path / "c", "127.0.0.1:1", "0.0.0.0:0", name="c")
