"""Operator commands with real processes (issue 24): `grid drain` moves a container's shards away under a
writer and loses nothing; `grid promote --force` takes over a partition whose primary was lost while no
synchronous replica was current, with its warning; on etcd the leading catalog takes the operation
whichever catalog is asked first."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from click.testing import CliRunner

from multisite.cli.main import cli
from multisite.errors import ReplicationVotedToRollback
from multisite.testing.grid import GridCluster
from multisite.testing.grid_checks import GridWriter, check_grid


def run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def shards_of(st: dict, name: str) -> int:
    return next(c["shards"] for c in st["containers"] if c["name"] == name)


def test_drain_moves_a_containers_shards_away_under_a_writer(tmp_path):
    g = GridCluster(tmp_path, partitions=4, min_sync=1, max_sync=1, max_async=1)
    w = None
    try:
        g.start_catalog()
        for n in ("c1", "c2", "c3", "c4"):
            g.start_container(n)
        g.wait_settled(30)
        w = GridWriter(g)
        w.start()
        time.sleep(1.0)
        out = run("grid", "drain", "c1", "--catalog", g.address)
        assert "draining" in out
        st = g.wait("c1 emptied", lambda: (s := g.settled()) and shards_of(s, "c1") == 0 and s, timeout_s=30)
        assert next(c for c in st["containers"] if c["name"] == "c1")["draining"]
        assert not st["under_replicated"]
        time.sleep(0.5)
        run("grid", "drain", "c1", "--catalog", g.address, "--undo")
        w.stop()
        st = g.wait("every replica caught up", g.caught_up, timeout_s=30)
    finally:
        if w is not None:
            w.stop()
        g.stop_all()
    summary = check_grid(g, w, st)
    assert summary["acked"] > 100, summary


def test_force_promote_a_stale_replica_of_a_partition_whose_primary_is_lost(tmp_path):
    g = GridCluster(tmp_path, partitions=1, min_sync=1, max_sync=1, max_async=0, heartbeat_timeout_s=5.0)
    try:
        g.start_catalog()
        g.start_container("a")
        g.start_container("b")
        st = g.wait_settled(30)
        primary, replica = st["partitions"][0]["primary"], st["partitions"][0]["sync"][0]
        cl = g.client(timeout_s=10)
        for k in range(10):
            cl.put("m", k, k)
        g.signal(replica, signal.SIGSTOP)  # the vote times out: the primary stops counting it current
        try:
            with pytest.raises(ReplicationVotedToRollback):
                cl.put("m", 99, "refused")
            g.wait("the replica no longer current", lambda: g.status()["partitions"][0]["current"] == [])
            g.kill(primary)
        finally:
            g.signal(replica, signal.SIGCONT)
        g.wait("the primary lost", lambda: not next(c["up"] for c in g.status()["containers"]
                                                    if c["name"] == primary), timeout_s=20)
        st = g.status()
        assert st["partitions"][0]["primary"] == primary  # waits: promoting may lose commits
        res = CliRunner().invoke(cli, ["grid", "promote", "--catalog", g.address, "--partition", "0", "--to",
                                       replica])
        assert res.exit_code != 0 and "--force" in res.output
        out = run("grid", "promote", "--catalog", g.address, "--partition", "0", "--to", replica, "--force")
        assert "warning" in out and "may be lost" in out and primary in out
        st = g.wait("the replica promoted", lambda: (s := g.status())["partitions"][0]["primary"] == replica and s)
        assert st["partitions"][0]["epoch"] > 1
        g.start_container(primary)  # back as a replica of the new primary; commits need it (min_sync 1)
        g.wait_settled(30)
        cl2 = g.client(timeout_s=10)
        cl2.put("m", 100, "after")
        assert cl2.get("m", 5) == 5 and cl2.get("m", 100) == "after" and cl2.get("m", 99) is None
    finally:
        g.stop_all()


def test_on_etcd_the_leading_catalog_takes_the_operation(tmp_path, etcd_cluster):
    g = GridCluster(tmp_path, name="ops", partitions=2, min_sync=1, max_sync=1, max_async=0,
                    etcd=etcd_cluster.endpoints)
    try:
        g.start_catalog(name="k1")
        g.start_catalog(name="k2")
        for n in ("c1", "c2", "c3"):
            g.start_container(n)
        st = g.wait_settled(30)
        leader = st["coordination"]["leader"]
        follower = next(k for k in g.catalogs if k != leader)
        addresses = f"{g.catalogs[follower]},{g.catalogs[leader]}"  # the follower answers NOT_LEADER first
        busiest = max(st["containers"], key=lambda c: c["shards"])["name"]
        assert "draining" in run("grid", "drain", busiest, "--catalog", addresses)
        g.wait("emptied", lambda: (s := g.settled()) and shards_of(s, busiest) == 0 and s, timeout_s=30)
        done = threading.Event()
        with g.client() as cl:
            cl.put("m", 1, "still writable")
            done.set()
        assert done.is_set()
    finally:
        g.stop_all()
