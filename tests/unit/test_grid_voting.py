"""The minSyncReplica vote: every outcome of one transaction's vote, and the replicas' currency across them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multisite import errors
from multisite.errors import LocalProtocolError, RemoteProtocolError, ReplicationVotedToRollback
from multisite.grid.voting import TRANSITIONS, CommitVote, State, SyncReplicas, Vote

YES, NO = Vote.COMMIT, Vote.ROLLBACK


def test_commit_when_every_voter_commits():
    v = CommitVote(1, ["r1", "r2"], min_sync=1, now=0.0, timeout_s=1.0)
    assert v.vote("r1", YES, 0.1) is None  # waits for r2: a sync replica not heard from is not counted
    d = v.vote("r2", YES, 0.2)
    assert d.commit and v.state is State.COMMITTED and d.commit_votes == ("r1", "r2") and d.behind == ()
    d.check()  # no error


def test_commit_with_min_sync_votes_and_the_rest_marked_behind():
    v = CommitVote(7, ["r1", "r2", "r3"], min_sync=1, now=0.0, timeout_s=1.0)
    v.vote("r1", YES, 0.1)
    assert v.vote("r2", NO, 0.2) is None
    assert v.tick(0.99) is None
    d = v.tick(1.0)
    assert d.commit and d.commit_votes == ("r1",) and d.rollback_votes == ("r2",) and d.timed_out == ("r3",)
    assert d.behind == ("r2", "r3")


def test_rollback_as_soon_as_min_sync_cannot_be_reached():
    v = CommitVote(3, ["r1", "r2"], min_sync=2, now=0.0)
    d = v.vote("r2", NO, 0.1)
    assert d is not None and not d.commit and v.state is State.ROLLED_BACK
    assert v.pending() == () and d.behind == ("r2",)  # r1 was not heard from but did nothing wrong
    with pytest.raises(ReplicationVotedToRollback) as e:
        d.check()
    err = e.value
    assert err.code == "REPLICATION_VOTED_TO_ROLLBACK"
    assert (err.commit_votes, err.min_sync, err.voters, err.rollback_votes, err.timed_out) == (0, 2, 2, 1, 0)
    assert "transaction 3 was committed nowhere: 0 of 2 synchronous replicas voted to commit, min_sync is 2" \
           in str(err) and "voted not to: r2" in str(err)


def test_rollback_at_the_deadline_when_replicas_are_silent():
    v = CommitVote(4, ["r1", "r2"], min_sync=2, now=10.0, timeout_s=0.5)
    v.vote("r1", YES, 10.1)
    d = v.tick(10.5)
    assert not d.commit and d.timed_out == ("r2",) and d.behind == ("r2",)
    with pytest.raises(ReplicationVotedToRollback, match="timed out: r2") as e:
        d.check()
    assert (e.value.commit_votes, e.value.timed_out) == (1, 1)


def test_no_voters_commits_at_once_with_min_sync_zero_and_rolls_back_otherwise():
    v = CommitVote(1, [], min_sync=0, now=0.0)
    assert v.decided and v.decision.commit and v.state is State.COMMITTED
    v = CommitVote(1, [], min_sync=1, now=0.0)
    assert v.decided and not v.decision.commit
    with pytest.raises(ReplicationVotedToRollback, match="no synchronous replica is current, min_sync is 1"):
        v.decision.check()
    v = CommitVote(1, ["r1"], min_sync=2, now=0.0)  # too few voters to ever reach it
    assert v.decided and not v.decision.commit


def test_min_sync_zero_still_waits_for_the_sync_replicas_but_commits_whatever_they_vote():
    v = CommitVote(1, ["r1"], min_sync=0, now=0.0)
    assert not v.decided
    d = v.vote("r1", NO, 0.1)
    assert d.commit and d.behind == ("r1",)


def test_a_vote_after_the_deadline_is_late_even_before_the_caller_ticked():
    v = CommitVote(1, ["r1", "r2"], min_sync=1, now=0.0, timeout_s=1.0)
    v.vote("r1", YES, 0.5)
    d = v.vote("r2", YES, 1.5)  # timed out first, then recorded as late; the deadline's decision comes back
    assert d is v.decision and d.commit and d.timed_out == ("r2",) and v.late == {"r2": YES}
    assert v.vote("r2", YES, 1.6) is None  # a repeat of the late vote: decided before this call


def test_a_vote_arriving_past_the_deadline_before_the_primarys_timer_settles_the_vote():
    """Found under load (bench/grid.py, TLS): the late vote decided the vote by its deadline but the
    decision was dropped, the vote stayed in flight for good, and no replica could count current again."""
    s = SyncReplicas(1, ["r1"])
    s.caught_up("r1", 0)
    v = s.begin(0.0, seqno=1)
    d = s.vote(v.txn, "r1", YES, v.deadline + 0.5)  # the answer came after the deadline, before any tick
    assert d is not None and not d.commit and d.timed_out == ("r1",)
    assert s.in_flight == {} and "r1" in s.behind
    assert s.caught_up("r1", 0)  # it may count current again once it has everything


def test_a_repeated_vote_is_harmless_and_a_contradicting_one_is_a_protocol_error():
    v = CommitVote(1, ["r1", "r2"], min_sync=1, now=0.0)
    v.vote("r1", YES, 0.1)
    assert v.vote("r1", YES, 0.2) is None and v.state is State.COLLECTING
    with pytest.raises(RemoteProtocolError, match="voted rollback on transaction 1 after voting commit"):
        v.vote("r1", NO, 0.3)
    assert v.state is State.ERROR and not v.decision.commit and "protocol error" in v.decision.why
    with pytest.raises(LocalProtocolError, match="already failed"):
        v.vote("r2", YES, 0.4)
    with pytest.raises(LocalProtocolError):
        v.tick(99.0)


def test_a_vote_from_a_replica_not_asked_rolls_back():
    v = CommitVote(1, ["r1"], min_sync=0, now=0.0)
    with pytest.raises(RemoteProtocolError, match="'rx' voted on transaction 1 but was not asked"):
        v.vote("rx", YES, 0.1)
    assert v.state is State.ERROR and not v.decision.commit
    with pytest.raises(ReplicationVotedToRollback):
        v.decision.check()


def test_a_decision_is_final():
    v = CommitVote(1, ["r1"], min_sync=1, now=0.0)
    d = v.vote("r1", YES, 0.1)
    with pytest.raises(RemoteProtocolError):
        v.vote("r1", NO, 0.2)
    assert v.state is State.COMMITTED and v.decision is d


def test_the_table_has_no_way_out_of_a_decision_or_error():
    for (state, _event), nxt in TRANSITIONS.items():
        if state is not State.COLLECTING:
            assert nxt is state
    assert not any(s is State.ERROR for s, _ in TRANSITIONS)


def test_bad_settings_are_refused():
    with pytest.raises(errors.ConfigError):
        CommitVote(1, [], min_sync=-1, now=0.0)
    with pytest.raises(errors.ConfigError):
        CommitVote(1, [], min_sync=0, now=0.0, timeout_s=0)


def test_the_error_rebuilt_from_its_message_alone_still_has_counts():
    e = ReplicationVotedToRollback.__new__(ReplicationVotedToRollback)
    errors.MultisiteError.__init__(e, "from the wire")
    assert (e.commit_votes, e.min_sync, e.voters) == (0, 0, 0)


@given(n=st.integers(0, 4), min_sync=st.integers(0, 4),
       answers=st.lists(st.sampled_from(["yes", "no", "silent"]), min_size=4, max_size=4))
def test_the_outcome_is_commit_exactly_when_min_sync_voted_commit(n, min_sync, answers):
    voters = [f"r{i}" for i in range(n)]
    v = CommitVote(1, voters, min_sync=min_sync, now=0.0, timeout_s=1.0)
    for r, a in zip(voters, answers):
        if a != "silent" and v.state is State.COLLECTING:
            v.vote(r, YES if a == "yes" else NO, 0.5)
    v.tick(1.0)
    d = v.decision
    yes = sum(a == "yes" for a in answers[:n])
    assert d is not None and v.pending() == ()
    assert d.commit == (yes >= min_sync)
    if d.commit:
        assert len(d.commit_votes) >= min_sync
        assert set(d.behind) == {r for r, a in zip(voters, answers) if a != "yes"}


# -- across transactions --------------------------------------------------------------------------------

def _caught_up(s: SyncReplicas, *names: str) -> None:
    for r in names:
        assert s.caught_up(r, s.committed_seqno)


def test_new_replicas_start_behind_and_do_not_vote_until_caught_up():
    s = SyncReplicas(1, ["r1", "r2"], committed_seqno=10)
    assert s.current == set() and not s.can_commit()
    with pytest.raises(ReplicationVotedToRollback):
        s.begin(0.0).decision.check()
    assert not s.caught_up("r1", 9)
    assert s.caught_up("r1", 10) and s.current == {"r1"} and s.can_commit()
    assert not s.caught_up("stranger", 99)


def test_a_replica_that_voted_no_or_timed_out_must_catch_up_again():
    s = SyncReplicas(1, ["r1", "r2"], vote_timeout_s=1.0)
    _caught_up(s, "r1", "r2")
    v = s.begin(0.0)
    assert v.voters == ("r1", "r2")
    assert s.vote(v.txn, "r1", YES, 0.1) is None
    assert s.next_deadline() == 1.0
    (d,) = s.tick(1.0)
    assert d.commit and s.current == {"r1"} and s.behind == {"r2"} and not s.in_flight
    s.committed(11)
    v2 = s.begin(2.0)
    assert v2.voters == ("r1",)  # r2 is no longer waited on
    assert s.vote(v2.txn, "r1", NO, 2.1).commit is False
    assert s.current == set() and s.behind == {"r1", "r2"}
    assert s.vote(v2.txn, "r1", NO, 2.2) is None  # late, on a decided transaction
    assert not s.caught_up("r2", 10) and s.caught_up("r2", 11) and s.current == {"r2"}


def test_a_replica_does_not_become_current_while_a_vote_that_did_not_ask_it_is_in_flight():
    s = SyncReplicas(1, ["r1", "r2"])
    _caught_up(s, "r1")
    v = s.begin(0.0)
    assert not s.caught_up("r2", 0)  # v did not ask r2; if v commits, r2 would lack it
    s.vote(v.txn, "r1", YES, 0.1)
    s.committed(1)
    assert not s.caught_up("r2", 0) and s.caught_up("r2", 1)


def test_a_protocol_error_settles_the_vote_as_a_rollback():
    s = SyncReplicas(0, ["r1"])
    _caught_up(s, "r1")
    v = s.begin(0.0)
    with pytest.raises(RemoteProtocolError):
        s.vote(v.txn, "r9", YES, 0.1)
    assert not v.decision.commit and not s.in_flight


def test_assign_keeps_the_state_of_replicas_that_stay():
    s = SyncReplicas(1, ["r1", "r2"])
    _caught_up(s, "r1")
    s.assign(["r1", "r3"])
    assert s.current == {"r1"} and s.behind == {"r3"}
    s.fell_behind("r1")
    s.fell_behind("nobody")
    assert s.to_dict() == {"min_sync": 1, "current": [], "behind": ["r1", "r3"], "committed_seqno": 0,
                           "in_flight": []}


def test_a_vote_that_comes_after_an_early_rollback_is_late_not_an_error():
    # min_sync = 2 of 3: two ROLLBACK votes decide at once; the third voter's answer, still on its way,
    # is a late vote on a decided transaction (the design's table), not a protocol failure
    v = CommitVote(1, ["r1", "r2", "r3"], min_sync=2, now=0.0, timeout_s=1.0)
    v.vote("r1", NO, 0.1)
    d = v.vote("r2", NO, 0.2)
    assert d is not None and not d.commit
    assert v.vote("r3", YES, 0.3) is None
    assert v.state is State.ROLLED_BACK and v.decision is d and v.late == {"r3": YES}
    assert v.tick(5.0) is None  # still usable: no LocalProtocolError


def test_a_replica_cannot_become_current_between_a_commit_decision_and_the_primarys_commit():
    # The decision settles the vote (nothing in flight) before the primary has committed and called
    # committed(): a behind replica reporting the old seqno in that window must not count as current,
    # or it would be promoted without a transaction the primary is about to acknowledge.
    s = SyncReplicas(1, ["r1", "r2"], committed_seqno=10)
    _caught_up(s, "r1")
    v = s.begin(0.0, seqno=11)
    assert s.vote(v.txn, "r1", YES, 0.1).commit
    assert not s.in_flight
    assert not s.caught_up("r2", 10)  # lacks seqno 11, which was just voted committed
    assert s.caught_up("r2", 11) and s.current == {"r1", "r2"}
    v = s.begin(1.0, seqno=12)  # a rollback does not raise it
    s.vote(v.txn, "r1", NO, 1.1)
    assert s.committed_seqno == 11


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan")])
def test_a_vote_that_could_never_time_out_is_refused(timeout_s):
    # inf: with a silent voter the vote never decides and the commit hangs; nan: every voter times out at once
    with pytest.raises(errors.ConfigError):
        CommitVote(1, ["r1"], min_sync=1, now=0.0, timeout_s=timeout_s)
