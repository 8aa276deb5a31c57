"""Placement: the catalog's pure function, checked by example and by Hypothesis over random grids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.errors import ConfigError
from multisite.grid.placement import Container, MoveKind, Placement, Role, Shards, plan
from multisite.grid.policy import GridPolicy, MapPolicy
from multisite.grid.routing import table_from_routes

MAPS = (MapPolicy("m"),)


def _policy(partitions=8, min_sync=1, max_sync=1, max_async=1, zones=None) -> GridPolicy:
    return GridPolicy("g", partitions, min_sync, max_sync, max_async, zones, MAPS)


def _all_current(pl: Placement) -> Placement:
    for i, s in enumerate(pl.partitions):
        for r in s.sync_replicas:
            pl = pl.with_current(i, r, True, epoch=s.epoch)
    return pl


def _check_rules(policy: GridPolicy, containers, pl: Placement) -> None:
    zone = {c.name: c.zone for c in containers}
    for s in pl.partitions:
        names = s.containers()
        assert len(names) == len(set(names)), f"two shards of a partition in one container: {s}"
        assert len(s.sync_replicas) <= policy.max_sync and len(s.async_replicas) <= policy.max_async
        assert s.current <= set(s.sync_replicas)
        if policy.zones:
            live = [n for n in names if n in zone]
            assert len({zone[n] for n in live}) == len(live), f"two shards of a partition in one zone: {s}"


# -- by example ----------------------------------------------------------------------------------------

def test_a_new_grid_spreads_primaries_and_replicas():
    cs = [Container("c1"), Container("c2"), Container("c3")]
    p = plan(_policy(), cs)
    assert not p.shortfalls and p.placement.version == 1
    prim = [s.primary for s in p.placement.partitions]
    assert sorted(prim.count(c) for c in ("c1", "c2", "c3")) == [2, 3, 3]
    assert set(p.placement.shard_counts().values()) == {8}
    assert all(s.epoch == 1 and s.current == frozenset() for s in p.placement.partitions)
    table = table_from_routes("g", p.placement.version, p.placement.routes())
    assert table.primary_for(0) == prim[0]


def test_a_plan_of_its_own_result_changes_nothing():
    cs = [Container("c1"), Container("c2"), Container("c3")]
    pl = _all_current(plan(_policy(), cs).placement)
    again = plan(_policy(), cs, pl)
    assert again.moves == () and again.placement == pl


def test_a_lost_primary_is_replaced_by_its_current_synchronous_replica():
    pol = _policy(partitions=1, max_sync=2, max_async=1)
    cs = [Container(f"c{i}") for i in range(4)]
    pl = Placement((Shards("c0", ("c1", "c2"), ("c3",), frozenset({"c2"}), epoch=4),))
    p = plan(pol, cs[1:], pl)
    s = p.placement.partitions[0]
    assert s.primary == "c2" and s.epoch == 5
    promote = [m for m in p.moves if m.kind is MoveKind.PROMOTE]
    assert promote[0].container == "c2" and promote[0].source == "c0" and not promote[0].may_lose_commits
    assert s.current == frozenset()  # the other replicas re-register with the new primary


def test_with_min_sync_a_partition_without_a_current_replica_waits_for_its_primary():
    pol = _policy(partitions=1, min_sync=1, max_sync=1, max_async=1)
    pl = Placement((Shards("c0", ("c1",), ("c2",), frozenset(), epoch=3),))
    p = plan(pol, [Container("c1"), Container("c2")], pl)
    s = p.placement.partitions[0]
    assert s.primary == "c0" and s.epoch == 3  # kept: every acknowledged commit is there
    (short,) = [f for f in p.shortfalls if f.role is Role.PRIMARY]
    assert short.blocks_commits and "waiting for c0 to return" in short.reason
    back = plan(pol, [Container("c0"), Container("c1"), Container("c2")], p.placement)
    assert back.placement.partitions[0].primary == "c0" and not back.shortfalls


def test_with_min_sync_zero_any_replica_is_promoted_and_the_move_says_commits_may_be_lost():
    pol = _policy(partitions=1, min_sync=0, max_sync=1, max_async=1)
    pl = Placement((Shards("c0", (), ("c2",), frozenset(), epoch=1),))
    p = plan(pol, [Container("c1"), Container("c2")], pl)
    (m,) = [m for m in p.moves if m.kind is MoveKind.PROMOTE]
    assert m.container == "c2" and m.may_lose_commits
    assert p.placement.partitions[0].primary == "c2"


def test_a_sync_slot_with_no_free_container_takes_an_async_replica_over():
    pol = _policy(partitions=1, min_sync=0, max_sync=1, max_async=1)
    pl = Placement((Shards("c0", ("c1",), ("c2",), frozenset({"c1"}), epoch=1),))
    p = plan(pol, [Container("c0"), Container("c2")], pl)
    s = p.placement.partitions[0]
    assert s.sync_replicas == ("c2",) and s.async_replicas == ()
    assert [m.kind for m in p.moves] == [MoveKind.DROP, MoveKind.TO_SYNC]
    (f,) = p.shortfalls
    assert f.role is Role.ASYNC and "only 2 container(s) are up; a partition needs 3" in f.reason


def test_a_policy_that_cannot_be_met_says_which_partitions_and_why():
    p = plan(_policy(partitions=2, min_sync=1, max_sync=1, max_async=0), [Container("c1")])
    assert p.under_replicated() == (0, 1)
    assert all(f.role is Role.SYNC and f.blocks_commits and "ReplicationVotedToRollback" in f.reason
               for f in p.shortfalls)
    p = plan(_policy(partitions=1, min_sync=0, max_sync=0, max_async=0), [])
    (f,) = p.shortfalls
    assert f.role is Role.PRIMARY and f.reason == "no container is up"
    z = _policy(partitions=1, min_sync=0, max_sync=1, max_async=0, zones=("a", "b"))
    p = plan(z, [Container("c1", "a"), Container("c2", "a"), Container("c3", "x")])
    assert p.ignored == (("c3", "zone 'x' is not one of the policy's zones (a, b)"),)
    (f,) = p.shortfalls
    assert "only 1 zone(s) have containers up (a)" in f.reason
    full = plan(_policy(partitions=2, min_sync=0, max_sync=1, max_async=0),
                [Container("c1", capacity=1), Container("c2", capacity=2)])
    assert [f.reason for f in full.shortfalls] == ["every container that could take the shard is full (capacity)"]
    assert plan(_policy(1, 0, 0, 0), [Container("c1", capacity=0)]).ignored[0][1].startswith("capacity 0")


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigError, match="listed twice"):
        plan(_policy(), [Container("c1"), Container("c1")])
    with pytest.raises(ConfigError, match="fixed for its life"):
        plan(_policy(partitions=2), [Container("c1")], Placement.empty(3))


def test_a_joining_container_gets_replicas_then_primaries_once_current():
    # min_sync = 0: a synchronous replica may move (with min_sync = max_sync it stays until add-before-remove)
    pol = _policy(partitions=6, min_sync=0, max_sync=1, max_async=0)
    two = [Container("c1"), Container("c2")]
    pl = _all_current(plan(pol, two).placement)
    joined = plan(pol, two + [Container("c3")], pl)
    assert {m.kind for m in joined.moves} == {MoveKind.RELOCATE}
    assert joined.placement.shard_counts()["c3"] == 4
    later = plan(pol, two + [Container("c3")], _all_current(joined.placement))
    assert {m.kind for m in later.moves} == {MoveKind.SWAP}
    prim = [s.primary for s in later.placement.partitions]
    assert sorted(prim.count(c) for c in ("c1", "c2", "c3")) == [2, 2, 2]


def test_placement_round_trips_through_dicts():
    p = plan(_policy(zones=("a", "b", "c")), [Container("c1", "a"), Container("c2", "b"), Container("c3", "c")])
    pl = _all_current(p.placement)
    assert Placement.from_dict(pl.to_dict()) == pl
    d = p.to_dict()
    assert d["moves"][0] == {"kind": "place", "partition": 0, "container": "c1", "role": "primary", "source": None,
                             "may_lose_commits": False}
    s0 = pl.partitions[0]
    assert pl.with_current(0, "nobody", True, epoch=s0.epoch) is pl
    assert pl.with_current(0, s0.sync_replicas[0], True, epoch=s0.epoch) is pl


# -- by Hypothesis -------------------------------------------------------------------------------------

@st.composite
def grids(draw):
    max_sync = draw(st.integers(0, 2))
    min_sync = draw(st.integers(0, max_sync))
    zones = draw(st.one_of(st.none(), st.integers(max(1, min_sync + 1), 4)))
    zone_names = tuple(f"z{i}" for i in range(zones)) if zones else None
    pol = _policy(draw(st.integers(1, 12)), min_sync, max_sync, draw(st.integers(0, 2)), zone_names)
    labels = list(zone_names or ()) + [None, "elsewhere"]
    n = draw(st.integers(0, 6))
    cs = [Container(f"c{i}", draw(st.sampled_from(labels)), draw(st.sampled_from([2, 5, 1024])))
          for i in range(n)]
    return pol, cs


def _eligible(pol, cs):
    return [c for c in cs if not pol.zones or c.zone in pol.zones]


@settings(max_examples=150)
@given(grids(), st.randoms(use_true_random=False))
def test_rules_hold_and_every_partition_has_a_primary_through_joins_and_losses(grid, rnd):
    pol, cs = grid
    pl, up = None, list(cs)
    for step in range(4):
        p = plan(pol, up, pl)
        pl = p.placement
        _check_rules(pol, up, pl)
        names = {c.name for c in _eligible(pol, up)}
        for i, s in enumerate(pl.partitions):
            if s.primary in names:
                continue
            # no primary up: the reason is on record, and it is a real one
            (f,) = [f for f in p.shortfalls if f.partition == i and f.role is Role.PRIMARY]
            if s.primary is None:
                assert not names or "full" in f.reason  # only capacity stops a fresh primary
            else:
                assert f"waiting for {s.primary} to return" in f.reason
                assert pol.min_sync >= 1 or "the only copy" in f.reason
        if rnd.random() < 0.5:
            pl = _all_current(pl)
        if up and rnd.random() < 0.6:
            up.remove(rnd.choice(up))
        else:
            up.append(Container(f"n{step}", rnd.choice(list(pol.zones or (None,)))))
    # from nothing, with room, every partition gets a primary on a container that is up
    fresh = plan(pol, [replace_capacity(c) for c in up])
    if _eligible(pol, up):
        assert all(s.primary in {c.name for c in up} for s in fresh.placement.partitions)


def replace_capacity(c: Container) -> Container:
    return Container(c.name, c.zone, 1024)


@settings(max_examples=150)
@given(grids(), st.data())
def test_a_promotion_picks_a_current_synchronous_replica_when_one_exists(grid, data):
    pol, cs = grid
    pl = plan(pol, cs).placement
    # some synchronous replicas caught up, some not
    for i, s in enumerate(pl.partitions):
        for r in s.sync_replicas:
            if data.draw(st.booleans()):
                pl = pl.with_current(i, r, True, epoch=s.epoch)
    if not cs:
        return
    lost = data.draw(st.sampled_from(cs))
    up = [c for c in cs if c != lost]
    after = plan(pol, up, pl).placement
    up_names = {c.name for c in up}
    for before, now in zip(pl.partitions, after.partitions):
        if before.primary != lost.name:
            continue
        current_up = before.current & up_names
        if current_up:
            assert now.primary in current_up
            assert now.epoch > before.epoch
        elif pol.min_sync >= 1 and (before.sync_replicas or before.async_replicas):
            assert now.primary == lost.name  # waits: promoting would lose acknowledged commits


@settings(max_examples=100)
@given(grids(), st.randoms(use_true_random=False))
def test_placement_is_deterministic_whatever_the_order_of_containers(grid, rnd):
    pol, cs = grid
    a = plan(pol, cs)
    shuffled = list(cs)
    rnd.shuffle(shuffled)
    b = plan(pol, shuffled)
    assert a == b
    assert plan(pol, cs, _all_current(a.placement)) == plan(pol, shuffled, _all_current(b.placement))


def _assignments(pl: Placement) -> set[tuple[int, str]]:
    return {(i, c) for i, s in enumerate(pl.partitions) for c in s.containers()}


@settings(max_examples=100)
@given(st.integers(1, 16), st.integers(0, 2), st.integers(0, 2), st.integers(1, 6))
def test_a_join_or_a_loss_moves_few_shards(partitions, max_sync, max_async, n):
    pol = _policy(partitions, min(1, max_sync), max_sync, max_async)
    cs = [Container(f"c{i}") for i in range(n)]
    base = _all_current(plan(pol, cs).placement)
    base = _all_current(plan(pol, cs, base).placement)  # primaries balanced
    total = sum(len(s.containers()) for s in base.partitions)
    # a join: only the shards the newcomer needs to even out move; nothing else changes
    joined = plan(pol, cs + [Container("new")], base).placement
    moved = len(_assignments(base) - _assignments(joined))
    assert moved <= -(-total // (n + 1)) + 1
    assert all(c == "new" for _, c in _assignments(joined) - _assignments(base))
    # a loss: its shards are placed again and a few others move to even out
    lost = cs[0].name
    on_lost = sum(lost in s.containers() for s in base.partitions)
    after = plan(pol, cs[1:], base).placement
    changed = len(_assignments(base) ^ _assignments(after))
    assert changed <= 3 * on_lost + n


def test_a_lowered_max_sync_or_max_async_drops_the_extra_replicas_keeping_current_ones():
    # grid.toml edited (max_sync 2 -> 1, max_async 1 -> 0) and the catalog restarted: the placement in
    # force has more replicas than the policy allows; a primary would still wait on both sync replicas
    pol = _policy(partitions=1, min_sync=1, max_sync=1, max_async=0)
    cs = [Container(f"c{i}") for i in range(4)]
    pl = Placement((Shards("c0", ("c1", "c2"), ("c3",), frozenset({"c2"}), epoch=1),))
    p = plan(pol, cs, pl)
    s = p.placement.partitions[0]
    assert s.sync_replicas == ("c2",) and s.current == {"c2"} and s.async_replicas == ()
    assert {(m.kind, m.container) for m in p.moves} == {(MoveKind.DROP, "c1"), (MoveKind.DROP, "c3")}
    _check_rules(pol, cs, p.placement)


def test_a_caught_up_report_from_a_replaced_primary_does_not_make_a_replica_current():
    # c0 (epoch 4) reports c2 caught up, then dies; its report reaches the catalog after c1 was promoted
    # (epoch 5). c2 holds nothing of c1's commits: counting it current would let the next failover
    # promote it and lose what c1 acknowledged with other replicas' votes.
    pol = _policy(partitions=1, min_sync=1, max_sync=2, max_async=0)
    pl = Placement((Shards("c0", ("c1", "c2"), (), frozenset({"c1"}), epoch=4),))
    after = plan(pol, [Container("c1"), Container("c2"), Container("c3")], pl).placement
    s = after.partitions[0]
    assert s.primary == "c1" and s.epoch == 5 and s.current == frozenset()
    assert after.with_current(0, "c2", True, epoch=4) is after
    assert after.with_current(0, "c2", True, epoch=5).partitions[0].current == {"c2"}
    marked = after.with_current(0, "c2", True, epoch=5)
    assert marked.with_current(0, "c2", False, epoch=4).partitions[0].current == frozenset()  # behind: always taken
