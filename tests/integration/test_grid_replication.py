"""Replication between a partition's shards, as real processes: the minSyncReplica vote (min_sync 0, 1
and 2, replicas stopped and restarted), what a rolled-back commit leaves (nothing, also after restarts),
asynchronous replicas in commit order with journals identical to the primary's, a checkpoint copy
under load, a catalog restart under a writer, and requests the grid refuses."""

from __future__ import annotations

import threading
import time

import pytest

from multisite.errors import CommitOutcomeUnknown, GridUnavailable, ReplicationVotedToRollback, WrongPartition
from multisite.journal.reader import iter_frames
from multisite.testing.grid import GridCluster


def shards_of(st: dict, p: int) -> list[str]:
    part = st["partitions"][p]
    return [part["primary"], *part["sync"], *part["async"]]


def assert_partitions_identical(g: GridCluster, st: dict, acked: dict | None = None, absent=()) -> None:
    """Stop everything, then compare each partition's placed shards key by key."""
    g.stop_all()
    states = g.shard_states()
    for p in range(g.partitions):
        placed = shards_of(st, p)
        rows = [states[p][c]["rows"] for c in placed]
        seqnos = [states[p][c]["seqno"] for c in placed]
        assert len(set(seqnos)) == 1, (p, dict(zip(placed, seqnos)))
        assert all(r == rows[0] for r in rows), p
    merged = {k: v for p in states for c in shards_of(st, p) for k, v in states[p][c]["rows"].items()}
    for k, v in (acked or {}).items():
        assert merged.get((k,)) == v, (k, v, merged.get((k,)))
    for k in absent:
        for p in states:
            for c, s in states[p].items():
                assert (k,) not in s["rows"], (k, p, c)


def test_min_sync_1_refuses_without_its_replica_and_leaves_no_trace(make):
    g = make(partitions=2, min_sync=1, max_sync=1, max_async=0)
    g.start_catalog()
    g.start_container("a")
    g.start_container("b")
    g.wait_settled()
    cl = g.client(timeout_s=10)
    acked = {}
    for i in range(200):
        cl.put("m", i, i * 10)
        acked[i] = i * 10
    st = g.wait("replicas caught up", g.caught_up)
    # stop the container holding partition 0's sync replica; write to partition 0 only (the stopped
    # container may hold other partitions' primaries)
    replica = st["partitions"][0]["sync"][0]
    keys0 = [k for k in range(1000, 100000) if cl.partition_of((k,)) == 0]
    g.stop(replica)
    refused = []
    deadline = time.monotonic() + 10
    while not refused and time.monotonic() < deadline:
        try:
            cl.put("m", keys0[0], "never")
            acked[keys0[0]] = "never"  # committed before the primary noticed the replica went
        except ReplicationVotedToRollback as e:
            refused.append(e)
    assert refused and refused[0].min_sync == 1 and refused[0].commit_votes == 0
    assert cl.get("m", keys0[0]) == acked.get(keys0[0])
    # what rolled back is nowhere, also after every process restarts; the replica catches up and votes again
    key = keys0[1]
    with pytest.raises(ReplicationVotedToRollback):
        cl.put("m", key, "refused")
    assert cl.get("m", key) is None
    g.start_container(replica)
    g.wait("the replica current again", lambda: g.caught_up())
    cl.put("m", 6000, "after")
    acked[6000] = "after"
    st = g.wait("replicas caught up", g.caught_up)
    cl.close()
    assert_partitions_identical(g, st, acked, absent=[key])
    g.start_catalog()
    for c in ("a", "b"):
        g.start_container(c)
    g.wait_settled()
    with g.client() as cl2:
        assert cl2.get("m", key) is None and cl2.get("m", 6000) == "after"


def test_min_sync_0_commits_on_without_replicas_and_min_sync_2_needs_both(make):
    g0 = make(partitions=1, min_sync=0, max_sync=1, max_async=0)
    g0.start_catalog()
    g0.start_container("a")
    g0.start_container("b")
    st = g0.wait_settled()
    assert g0.status()["partitions"][0]["loss_window"].startswith("min_sync is 0")
    g0.stop(st["partitions"][0]["sync"][0])
    with g0.client() as cl:
        for i in range(20):
            cl.put("m", i, i)  # the primary never waits for a replica that is not there
        assert cl.get("m", 19) == 19

    g2 = make(partitions=1, min_sync=2, max_sync=2, max_async=0)
    g2.start_catalog()
    for c in ("a", "b", "c"):
        g2.start_container(c)
    st = g2.wait_settled()
    with g2.client(timeout_s=10) as cl:
        cl.put("m", 1, "both voted")
        g2.kill(st["partitions"][0]["sync"][1])
        with pytest.raises(ReplicationVotedToRollback) as e:
            for i in range(200):  # the first commits after the kill may still see both links
                cl.put("m", 100 + i, "one voter")
                time.sleep(0.01)
        assert e.value.min_sync == 2 and e.value.commit_votes <= 1
        assert cl.get("m", 1) == "both voted"


