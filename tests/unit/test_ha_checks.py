"""The one-primary-at-a-time check of the HA fault rounds (``testing/ha_checks``), on made-up journals."""

import pytest

from multisite.testing.ha_checks import check_one_primary_at_a_time, runs, split_terms

MARGIN_S = 0.25


def _run(origin: str, first_seqno: int, times: list[float], where: str) -> list:
    return runs([(first_seqno + i, origin, t) for i, t in enumerate(times)], where)


def _dense(start: float, n: int, step: float = 0.001) -> list[float]:
    return [start + i * step for i in range(n)]


def test_a_member_that_lost_the_lead_and_won_it_back_is_two_terms_not_an_overlap():
    # seed 2516: A hands over to C, C commits 10 and is killed before shipping them, A wins the lead back
    # and goes on with the same seqnos; A's journal shows one run of A across C's lost commits
    a = _run("A", 11716, _dense(468.9, 30) + _dense(473.5, 400), "A journal")
    c = _run("C", 11746, _dense(471.07, 10), "C lost")
    assert check_one_primary_at_a_time(a + c, MARGIN_S) == pytest.approx(471.07 - (468.9 + 0.029), abs=1e-6)
    assert [(p.first_seqno, p.last_seqno) for p in split_terms(a + c, MARGIN_S)] == [
        (11716, 11745), (11746, 12145), (11746, 11755)]


def test_a_stale_primarys_commit_amid_the_new_leaders_stream_is_two_primaries():
    c = _run("C", 100, _dense(10.0, 500), "C journal")
    a = _run("A", 100, [10.2], "A lost")
    with pytest.raises(AssertionError, match="two primaries took commits at once"):
        check_one_primary_at_a_time(c + a, MARGIN_S)


def test_an_old_primary_that_goes_on_committing_through_the_new_ones_term_is_two_primaries():
    a = _run("A", 1, _dense(0.0, 3000), "A journal")
    c = _run("C", 1, _dense(1.0, 100), "C lost")
    with pytest.raises(AssertionError, match="A .A journal.* and C .C lost"):
        check_one_primary_at_a_time(a + c, MARGIN_S)


def test_a_gap_is_not_cut_when_the_other_period_reaches_past_it():
    a = _run("A", 1, [0.0, 0.001, 2.0, 2.001], "A journal")
    c = _run("C", 3, [1.0, 2.0005], "C lost")  # its last commit is after A's term had resumed
    with pytest.raises(AssertionError):
        check_one_primary_at_a_time(a + c, MARGIN_S)


def test_a_gap_shorter_than_the_fence_margin_is_not_a_new_term():
    a = _run("A", 1, [0.0, 0.2], "A journal")
    c = _run("C", 2, [0.1], "C lost")
    with pytest.raises(AssertionError):
        check_one_primary_at_a_time(a + c, MARGIN_S)
