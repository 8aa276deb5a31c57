"""The catalog's decisions (grid/catalog.py) and the catalog ⇄ container wire (grid/wire.py), in memory
with a fake clock: joins, heartbeat loss and promotion, restart from the state file, refusals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from multisite.errors import LocalProtocolError, RemoteProtocolError
from multisite.grid.catalog import Catalog
from multisite.grid.policy import GridPolicy, MapPolicy
from multisite.grid.wire import (GRID_WIRE_VERSION, NEED_DATA, Assignments, GridWire, Heartbeat, Refused, RefusedCode,
                                 Register, RouteRequest, Routes, Side, State, Status, StatusRequest)

POLICY = GridPolicy("orders", 8, min_sync=1, max_sync=1, max_async=1, maps=(MapPolicy("m"),))
TIMEOUT = 2.0


def reg(name, grid="orders", zone=None):
    return Register(GRID_WIRE_VERSION, grid, name, zone, name, 1024)


def beat(cat, now, *names):
    """Each named container heartbeats with seqno 0 for every shard it holds, and as a primary reports
    every synchronous replica of its partitions current (all empty, all current)."""
    for n in names:
        shards = cat.assignments_for(n).shards
        currency = {p: (s.epoch, list(s.sync_replicas)) for p, s in enumerate(cat.placement.partitions)
                    if s.primary == n}
        assert cat.heartbeat(Heartbeat(n, cat.placement.version, {p: 0 for p in shards}, currency), now) is None


def three(now=0.0):
    cat = Catalog(POLICY, now=now, heartbeat_timeout_s=TIMEOUT)
    for n in ("c1", "c2", "c3"):
        assert cat.register(reg(n), now) is None
    for _ in range(3):
        beat(cat, now, "c1", "c2", "c3")
    return cat


def check_rules(cat):
    for s in cat.placement.partitions:
        cs = s.containers()
        assert len(cs) == len(set(cs)), f"two shards of a partition in one container: {s}"


# -- wire -------------------------------------------------------------------------------------------

def pair():
    return GridWire(Side.MEMBER), GridWire(Side.CATALOG)


def deliver(src, dst, msg):
    dst.receive_data(src.send(msg))
    return dst.next_event()


def test_register_assignments_heartbeat_round_trip_in_memory():
    m, c = pair()
    r = deliver(m, c, reg("c1"))
    assert r == reg("c1") and c.state is State.REGISTERED
    a = Assignments("orders", 3, {0: "primary", 5: "sync"}, 0.5)
    assert deliver(c, m, a) == a
    hb = Heartbeat("c1", 3, {0: 12, 5: 12})
    assert deliver(m, c, hb) == hb
    assert deliver(c, m, Refused(RefusedCode.WRONG_GRID, "no")) == Refused("WRONG_GRID", "no")
    assert m.state is State.DONE and c.state is State.DONE


def test_bytes_split_anywhere_reassemble():
    m, c = pair()
    data = m.send(reg("c1")) + m.send(Heartbeat("c1", 0, {1: 2}))
    got = []
    for b in data:
        c.receive_data(bytes([b]))
        while (ev := c.next_event()) is not NEED_DATA:
            got.append(ev)
    assert got == [reg("c1"), Heartbeat("c1", 0, {1: 2})]
    c.receive_data(b"")
    assert c.next_event() is None and c.state is State.CLOSED


def test_status_exchange():
    m, c = pair()
    assert deliver(m, c, StatusRequest()) == StatusRequest()
    assert deliver(c, m, Status('{"a": 1}')).json == '{"a": 1}'


def test_a_message_out_of_turn_breaks_the_wire_for_good():
    m, _ = pair()
    with pytest.raises(LocalProtocolError, match="may not send Heartbeat in state idle"):
        m.send(Heartbeat("c1", 0))
    assert m.state is State.ERROR
    with pytest.raises(LocalProtocolError, match="broken"):
        m.send(reg("c1"))
    c2 = GridWire(Side.CATALOG)
    c2.receive_data(GridWire(Side.MEMBER).send(StatusRequest()))
    c2.next_event()
    c2.receive_data(GridWire(Side.MEMBER).send(reg("x")))
    with pytest.raises(RemoteProtocolError, match="Register in state asked"):
        c2.next_event()


@pytest.mark.parametrize("junk,match", [(b"\xff\xff\xff\x7f\x01", "grid frame of"), (b"\x02\x00\x00\x00\x63\x00", "unknown"),
                                        (b"\x02\x00\x00\x00\x01\xc1", "malformed"), (b"GET / HTTP/1.0\r\n", "grid frame of")])
def test_garbage_is_refused(junk, match):
    c = GridWire(Side.CATALOG)
    c.receive_data(junk)
    with pytest.raises(RemoteProtocolError, match=match):
        c.next_event()
    assert c.state is State.ERROR


def test_a_close_mid_frame_is_an_error():
    c = GridWire(Side.CATALOG)
    c.receive_data(GridWire(Side.MEMBER).send(reg("c1"))[:-1])
    c.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        c.next_event()


# -- catalog decisions ------------------------------------------------------------------------------

def test_three_containers_place_every_partition_on_three_distinct_containers():
    cat = three()
    check_rules(cat)
    for s in cat.placement.partitions:
        assert s.primary and len(s.sync_replicas) == 1 and len(s.async_replicas) == 1
        assert s.current == frozenset(s.sync_replicas)  # the primaries reported them current
    st = cat.status(0.0)
    assert st["under_replicated"] == []
    prim = {c["name"]: c["primaries"] for c in st["containers"]}
    assert max(prim.values()) - min(v for v in prim.values() if v) <= 1  # primaries evened out by swaps
    assert cat.assignments_for("c1").shards and cat.assignments_for("nobody").shards == {}


def test_a_silent_container_is_lost_after_the_timeout_and_its_primaries_promoted():
    cat = three()
    victim = cat.placement.partitions[0].primary
    others = [c for c in ("c1", "c2", "c3") if c != victim]
    lost_prims = [i for i, s in enumerate(cat.placement.partitions) if s.primary == victim]
    cat.drain_log()
    beat(cat, 1.9, *others)
    assert cat.tick(1.9) == []  # within the timeout: nothing happens
    beat(cat, 2.5, *others)
    assert cat.tick(2.5) == [victim]
    check_rules(cat)
    for i in lost_prims:
        s = cat.placement.partitions[i]
        assert s.primary in others and s.epoch >= 2
    assert all(victim not in s.containers() for s in cat.placement.partitions)
    log = "\n".join(cat.drain_log())
    assert f"container {victim} lost" in log and "promote" in log
    st = cat.status(2.5)
    down = {c["name"]: c["up"] for c in st["containers"]}
    assert down[victim] is False
    assert st["under_replicated"] and all("only 2 container(s) are up" in u["reason"] for u in st["under_replicated"])


def test_no_promotion_without_a_current_sync_replica():
    cat = Catalog(POLICY, now=0.0, heartbeat_timeout_s=TIMEOUT)
    for n in ("c1", "c2"):
        cat.register(reg(n), 0.0)
    # c2 never heartbeats seqnos: its sync replicas are not current; c1 (all primaries) is lost
    assert all(not s.current for s in cat.placement.partitions)
    cat.heartbeat(Heartbeat("c2", 0, {}), 2.5)
    cat.tick(2.5)
    assert all(s.primary == "c1" for s in cat.placement.partitions)
    assert any("waiting for c1 to return" in u["reason"] for u in cat.status(2.5)["under_replicated"])


def test_currency_is_the_primarys_word_in_its_epoch_only():
    cat = three()
    i, s = next((i, s) for i, s in enumerate(cat.placement.partitions) if s.sync_replicas)
    r = s.sync_replicas[0]
    assert r in s.current
    other = next(c for c in ("c1", "c2", "c3") if c != s.primary)
    # a container that is not the primary (a deposed one) cannot change it, nor a report of another epoch
    cat.heartbeat(Heartbeat(other, 0, {}, {i: (s.epoch, [])}), 0.1)
    cat.heartbeat(Heartbeat(s.primary, 0, {}, {i: (s.epoch - 1, [])}), 0.1)
    assert r in cat.placement.partitions[i].current
    # the primary reports it behind: not current (and not promotable) until it reports it again
    cat.heartbeat(Heartbeat(s.primary, 0, {}, {i: (s.epoch, [])}), 0.2)
    assert r not in cat.placement.partitions[i].current
    cat.heartbeat(Heartbeat(s.primary, 0, {}, {i: (s.epoch, [r, "not-a-replica"])}), 0.3)
    assert cat.placement.partitions[i].current == frozenset({r})
    assert cat.assignments_for(r).views[i].primary == s.primary and cat.assignments_for(r).views[i].min_sync == 1


def test_another_grids_container_is_refused_and_not_a_member():
    cat = Catalog(POLICY, now=0.0)
    r = cat.register(reg("x", grid="billing"), 0.0)
    assert r.code == RefusedCode.WRONG_GRID and "belongs to grid 'billing'" in r.message and "'orders'" in r.message
    assert cat.members == {}
    assert cat.register(reg("x", grid=""), 0.0) is None  # a new container joins the catalog's grid


def test_name_in_use_old_version_and_unregistered_heartbeat_are_refused():
    cat = Catalog(POLICY, now=0.0, heartbeat_timeout_s=TIMEOUT)
    cat.register(reg("c1"), 0.0)
    other = Register(GRID_WIRE_VERSION, "orders", "c1", None, "elsewhere:1", 1024)
    assert cat.register(other, 1.0).code == RefusedCode.NAME_IN_USE
    assert cat.register(reg("c1"), 1.0) is None  # the same container again (a reconnect)
    assert cat.register(Register(99, "orders", "c9", None, "c9", 1), 0.0).code == RefusedCode.VERSION
    assert cat.heartbeat(Heartbeat("ghost", 0), 0.0).code == RefusedCode.NOT_REGISTERED


def test_restart_from_the_state_file_keeps_the_placement():
    cat = three()
    state = json.loads(json.dumps(cat.state_dict()))
    again = Catalog(POLICY, now=100.0, heartbeat_timeout_s=TIMEOUT, state=state)
    assert again.placement == cat.placement
    assert {m["name"]: m["up"] for m in again.status(100.0)["containers"]} == {"c1": True, "c2": True, "c3": True}
    for n in ("c1", "c2", "c3"):
        assert again.register(reg(n), 100.5) is None
    beat(again, 101.0, "c1", "c2", "c3")
    assert again.tick(101.0) == [] and again.placement == cat.placement  # the version too: nothing moved


def test_restart_with_another_grid_or_partition_count_is_refused():
    state = three().state_dict()
    with pytest.raises(Exception, match="state is of grid 'orders'"):
        Catalog(GridPolicy("other", 8, maps=(MapPolicy("m"),)), now=0.0, state=state)
    with pytest.raises(Exception, match="fixed for its life"):
        Catalog(GridPolicy("orders", 4, maps=(MapPolicy("m"),)), now=0.0, state=state)


def test_a_lost_container_that_returns_takes_shards_again():
    cat = three()
    victim = "c3"
    beat(cat, 2.5, "c1", "c2")
    cat.tick(2.5)
    assert cat.assignments_for(victim).shards == {}
    assert cat.register(reg(victim), 3.0) is None
    beat(cat, 3.0, "c1", "c2", "c3")
    assert cat.assignments_for(victim).shards
    check_rules(cat)
    assert cat.status(3.0)["under_replicated"] == []


def test_a_container_lost_before_a_restart_stays_lost_after_it():
    cat = three()
    beat(cat, 2.5, "c1", "c2")
    cat.tick(2.5)
    again = Catalog(POLICY, now=10.0, heartbeat_timeout_s=TIMEOUT, state=json.loads(json.dumps(cat.state_dict())))
    assert again.placement == cat.placement  # no shard placed on c3 for the length of its grace
    assert {m["name"]: m["up"] for m in again.status(10.0)["containers"]} == {"c1": True, "c2": True, "c3": False}


def test_a_container_outside_the_policys_zones_takes_no_shards_and_status_says_why():
    pol = GridPolicy("orders", 2, min_sync=1, max_sync=1, zones=("a", "b"), maps=(MapPolicy("m"),))
    cat = Catalog(pol, now=0.0)
    cat.register(reg("c1", zone="a"), 0.0)
    cat.register(reg("c2", zone="b"), 0.0)
    cat.register(reg("c3", zone="z"), 0.0)
    st = cat.status(0.0)
    assert st["ignored"] == [{"container": "c3", "why": "zone 'z' is not one of the policy's zones (a, b)"}]
    assert cat.assignments_for("c3").shards == {} and st["under_replicated"] == []


@settings(max_examples=300, deadline=None)
@given(hst.binary(max_size=64), hst.integers(min_value=1, max_value=8))
def test_fuzz_any_bytes_give_messages_need_data_or_a_remote_protocol_error(junk, chunk):
    c = GridWire(Side.CATALOG)
    data = GridWire(Side.MEMBER).send(reg("c1")) + junk
    try:
        for i in range(0, len(data), chunk):
            c.receive_data(data[i:i + chunk])
            while (ev := c.next_event()) is not NEED_DATA:
                assert ev is None or isinstance(ev, (Register, Heartbeat))
                if ev is None:
                    break
        c.receive_data(b"")
        c.next_event()
    except RemoteProtocolError:
        assert c.state is State.ERROR


def test_the_route_table_gives_primaries_by_address_and_none_while_down():
    cat = Catalog(POLICY, now=0.0, heartbeat_timeout_s=TIMEOUT)
    for n in ("c1", "c2"):
        cat.register(Register(GRID_WIRE_VERSION, "orders", n, None, f"10.0.0.{n[1]}:7000", 1024), 0.0)
    t = cat.route_table()
    assert t.grid == "orders" and t.version == cat.placement.version and t.partitions == 8
    assert {t.primary_for(i) for i in range(8)} <= {"10.0.0.1:7000", "10.0.0.2:7000"}
    assert cat.status(0.0)["routes"] == t.to_dict()
    cat.heartbeat(Heartbeat("c2", 0, {}), 2.5)
    cat.tick(2.5)  # c1 lost; c2's sync replicas were never reported current: no promotion
    t2 = cat.route_table()
    assert all(t2.primary_for(i) is None for i in range(8) if cat.placement.partitions[i].primary == "c1")


def test_route_exchange_on_the_wire():
    m, c = pair()
    assert deliver(m, c, RouteRequest()) == RouteRequest()
    assert deliver(c, m, Routes("{}")).json == "{}" and m.state is State.DONE
