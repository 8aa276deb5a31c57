"""Routing: a key's partition (pinned: it must never change), the route table and the client's cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multisite.errors import ConfigError, KeyTypeError, WrongPartition
from multisite.grid.routing import (ROUTING_HASH, Next, Route, RouteCache, RouteTable, check_in_partition,
                                    partition_of, partition_of_subscript, routing_partition, table_from_routes)

# Pinned: these are where data lives on disk. A change here moves every key of every grid; if this test
# fails, the hash changed, not the test.
PINNED = [("a", 3, 667), ("b", 3, 163), ("alice", 1, 785), ("bob", 2, 250), (0, 6, 366), (1, 5, 717),
          (42, 6, 654), (-7, 3, 1011), ("", 2, 338), ("ü", 6, 518)]


@pytest.mark.parametrize("first,p8,p1024", PINNED)
def test_partition_values_are_pinned(first, p8, p1024):
    assert partition_of_subscript(first, 8) == p8
    assert partition_of_subscript(first, 1024) == p1024
    assert partition_of((first, "x", 3), 8) == p8


def test_the_scheme_has_a_name():
    assert ROUTING_HASH == "blake2b-8/first-subscript"


def test_the_partition_does_not_depend_on_the_process_hash_seed():
    code = "from multisite.grid.routing import partition_of_subscript as p; print([p(k, 1024) for k in ('a', 'alice', 'ü')])"
    outs = set()
    for seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert outs == {"[667, 785, 518]\n"}


@given(st.one_of(st.text(), st.integers(-(2**63), 2**63 - 1)), st.integers(1, 4096),
       st.lists(st.one_of(st.text(max_size=5), st.integers(-5, 5)), max_size=3))
def test_every_key_under_one_first_subscript_is_in_one_partition(first, n, rest):
    p = partition_of_subscript(first, n)
    assert 0 <= p < n
    assert partition_of((first, *rest), n) == p
    assert routing_partition(first, n) == routing_partition((first, *rest), n) == p


def test_keys_spread_evenly():
    counts = [0] * 8
    for i in range(8000):
        counts[partition_of_subscript(f"user{i}", 8)] += 1
    assert min(counts) > 900 and max(counts) < 1100


def test_bad_keys_and_counts_are_refused():
    with pytest.raises(KeyTypeError):
        partition_of((), 8)
    with pytest.raises(KeyTypeError):
        partition_of(("a", 1.5), 8)
    with pytest.raises(KeyTypeError):
        routing_partition(1.5, 8)
    with pytest.raises(KeyTypeError):
        routing_partition(True, 8)
    with pytest.raises(ConfigError):
        partition_of_subscript("a", 0)


def test_a_transaction_touches_one_partition():
    assert check_in_partition(["a", 1], 3, 8) == ("a", 1)
    with pytest.raises(WrongPartition, match=r"key \('alice',\) is in partition 1, not in partition 3") as e:
        check_in_partition(("alice",), 3, 8)
    assert e.value.code == "WRONG_PARTITION" and e.value.details["partition"] == 1


# -- the table -----------------------------------------------------------------------------------------

def _table(version=1, routes=(("h1:1", 1), ("h2:1", 1), ("h1:1", 2), (None, 0))):
    return table_from_routes("g", version, routes)


def test_table_lookups():
    t = _table()
    assert t.route(2) == Route(2, "h1:1", 2)
    assert t.primary_for(3) is None
    assert t.partitions_of("h1:1") == (0, 2)
    assert t.route_for_key(("b",)) == t.route(partition_of(("b",), 4))
    with pytest.raises(WrongPartition):
        t.route(4)
    assert RouteTable.from_dict(t.to_dict()) == t
    assert t.to_dict()["routes"][0] == {"partition": 0, "primary": "h1:1", "epoch": 1}


def test_a_table_lists_every_partition_in_order():
    with pytest.raises(ConfigError, match="0..1"):
        RouteTable("g", 2, 1, (Route(1, "x", 0), Route(0, "y", 0)))


def test_cache_needs_a_table_first_and_a_primary():
    c = RouteCache("g")
    assert c.needs_refresh() and c.route_for_key(("a",)) is None
    assert c.install(_table())
    assert c.route(0) == Route(0, "h1:1", 1)
    assert c.route(3) is None and c.needs_refresh(3) and c.needs_refresh()
    assert not c.needs_refresh(0)


def test_cache_never_goes_back_to_an_older_table():
    c = RouteCache("g", _table(version=5))
    assert not c.install(_table(version=4, routes=(("old", 9),) * 4))
    assert c.route(0).primary == "h1:1"
    assert c.install(_table(version=5))  # the same version again is harmless


def test_cache_refuses_another_grid_another_hash_and_another_partition_count():
    c = RouteCache("g", _table())
    with pytest.raises(ConfigError, match="grid 'other'"):
        c.install(table_from_routes("other", 9, [("x", 0)] * 4))
    with pytest.raises(ConfigError, match="upgrade the client"):
        c.install(RouteTable("g", 1, 9, (Route(0, "x", 0),), hash="crc32/v0"))
    with pytest.raises(ConfigError, match="fixed for its life"):
        c.install(table_from_routes("g", 9, [("x", 0)] * 5))


def test_not_primary_from_a_container_that_is_behind_means_wait():
    c = RouteCache("g", _table())
    assert c.not_primary(2, container_epoch=1) is Next.WAIT  # route says epoch 2: it has not caught up
    assert c.route(2) is not None


def test_not_primary_from_a_container_that_knows_as_much_or_more_means_refresh_until_the_epoch_moves():
    c = RouteCache("g", _table())
    assert c.not_primary(1, container_epoch=1) is Next.WAIT  # the route's epoch: still taking over
    assert c.not_primary(1, container_epoch=2) is Next.REFRESH
    assert c.route(1) is None and c.stale() == (1,)
    c.install(_table(version=2))  # the catalog has not moved it yet: still stale
    assert c.route(1) is None
    c.install(_table(version=3, routes=(("h1:1", 1), ("h3:1", 2), ("h1:1", 2), (None, 0))))
    assert c.route(1) == Route(1, "h3:1", 2) and c.stale() == ()


def test_an_unreachable_container_makes_its_partitions_stale_until_the_next_table():
    c = RouteCache("g", _table())
    assert c.unreachable("h1:1") == (0, 2)
    assert c.route(0) is None and c.route(2) is None and c.route(1) is not None
    c.install(_table(version=1))  # the same routes: the container may only have reset a connection
    assert c.stale() == () and c.route(0).primary == "h1:1"
    c.unreachable("h1:1")
    c.install(_table(version=2, routes=(("h2:1", 2), ("h2:1", 1), ("h2:1", 3), (None, 0))))
    assert c.stale() == () and c.route(0).primary == "h2:1"
    assert RouteCache("g").unreachable("h1:1") == ()
