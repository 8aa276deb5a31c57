"""Operator commands' decisions (issue 24), in the catalog with a fake clock: draining a container
(its primaries handed to current synchronous replicas, its replicas placed elsewhere, never a lossy
promotion), and force-promoting a stale replica of a partition whose primary is lost (with what it
may lose), refused while the primary is up."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError
from multisite.grid.catalog import Catalog
from multisite.grid.policy import GridPolicy, MapPolicy
from multisite.grid.wire import GRID_WIRE_VERSION, Heartbeat, Register

TIMEOUT = 2.0


def policy(min_sync=1, max_sync=1, max_async=1, partitions=4):
    return GridPolicy("orders", partitions, min_sync=min_sync, max_sync=max_sync, max_async=max_async,
                      maps=(MapPolicy("m"),))


def reg(name):
    return Register(GRID_WIRE_VERSION, "orders", name, None, name, 1024)


def beat(cat, now, *names, current=True, seqno=0):
    for n in names:
        shards = cat.assignments_for(n).shards
        cur = {p: (s.epoch, list(s.sync_replicas) if current else [])
               for p, s in enumerate(cat.placement.partitions) if s.primary == n}
        assert cat.heartbeat(Heartbeat(n, cat.placement.version, {p: seqno for p in shards}, cur), now) is None


def grid(names=("c1", "c2", "c3", "c4"), **kw):
    cat = Catalog(policy(**kw), now=0.0, heartbeat_timeout_s=TIMEOUT)
    for n in names:
        assert cat.register(reg(n), 0.0) is None
    for _ in range(3):
        beat(cat, 0.0, *names)
    return cat


def shards_on(cat, name):
    return [(i, s.role_of(name).value) for i, s in enumerate(cat.placement.partitions) if s.role_of(name)]


def test_a_drained_container_hands_its_primaries_over_and_its_replicas_go_elsewhere():
    cat = grid()
    assert shards_on(cat, "c1")
    epochs = {i: s.epoch for i, s in enumerate(cat.placement.partitions) if s.primary == "c1"}
    out = cat.drain("c1", True, 1.0)
    assert "draining" in out
    for _ in range(3):
        beat(cat, 1.0, "c1", "c2", "c3", "c4")
    assert shards_on(cat, "c1") == []
    for i, e in epochs.items():
        s = cat.placement.partitions[i]
        assert s.primary != "c1" and s.epoch > e
    st = cat.status(1.0)
    c1 = next(c for c in st["containers"] if c["name"] == "c1")
    assert c1["draining"] and c1["shards"] == 0 and c1["up"]
    assert cat.state_dict()["members"][0]["draining"]  # it survives a restart
    again = Catalog(policy(), now=2.0, heartbeat_timeout_s=TIMEOUT, state=cat.state_dict())
    assert again.members["c1"].draining
    cat.drain("c1", False, 3.0)
    for _ in range(3):
        beat(cat, 3.0, "c1", "c2", "c3", "c4")
    assert shards_on(cat, "c1")  # placed on again once undrained (rebalancing)


def test_a_drain_never_promotes_a_replica_that_is_not_current():
    cat = grid(names=("c1", "c2", "c3"), min_sync=0, max_sync=0, max_async=1, partitions=2)
    before = [(s.primary, s.epoch) for s in cat.placement.partitions]
    cat.drain(before[0][0], True, 1.0)
    s = cat.placement.partitions[0]
    assert (s.primary, s.epoch) == before[0]  # its async replica may lack commits: the primary stays
    assert any("draining" in sf.reason for sf in cat.last_plan.shortfalls if sf.partition == 0)


def test_drain_of_an_unknown_container_is_refused():
    with pytest.raises(ConfigError, match="no container"):
        grid().drain("nope", True, 1.0)


def stuck(min_sync=1):
    """Partition 0's primary lost while its sync replica was not current: the partition waits."""
    cat = grid(names=("c1", "c2", "c3"), partitions=1)
    s = cat.placement.partitions[0]
    beat(cat, 0.5, s.primary, current=False, seqno=40)  # it answered commits without its replica
    beat(cat, 0.5, *[c for c in ("c1", "c2", "c3") if c != s.primary], seqno=35)
    assert cat.placement.partitions[0].current == frozenset()
    for n in ("c1", "c2", "c3"):
        if n != s.primary:
            beat(cat, 2.0, n, seqno=35)
    cat.tick(3.0)
    assert cat.placement.partitions[0].primary == s.primary  # kept: promoting would lose commits
    return cat, s


def test_force_promote_takes_a_stale_replica_and_says_what_it_may_lose():
    cat, s = stuck()
    replica = s.sync_replicas[0]
    out = cat.force_promote(0, replica, 4.0)
    assert "may be lost" in out and "40" in out and "35" in out and s.primary in out
    now = cat.placement.partitions[0]
    assert now.primary == replica and now.epoch == s.epoch + 1 and now.current == frozenset()
    assert any("FORCED" in line for line in cat.drain_log())


def test_force_promote_is_refused_while_the_primary_is_up_or_for_a_container_without_the_partition():
    cat = grid(names=("c1", "c2", "c3"), partitions=1)
    s = cat.placement.partitions[0]
    with pytest.raises(ConfigError, match="is up"):
        cat.force_promote(0, s.sync_replicas[0], 1.0)
    cat2, s2 = stuck()
    outsider = next((n for n in ("c1", "c2", "c3") if n not in s2.containers()), None)
    if outsider:
        with pytest.raises(ConfigError, match="holds no replica"):
            cat2.force_promote(0, outsider, 4.0)
    with pytest.raises(ConfigError, match="partition 7"):
        cat2.force_promote(7, s2.sync_replicas[0], 4.0)
