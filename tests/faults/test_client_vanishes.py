"""A client whose host or network vanishes without closing its connection (no FIN, no RST) is
dropped by the server's TCP keepalive, freeing its thread and connection slot; the server goes on
serving the others. Real processes: the client runs in a network namespace behind a veth pair,
whose link is then taken down, so the server's probes go unanswered (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import multisite
from multisite.server.process import start_server, stop_server
from multisite.net import control

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

CLIENT = """
import sys, time, multisite
db = multisite.connect(sys.argv[1])
db.set("r", ("from-ns",), 1)
print("committed", flush=True)
time.sleep(600)
"""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@pytest.fixture
def netns():
    """A namespace reached from here over a veth pair: (namespace, this side's address, link in it)."""
    tag = f"ms{os.getpid() % 100000}"
    ns, host, peer = tag, f"vh{tag}", f"vc{tag}"
    net = f"10.{100 + os.getpid() % 100}.{os.getpid() % 250}"
    try:
        _ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot make a network namespace here: {e}")
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", host)
        _ip("link", "set", host, "up")
        _ip("addr", "add", f"{net}.2/24", "dev", peer, ns=ns)
        _ip("link", "set", peer, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        yield ns, f"{net}.1", peer
    finally:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", host, check=False)


def _status(root) -> dict:
    return control.call(root, "status")


def _until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def test_a_client_whose_network_vanishes_is_dropped_and_the_server_serves_on(tmp_path, netns):
    ns, addr, link = netns
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    info = start_server(root, f"{addr}:0", keepalive=2, insecure=True)  # no users: not loopback
    client = None
    try:
        where = f"{addr}:{info['client_port']}"
        with multisite.connect(where) as db:
            db.create_region("r")
        client = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, where],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "committed", client.stderr.read()
        assert _status(root)["clients"] == 1
        time.sleep(3)  # idle past the keepalive: an idle client that is alive answers the probes
        assert _status(root)["clients"] == 1, "a live idle client was dropped"
        _ip("link", "set", link, "down", ns=ns)  # the client's network is gone: no FIN, no RST
        _until(lambda: _status(root)["clients"] == 0, 60, "the vanished client's connection is dropped")
        log = (root / "log" / "server.log").read_text()
        assert f"client connection from {addr[:-1]}2:" in log and "timed out" in log, log[-2000:]
        with multisite.connect(where) as db:  # the server serves on
            db.set("r", ("after",), 2)
            assert (db.get("r", ("from-ns",)), db.get("r", ("after",))) == (1, 2)
    finally:
        if client is not None:
            client.kill()
            client.wait()
        if control.is_running(root):
            stop_server(root)


def test_keepalive_that_is_not_whole_seconds_in_range_is_refused_before_start(tmp_path):
    from multisite.errors import ConfigError

    root = multisite.create(tmp_path / "A", name="A")
    for bad in (0, -5, 40000):
        with pytest.raises(ConfigError, match="--keepalive"):
            start_server(root, "127.0.0.1:0", keepalive=bad)
    assert not control.is_running(root)
