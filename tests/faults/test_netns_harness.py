"""The network-namespace harness (testing/netns.py): hosts that reach each other over TCP until a cut,
and a real 3-member etcd with one member isolated by the network (not paused, not killed). As root."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest

from multisite.errors import CoordinatorUnavailable
from multisite.ha.etcd_client import EtcdClient
from multisite.testing.etcd import EtcdCluster
from multisite.testing.netns import Hosts, netns_unavailable

_why_not = netns_unavailable()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=f"network namespaces: {_why_not}")

PORT = 7000
CONNECT_TIMEOUT_S = 1.0
READY_TIMEOUT_S = 5.0
QUORUM_BOUND_S = 5.0  # the two connected members take writes again within this
WATCH_END_BOUND_S = 10.0  # a watch on the isolated member ends within this (etcd: 3 election timeouts)
SERVER = ("import socket\ns = socket.create_server(('0.0.0.0', %d))\n"
          "while True:\n    c, _ = s.accept(); c.sendall(b'ok'); c.close()\n" % PORT)


def probe_argv(addr: str) -> list[str]:
    """A client that exits 0 when it got the server's answer within CONNECT_TIMEOUT_S."""
    code = (f"import socket,sys\nc = socket.create_connection(({addr!r}, {PORT}), timeout={CONNECT_TIMEOUT_S})\n"
            "sys.exit(0 if c.recv(2) == b'ok' else 1)\n")
    return [sys.executable, "-c", code]


def reaches(hosts: Hosts, src: str, dst: str) -> bool:
    done = hosts.run(src, probe_argv(hosts.addr(dst)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = done.communicate(timeout=CONNECT_TIMEOUT_S + 10)
    assert done.returncode == 0 or b"timed out" in err, err  # a cut drops: never refused
    return done.returncode == 0


def serve_on_every_host(hosts: Hosts) -> None:
    """A TCP answering server on each host, waited for from the controller (which reaches every host)."""
    for h in hosts.names:
        hosts.run(h, [sys.executable, "-c", SERVER])
    deadline = time.monotonic() + READY_TIMEOUT_S
    for h in hosts.names:
        while True:
            try:
                socket.create_connection((hosts.addr(h), PORT), timeout=CONNECT_TIMEOUT_S).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"the server on {h} did not start"
                time.sleep(0.05)


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_cut_stops_tcp_between_two_hosts_only_and_heal_restores_it():
    with Hosts("msnet1", 3, "10.77.41.0/24") as hosts:
        serve_on_every_host(hosts)
        assert reaches(hosts, "h1", "h2") and reaches(hosts, "h2", "h1")
        hosts.cut("h1", "h2")
        t0 = time.monotonic()
        assert not reaches(hosts, "h1", "h2")
        assert time.monotonic() - t0 >= CONNECT_TIMEOUT_S  # dropped, so the connect waited out its timeout
        assert not reaches(hosts, "h2", "h1")
        assert reaches(hosts, "h1", "h3") and reaches(hosts, "h3", "h2")
        hosts.heal("h1", "h2")
        assert reaches(hosts, "h1", "h2")
        hosts.isolate("h1", except_=["h3"])
        assert hosts.cuts == {frozenset(("h1", "h2"))} and reaches(hosts, "h1", "h3")
        hosts.isolate("h3")
        assert not reaches(hosts, "h3", "h2") and not reaches(hosts, "h1", "h3")
        hosts.heal_all()
        assert hosts.cuts == set() and reaches(hosts, "h1", "h2") and reaches(hosts, "h3", "h1")
    assert "msnet1-" not in namespaces()


def test_teardown_after_a_failure_and_a_stale_run_are_cleaned_up():
    with pytest.raises(RuntimeError):
        with Hosts("msnet2", 2, "10.77.42.0/24") as hosts:
            hosts.cut("h1", "h2")
            raise RuntimeError("the test failed")
    assert "msnet2-" not in namespaces()
    left = Hosts("msnet2", 2, "10.77.42.0/24").start()  # a run that died without its teardown
    sleeper = left.run("h1", ["sleep", "60"])
    # in the namespace before the next run looks for what was left there (ip netns exec, loaded, is slow to enter)
    deadline = time.monotonic() + 30
    while str(sleeper.pid) not in subprocess.run(["ip", "netns", "pids", "msnet2-h1"], capture_output=True,
                                                 text=True).stdout.split():
        assert time.monotonic() < deadline, "the sleeper never entered msnet2-h1"
        time.sleep(0.05)
    with Hosts("msnet2", 2, "10.77.42.0/24") as hosts:  # removes it, its process included
        assert sleeper.wait(5) == -9
        serve_on_every_host(hosts)
        assert reaches(hosts, "h1", "h2")
    assert "msnet2-" not in namespaces()


def test_etcd_with_one_member_isolated_two_keep_quorum_the_isolated_one_serves_no_linearizable_read(tmp_path):
    with Hosts("msnet3", 3, "10.77.43.0/24") as hosts, \
            EtcdCluster(tmp_path, hosts=[hosts.addr(h) for h in hosts.names],
                        prefixes=[hosts.prefix_argv(h) for h in hosts.names]) as etcd:
        two, alone = EtcdClient(etcd.client_urls[:2]), EtcdClient(etcd.client_urls[2:])
        asyncio.run(isolated_member_scenario(hosts, two, alone))


async def isolated_member_scenario(hosts: Hosts, two: EtcdClient, alone: EtcdClient) -> None:
    await two.put("k", "1")
    async with alone.watch_prefix("w/") as watch:
        hosts.isolate("h3")
        await until_written(two, "k", "2")
        with pytest.raises(CoordinatorUnavailable, match=alone.urls[0]):
            await alone.get("k")  # linearizable: needs the leader, which it cannot reach
        assert (await alone.get("k", serializable=True)).value == b"1"  # its own stale copy
        with pytest.raises(CoordinatorUnavailable, match="read again and watch from revision"):
            await asyncio.wait_for(anext(watch), WATCH_END_BOUND_S)  # no leader: etcd ends the stream
        assert [m.healthy for m in await EtcdClient(two.urls + alone.urls).health()] == [True, True, False]
    hosts.heal_all()
    deadline = time.monotonic() + QUORUM_BOUND_S
    while True:
        try:
            assert (await alone.get("k")).value == b"2"  # back with the others: it caught up
            return
        except CoordinatorUnavailable:
            assert time.monotonic() < deadline, "the healed member did not serve a linearizable read"


async def until_written(client: EtcdClient, key: str, value: str) -> None:
    """Put until it succeeds (a leader isolated with h3 is replaced first), within QUORUM_BOUND_S."""
    deadline = time.monotonic() + QUORUM_BOUND_S
    while True:
        try:
            await client.put(key, value)
            return
        except CoordinatorUnavailable:
            assert time.monotonic() < deadline, "the two connected members lost quorum"
