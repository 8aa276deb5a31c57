"""The one-primary-at-a-time check of the HA fault rounds (``testing/ha_checks``): made-up journals, and
term starts read from real instance files."""

import pytest

from multisite.instance.instance_file import InstanceFile, save
from multisite.instance.layout import Layout
from multisite.testing.ha_checks import check_one_primary_at_a_time, runs, term_starts


def _run(origin: str, first_seqno: int, times: list[float], where: str, starts=frozenset()) -> list:
    return runs([(first_seqno + i, origin, t) for i, t in enumerate(times)], where, starts)


def _dense(start: float, n: int, step: float = 0.001) -> list[float]:
    return [start + i * step for i in range(n)]


def test_a_member_that_lost_the_lead_and_won_it_back_is_two_terms_not_an_overlap():
    # seed 2516: A hands over to C, C commits 10 and is killed before shipping them, A wins the lead back
    # at the same seqno (its promotion's history record A@11746); A's journal is one run of A around them
    starts = frozenset({("A", 100), ("C", 11746), ("A", 11746)})
    a = _run("A", 11716, _dense(468.9, 30) + _dense(473.5, 400), "A journal", starts)
    c = _run("C", 11746, _dense(471.07, 10), "C lost", starts)
    assert [(p.first_seqno, p.last_seqno) for p in a] == [(11716, 11745), (11746, 12145)]
    assert check_one_primary_at_a_time(a + c) == pytest.approx(471.07 - (468.9 + 0.029), abs=1e-6)


def test_without_the_promotion_record_the_same_journals_are_two_primaries():
    a = _run("A", 11716, _dense(468.9, 30) + _dense(473.5, 400), "A journal")
    c = _run("C", 11746, _dense(471.07, 10), "C lost")
    with pytest.raises(AssertionError, match=r"two primaries took commits at once: A \(A journal"):
        check_one_primary_at_a_time(a + c)


@pytest.mark.parametrize("pause_s", [0.0, 0.4, 3.0])
def test_a_stale_primarys_commit_inside_the_new_leaders_term_is_two_primaries_however_sparse_its_stream(pause_s):
    # C leads from 100; its writer pauses pause_s in the middle; A, SIGSTOPped while leading, commits once
    # after it wakes (its lost file); nothing promoted A again, so nothing cuts C's run around it
    starts = frozenset({("A", 1), ("C", 100)})
    c = _run("C", 100, _dense(10.0, 100) + _dense(10.1 + pause_s, 100), "C journal", starts)
    a = _run("A", 100, [10.1 + pause_s / 2], "A lost", starts)
    with pytest.raises(AssertionError, match="two primaries took commits at once"):
        check_one_primary_at_a_time(c + a)


def test_a_term_start_of_another_origin_does_not_cut_a_run():
    starts = frozenset({("C", 3)})
    assert [(p.first_seqno, p.last_seqno) for p in _run("A", 1, _dense(0.0, 5), "A journal", starts)] == [(1, 5)]


def test_term_starts_are_every_members_promotions_of_its_own_stream(tmp_path):
    for name, history in {"A": [(1, "A"), (500, "C"), (900, "A")], "B": [(1, "A"), (500, "C")]}.items():
        inst = InstanceFile(name=name, group="g")
        for start, root in history:
            inst.add_history(start, root, "originating" if root == name else "replicating")
        inst.add_history(1000, "P", "replicating", stream=2, stream_start=7)  # an SI stream's numbering: not a term here
        (tmp_path / name).mkdir()
        save(Layout(tmp_path / name).instance_file, inst)
    assert term_starts([tmp_path / "A", tmp_path / "B"]) == {("A", 1), ("C", 500), ("A", 900)}
