"""The HA manager's decisions (ha/decide.py) without etcd or sockets: fencing, one candidate, followers."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from multisite.ha.decide import (Action, Kind, Leader, Local, Member, Timing, View, candidate, decide,
                                 fence_deadline, lacking)

T = Timing(ttl_s=2.0, settle_s=0.3)


def members(*rows):
    return tuple(Member(name=n, group="G", client=f"127.0.0.1:{7000 + i}", replication=f"127.0.0.1:{8000 + i}",
                        seqno=s, role=r) for i, (n, s, r) in enumerate(rows))


def test_the_candidate_is_the_most_advanced_member_ties_to_the_lower_name():
    ms = members(("b", 10, "secondary"), ("a", 10, "secondary"), ("c", 9, "secondary"))
    assert candidate(ms).name == "a"
    assert candidate(members(("b", 11, "secondary"), ("a", 10, "secondary"))).name == "b"
    assert candidate(()) is None


def test_members_of_another_group_never_become_candidates():
    ms = members(("a", 5, "secondary")) + (Member("z", group="OTHER", seqno=99),)
    assert candidate(ms, "G").name == "a"


def test_a_leader_fences_before_its_lease_can_expire():
    me = Local("a", "primary", 10, leading_term=3, renewed_sent_at=100.0)
    view = View(True, Leader("a", 3), members(("a", 10, "primary")))
    deadline = fence_deadline(100.0, T)
    assert deadline < 100.0 + T.ttl_s  # before etcd can let the lease go
    assert decide(view, me, deadline - 0.01, T).kind is Kind.SOURCES
    assert decide(view, me, deadline, T).kind is Kind.FENCE


def test_a_leader_cut_off_from_etcd_keeps_leading_only_until_its_deadline():
    me = Local("a", "primary", 10, leading_term=3, renewed_sent_at=100.0)
    assert decide(View(False), me, 100.5, T).kind is Kind.SOURCES
    assert decide(View(False), me, fence_deadline(100.0, T), T).kind is Kind.FENCE


def test_a_leader_whose_key_is_gone_or_taken_fences_at_once():
    me = Local("a", "primary", 10, leading_term=3, renewed_sent_at=100.0)
    assert decide(View(True, None, members(("a", 10, "primary"))), me, 100.1, T).kind is Kind.FENCE
    assert decide(View(True, Leader("b", 4)), me, 100.1, T).kind is Kind.FENCE


def test_a_new_leader_promotes_then_starts_sources_to_the_others():
    ms = members(("a", 10, "secondary"), ("b", 9, "secondary"), ("c", 8, "secondary"))
    me = Local("a", "secondary", 10, leading_term=4, renewed_sent_at=50.0)
    act = decide(View(True, Leader("a", 4), ms), me, 50.1, T)
    assert act == Action(Kind.PROMOTE, term=4, targets=("b", "c"))
    me2 = Local("a", "primary", 10, leading_term=4, renewed_sent_at=50.0)
    assert decide(View(True, Leader("a", 4), ms), me2, 50.1, T).targets == ("b", "c")


def test_without_a_leader_only_the_candidate_campaigns_after_the_settle_wait():
    ms = members(("a", 10, "secondary"), ("b", 12, "secondary"))
    view = View(True, None, ms, last_term=7)
    b = Local("b", "secondary", 12, leader_gone_since=20.0)
    assert decide(view, b, 20.1, T).kind is Kind.WAIT  # others may not have published yet
    assert decide(view, b, 20.3, T) == Action(Kind.CAMPAIGN, term=8, targets=("a",))
    a = Local("a", "secondary", 10, leader_gone_since=20.0)
    assert decide(view, a, 25.0, T).kind is Kind.WAIT


def test_no_promotion_while_etcd_is_unreachable():
    me = Local("a", "secondary", 10, leader_gone_since=0.0)
    assert decide(View(False), me, 100.0, T).kind is Kind.WAIT


def test_a_returning_old_primary_rejoins_by_rollback_against_the_new_leader():
    ms = members(("a", 15, "primary"), ("b", 12, "primary"))
    old = Local("a", "primary", 15)  # it lost its lease; the key is b's now
    act = decide(View(True, Leader("b", 5), ms), old, 1.0, T)
    assert act.kind is Kind.REJOIN and act.leader == "b" and act.term == 5


def test_a_follower_checks_its_history_once_per_term_then_follows():
    view = View(True, Leader("b", 5), members(("a", 9, "secondary"), ("b", 12, "primary")))
    assert decide(view, Local("a", "secondary", 9), 1.0, T).kind is Kind.REJOIN
    assert decide(view, Local("a", "secondary", 9, rejoined_term=5), 1.0, T).kind is Kind.FOLLOW
    act = decide(view, Local("a", "secondary", 9, rejoined_term=5, following="b"), 1.0, T)
    assert act.kind is Kind.WAIT


def test_a_member_named_by_a_stale_key_of_its_own_waits_for_it_to_expire():
    view = View(True, Leader("a", 5), members(("a", 9, "secondary")))
    assert decide(view, Local("a", "secondary", 9), 1.0, T).kind is Kind.WAIT


def test_the_failover_preview_lists_what_each_candidate_lacks():
    ms = members(("a", 10, "secondary"), ("b", 12, "secondary"), ("c", 12, "secondary"))
    assert lacking(ms, "a") == {"b": 2, "c": 2}
    assert lacking(ms, "b") == {}
    with pytest.raises(KeyError):
        lacking(ms, "zz")


def test_timing_refuses_a_lease_that_is_not_positive():
    with pytest.raises(ValueError):
        Timing(ttl_s=0)


names = st.sampled_from(["a", "b", "c", "d", "e"])
member_sets = st.dictionaries(names, st.integers(0, 20), min_size=1).map(
    lambda d: tuple(Member(n, "G", seqno=s) for n, s in d.items()))


@given(member_sets, st.integers(0, 50), st.floats(0.3, 100))
def test_every_member_with_the_same_view_agrees_on_at_most_one_campaigner(ms, term, now):
    view = View(True, None, ms, last_term=term)
    campaigners = [m.name for m in ms
                   if decide(view, Local(m.name, "secondary", m.seqno, leader_gone_since=0.0), now, T).kind
                   is Kind.CAMPAIGN]
    assert len(campaigners) == 1
    (winner,) = campaigners
    assert all(m.seqno <= next(x.seqno for x in ms if x.name == winner) for m in ms)


@given(st.floats(0, 1e6), st.floats(0.05, 60), st.floats(0, 120))
def test_a_leader_never_takes_commits_at_or_after_its_lease_could_expire(sent, ttl, later):
    t = Timing(ttl_s=ttl)
    me = Local("a", "primary", 1, leading_term=1, renewed_sent_at=sent)
    act = decide(View(True, Leader("a", 1), (Member("a", "G", seqno=1, role="primary"),)), me, sent + later, t)
    if later >= ttl:
        assert act.kind is Kind.FENCE


def test_a_switchover_makes_the_leader_hand_over_and_only_the_target_campaign():
    ms = members(("a", 20, "primary"), ("b", 20, "secondary"), ("c", 20, "secondary"))
    leader = Local("a", "primary", 20, leading_term=3, renewed_sent_at=10.0)
    act = decide(View(True, Leader("a", 3), ms, 3, handover="c"), leader, 10.1, T)
    assert act.kind is Kind.HANDOVER and act.leader == "c"
    gone = View(True, None, ms, 3, handover="c")
    assert decide(gone, Local("b", "secondary", 20, leader_gone_since=0.0), 1.0, T).kind is Kind.WAIT
    assert decide(gone, Local("c", "secondary", 20, leader_gone_since=0.0), 1.0, T).kind is Kind.CAMPAIGN


def test_a_switchover_target_that_lacks_transactions_is_not_preferred():
    ms = members(("b", 19, "secondary"), ("c", 20, "secondary"))
    gone = View(True, None, ms, 3, handover="b")
    assert decide(gone, Local("c", "secondary", 20, leader_gone_since=0.0), 1.0, T).kind is Kind.CAMPAIGN
