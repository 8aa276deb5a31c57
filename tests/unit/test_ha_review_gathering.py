"""Review of issue 25: ``Gathering``'s --min-confirm marks across a rollback and a min-confirm of 0."""

from __future__ import annotations

from multisite.protocol.client import ClientSession, Gathering, encode


def _hard(g: Gathering, *rids_seqnos: tuple[int, int]) -> tuple[ClientSession, list]:
    s = ClientSession()
    s.feed(b"".join(encode([rid, "commit", {}]) for rid, _ in rids_seqnos))
    s.parse()
    reqs = []
    while (r := s.next_runnable()) is not None:
        reqs.append(r)
    for r in reqs:
        g.add(r, "x")
    g.wrote([r for r, _ in g.take_batch()], [q for _, q in rids_seqnos], token="t")
    g.synced(g.written_total, None, 0.0)
    return s, reqs


def test_ha_review_a_commit_rolled_back_while_it_waited_is_not_answered_by_the_next_one_of_its_seqno():
    g = Gathering()
    g.min_confirm = 1
    assert g.confirmed(10) == []
    s, _ = _hard(g, (1, 11))  # waits for a confirmation of 11
    assert s.replies() == []
    g.rolled_back(10)  # 11 went to the lost-transaction file
    ((rid, ok, (code, msg)),) = s.replies()
    assert (rid, ok, code) == (1, False, "MIN_CONFIRM_TIMEOUT") and "rolled back" in msg
    s2, _ = _hard(g, (2, 11))  # another transaction takes seqno 11 again
    assert s2.replies() == []
    g.confirmed(11)
    assert s2.replies() == [[2, True, 11]]


def test_ha_review_after_a_rollback_the_seqnos_given_again_wait_for_their_own_confirmation():
    g = Gathering()
    g.min_confirm = 1
    g.confirmed(10)
    g.rolled_back(4)
    s, _ = _hard(g, (1, 5))
    assert s.replies() == [] and g.waiting_confirm == 1


def test_ha_review_min_confirm_off_then_on_again_holds_commits():
    g = Gathering()
    g.min_confirm = 1
    s, _ = _hard(g, (1, 3))
    g.min_confirm = 0
    g.min_confirm_off()
    assert s.replies() == [[1, True, 3]]
    g.min_confirm = 1
    s2, _ = _hard(g, (2, 4))
    assert s2.replies() == [] and g.waiting_confirm == 1


def test_ha_review_with_durability_none_a_commit_still_waits_for_the_secondaries():
    g = Gathering()
    g.min_confirm = 1
    s = ClientSession()
    s.feed(encode([1, "commit", {}]))
    s.parse()
    r = s.next_runnable()
    g.add(r, "x")
    assert g.wrote([r for r, _ in g.take_batch()], [7], token=None, now=5.0) == []
    assert s.replies() == [] and g.waiting_confirm == 1
    assert g.confirmed(7) == [r] and s.replies() == [[1, True, 7]]
