"""A network partition across hosts (issue 24): a container holding primaries cut off from etcd and from
the other containers and catalogs, while its clients still reach it.

Seven network namespaces joined by a bridge (``testing/netns.py``): three etcd members (e1, e2, e3),
a catalog (K) and three containers (A, B, C) on a grid coordinated through etcd. The writer, in the
test's own namespace, reaches every process. The container holding partition 0's primary is cut
from every other host (nft drops, both ways) but not from the writer. Checked:

- its primaries stop taking commits within its lease (the writer is answered UNAVAILABLE there; it
  never heard from etcd that it lost anything);
- the partitions are promoted elsewhere and the writer's commits go on there;
- after the heal it registers again, its shards rejoin as replicas of the new primaries (cutting back
  anything they held past them) and catch up;
- from the journals (``check_grid``): no acknowledged commit lost, no two acknowledged at one
  partition's seqno (two primaries never took commits at once), nothing refused present, every
  partition's shards identical.
"""

from __future__ import annotations

import time

import pytest

from multisite.grid.routing import partition_of
from multisite.grid.server.client import _Conn
from multisite.grid.shard_wire import Commit, FailCode
from multisite.journal.records import SET
from multisite.testing.etcd import EtcdCluster
from multisite.testing.grid import GridCluster
from multisite.testing.grid_checks import GridWriter, check_grid, first_commits
from multisite.testing.netns import Hosts, netns_unavailable
from multisite.values import encode_value

WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}"),
              pytest.mark.timeout(300)]

ETCD_HOSTS = ["e1", "e2", "e3"]
CONTAINERS = ["A", "B", "C"]
LEASE_TTL_S = 1.0
FENCE_S = LEASE_TTL_S * 0.75  # a renewal sent at t lets the container commit until t + 3/4 TTL
SLACK_S = 0.3  # a batch taken just before the deadline, answered after it


def probe(g: GridCluster, status: dict, container: str, partition: int):
    """One commit of ``partition`` sent straight to ``container``, whatever the routes say; its answer."""
    address = next(c["address"] for c in status["containers"] if c["name"] == container)
    key = next(k for k in range(1000) if partition_of((k,), g.partitions) == partition)
    conn = _Conn(address, g.name)
    try:
        return conn.ask(lambda rid: Commit(rid, partition, 0, [(SET, "m", [key], encode_value("probe"))]))
    finally:
        conn.close()


def test_a_container_cut_off_stops_within_its_lease_is_replaced_and_rejoins(tmp_path):
    with Hosts("msgrid", [*ETCD_HOSTS, "K", *CONTAINERS]) as hosts, \
            EtcdCluster(tmp_path, hosts=[hosts.address(h) for h in ETCD_HOSTS],
                        prefixes=[hosts.prefix(h) for h in ETCD_HOSTS]) as etcd:
        g = GridCluster(tmp_path / "grid", name="cut", partitions=4, etcd=etcd.endpoints,
                        lease_ttl_s=LEASE_TTL_S, hosts=hosts, insecure=True)  # (TLS: test_grid_tls.py)
        w = None
        try:
            g.start_catalog(name="K", host="K", listen=f"{hosts.address('K')}:0")
            for c in CONTAINERS:
                g.start_container(c, host=c, listen=f"{hosts.address(c)}:0")
            g.wait_settled(40)
            w = GridWriter(g, timeout_s=10.0)
            w.start()
            deadline = time.monotonic() + 30
            while w.counts["acked"] < 100:
                assert time.monotonic() < deadline, w.counts
                time.sleep(0.05)

            before = g.status()
            victim = before["partitions"][0]["primary"]
            led = [p["partition"] for p in before["partitions"] if p["primary"] == victim]
            cut = time.monotonic()
            hosts.isolate(victim)  # from etcd, the catalog and the other containers; the writer still reaches it
            time.sleep(max(0.0, cut + FENCE_S + SLACK_S - time.monotonic()))
            refused = probe(g, before, victim, led[0])  # asked directly, past its deadline: it refuses by itself
            assert refused.code in (FailCode.UNAVAILABLE, FailCode.NOT_PRIMARY), refused
            after = g.wait("its partitions promoted elsewhere",
                           lambda: all((s := g.status())["partitions"][p]["primary"] != victim for p in led) and s,
                           timeout_s=30)
            deadline = time.monotonic() + 20
            while (resumed := first_commits(w, cut, 4)) and any(resumed[p] is None for p in led):
                assert time.monotonic() < deadline, (resumed, w.counts, w.errors[-3:])
                time.sleep(0.05)

            hosts.heal_all()
            g.wait("the cut-off container back, holding shards again",
                   lambda: (s := g.settled()) and any(c["name"] == victim and c["up"] and c["shards"]
                                                      for c in s["containers"]) and s, timeout_s=60)
            time.sleep(0.5)
            w.stop()
            st = g.wait("every replica caught up", g.caught_up, timeout_s=60)
            assert any(victim in p["sync"] + p["async"] or p["primary"] == victim for p in st["partitions"])
        finally:
            if w is not None:
                w.stop()
            hosts.heal_all()
            g.stop_all()
        summary = check_grid(g, w, st)
        print(summary, "promoted", [(p, after["partitions"][p]["primary"]) for p in led],
              "first commits after the cut", resumed)