def test_async_replicas_get_every_commit_in_order_with_the_primarys_journal(make):
    g = make(partitions=2, min_sync=1, max_sync=1, max_async=1)
    g.start_catalog()
    for c in ("a", "b", "c"):
        g.start_container(c)
    g.wait_settled()
    with g.client() as cl:
        for i in range(300):
            with cl.transaction(i) as tx:
                tx.put("m", i, {"n": i})
        for i in range(0, 300, 3):
            cl.remove("m", i)
    st = g.wait("replicas caught up", g.caught_up)
    g.stop_all()
    for p in range(2):
        journals = []
        for c in shards_of(st, p):
            frames = [(s, bytes(f)) for s, f in iter_frames(g.shard_dir(c, p) / "journal", 1)]
            assert [s for s, _ in frames] == list(range(1, len(frames) + 1))  # every seqno, in order
            journals.append(frames)
        assert all(j == journals[0] for j in journals)  # byte for byte the primary's
    assert_partitions_identical(g, st, {i: {"n": i} for i in range(300) if i % 3})


def test_a_new_replica_copies_a_checkpoint_while_the_primary_commits(make):
    g = make(partitions=1, min_sync=0, max_sync=0, max_async=1, checkpoint_after=50)
    g.start_catalog()
    g.start_container("a")
    g.wait_settled()
    cl = g.client()
    for t in range(40):
        with cl.transaction(1) as tx:
            for i in range(100):
                tx.put("m", (1, t * 100 + i), t)
    for i in range(100):
        cl.put("m", 2, i)  # 140 transactions: more than checkpoint_after behind a new replica
    stop = threading.Event()
    acked = {}

    def writer():
        n = 0
        while not stop.is_set():
            cl.put("m", 3, n)
            acked[3] = n
            n += 1
    w = threading.Thread(target=writer)
    w.start()
    try:
        g.start_container("b")
        time.sleep(1.0)
    finally:
        stop.set()
        w.join()
    g.wait("the new replica caught up", g.caught_up)
    log = (g.root / "a" / "log" / "container.log").read_text()
    assert "checkpoint at seqno" in log
    assert "checkpoint installed" in (g.root / "b" / "log" / "container.log").read_text()
    cl.close()
    g.stop_all()
    states = g.shard_states()
    assert states[0]["a"]["rows"] == states[0]["b"]["rows"] and states[0]["a"]["seqno"] == states[0]["b"]["seqno"]
    assert len(states[0]["b"]["rows"]) == 4002 and states[0]["b"]["rows"][(3,)] == acked[3]


def test_commits_pause_while_the_catalog_restarts_and_go_on_after(make):
    g = make(partitions=2, min_sync=1, max_sync=1, max_async=0)
    g.start_catalog()
    g.start_container("a")
    g.start_container("b")
    g.wait_settled()
    with g.client(timeout_s=20) as cl:
        cl.put("m", 1, "before")
        g.kill("catalog")
        time.sleep(g.heartbeat_timeout_s)  # past the lease: the primaries refuse (the client retries)
        t = threading.Timer(0.5, g.start_catalog)
        t.start()
        cl.put("m", 2, "during")  # waits for the catalog, then commits
        t.join()
        assert cl.get("m", 1) == "before" and cl.get("m", 2) == "during"
    st = g.wait("replicas caught up", g.caught_up)
    assert_partitions_identical(g, st, {1: "before", 2: "during"})


def test_the_grid_refuses_what_it_cannot_take(make):
    g = make(partitions=4, min_sync=0, max_sync=0, max_async=0)
    g.start_catalog()
    g.start_container("a")
    g.wait_settled()
    with g.client(timeout_s=1.5) as cl:
        with pytest.raises(WrongPartition, match="belongs to partition"):
            with cl.transaction(1) as tx:
                for k in range(50):
                    tx.put("m", k, k)
        # a request sent to the wrong partition by a client that routes wrongly
        from multisite.grid.shard_wire import Commit
        from multisite.journal.records import SET
        from multisite.values import encode_value
        p = cl.partition_of((7,))
        done = cl._conn(cl.routes.route(p).primary).ask(
            lambda rid: Commit(rid, (p + 1) % 4, 0, [(SET, "m", [7], encode_value(1))]))
        assert done.code == "WRONG_PARTITION"
        g.kill("a")
        with pytest.raises((GridUnavailable, CommitOutcomeUnknown)):
            cl.put("m", 1, 1)
