"""History records compared: ``common_point`` and ``check_peer`` on failover, fresh, cascade and rollback.

Each case builds the histories the instances would really hold (with ``InstanceFile.add_history``,
``truncate_history`` and the receiver's ``to_records``), not hand-picked uids, so that a change in how
records are made shows up here too.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.instance.instance_file import InstanceFile
from multisite.protocol.messages import HistoryEntry
from multisite.protocol.messages import RefusalCode
from multisite.replication.history import (check_peer, check_secondary_name, common_point, hello_for, to_entries,
                                        to_records)


def primary(name: str, group: str = "default", *, supplementary: bool = False) -> InstanceFile:
    """A new instance, as ``multisite.create`` makes it: one originating record from seqno 1."""
    f = InstanceFile(name=name, group=group, supplementary=supplementary)
    f.add_history(1, name, "originating")
    return f


def receives(secondary: InstanceFile, source: InstanceFile) -> None:
    """What the receiver does on connect: it adopts the source's history as its own."""
    secondary.history = to_records(to_entries(source.history), upstream=source.name)
    secondary.role = "secondary"


def promote(f: InstanceFile, at_seqno: int) -> None:
    """Failover: ``f`` becomes an originating primary after ``at_seqno``."""
    f.role = "primary"
    f.add_history(at_seqno + 1, f.name, "originating")


def cp(a: InstanceFile, a_seqno: int, b: InstanceFile, b_seqno: int) -> int:
    return common_point(to_entries(a.history), a_seqno, to_entries(b.history), b_seqno)


def check(source: InstanceFile, s_seqno: int, receiver: InstanceFile, r_seqno: int):
    return check_peer(hello_for(receiver, r_seqno), hello_for(source, s_seqno), i_am="receiver")


def test_fresh_instance_shares_nothing_and_may_receive_everything():
    a, b = primary("A"), primary("B")
    assert cp(a, 120, b, 0) == 0
    assert check(a, 120, b, 0) is None
    assert check_peer(hello_for(a, 120), hello_for(b, 0), i_am="source") is None


def test_fresh_instance_that_wrote_on_its_own_must_roll_back():
    a, b = primary("A"), primary("B")
    assert cp(a, 120, b, 3) == 0
    r = check(a, 120, b, 3)
    assert r is not None and r.code == "ROLLBACK_NEEDED" and r.common_seqno == 0


def test_a_secondary_behind_its_primary():
    a, b = primary("A"), primary("B")
    receives(b, a)
    assert cp(a, 100, b, 40) == cp(b, 40, a, 100) == 40
    assert check(a, 100, b, 40) is None
    assert cp(a, 100, b, 100) == 100 and check(a, 100, b, 100) is None


def test_failover_b_promoted_at_98_while_a_has_99():
    """A originated 1..99, B received up to 98 and was promoted, A comes back as B's secondary:
    they agree up to 98, and A must roll back its 99 before it may receive B's 99."""
    a, b = primary("A"), primary("B")
    receives(b, a)
    promote(b, 98)
    assert [h.start_seqno for h in b.history] == [1, 99]
    assert b.history[1].uid != a.history[0].uid
    for b_seqno in (98, 99, 150):
        assert cp(b, b_seqno, a, 99) == 98
        assert cp(a, 99, b, b_seqno) == 98  # symmetric
    r = check(b, 150, a, 99)
    assert r is not None and r.code == "ROLLBACK_NEEDED" and r.common_seqno == 98
    assert "roll" in r.message and "A" in r.message
    # After rolling back to 98, A may receive from B; once connected it holds B's history.
    assert check(b, 150, a, 98) is None
    receives(a, b)
    assert cp(b, 150, a, 120) == 120


def test_failover_where_the_old_primary_had_nothing_unreplicated():
    a, b = primary("A"), primary("B")
    receives(b, a)
    promote(b, 98)
    assert cp(b, 130, a, 98) == 98 and check(b, 130, a, 98) is None


def test_split_brain_both_originated_after_the_common_point():
    """B promoted at 60 while A kept originating: the receiver (either) is ahead of 60."""
    a, b = primary("A"), primary("B")
    receives(b, a)
    promote(b, 60)
    assert cp(a, 90, b, 75) == 60
    assert check(a, 90, b, 75).code == "ROLLBACK_NEEDED"
    assert check(b, 75, a, 90).code == "ROLLBACK_NEEDED"


def test_cascade_a_to_b_to_c():
    a, b, c = primary("A"), primary("B"), primary("C")
    receives(b, a)
    assert cp(b, 80, c, 0) == 0 and check(b, 80, c, 0) is None
    receives(c, b)
    assert [(h.uid, h.start_seqno) for h in c.history] == [(h.uid, h.start_seqno) for h in a.history]
    assert cp(b, 80, c, 50) == 50 and check(b, 80, c, 50) is None
    # C may also be fed by A directly (B lost): the same records, so the same answer.
    assert cp(a, 100, c, 50) == 50 and check(a, 100, c, 50) is None


def test_cascade_after_failover_in_the_middle():
    """A→B→C; B is promoted at 80 while C has 70: C continues from B without rollback."""
    a, b, c = primary("A"), primary("B"), primary("C")
    receives(b, a)
    receives(c, b)
    promote(b, 80)
    assert cp(b, 95, c, 70) == 70 and check(b, 95, c, 70) is None
    # C had already received up to 80 from B before the promotion: still fine.
    assert cp(b, 95, c, 80) == 80 and check(b, 95, c, 80) is None


def test_online_rollback_on_the_primary_makes_a_new_record_that_old_receivers_see():
    """A rolled back from 100 to 90 and originated 91..95 again: same root primary, a new uid. B,
    which received the old 1..100, must see that it diverges at 90."""
    a, b = primary("A"), primary("B")
    receives(b, a)
    old_uid = a.history[-1].uid
    a.truncate_history(90)
    a.add_history(91, "A", "originating")
    assert [h.start_seqno for h in a.history] == [1, 91]
    assert a.history[-1].root_primary == "A" and a.history[-1].uid != old_uid
    assert cp(a, 95, b, 100) == 90
    assert cp(a, 95, b, 90) == 90 and check(a, 95, b, 90) is None
    r = check(a, 95, b, 100)
    assert r.code == "ROLLBACK_NEEDED" and r.common_seqno == 90
    # Without the new record (same uid over both ranges) the divergence would be invisible:
    assert common_point([HistoryEntry(1, "A", old_uid)], 95, [HistoryEntry(1, "A", old_uid)], 100) == 95


def test_same_start_different_uid_shares_nothing():
    x = [HistoryEntry(1, "A", 1)]
    y = [HistoryEntry(1, "A", 2)]
    assert common_point(x, 50, y, 50) == 0


def test_receiver_with_more_records_than_the_source():
    """The receiver went through a range the source never saw (it was promoted, then demoted)."""
    src = [HistoryEntry(1, "A", 1)]
    rcv = [HistoryEntry(1, "A", 1), HistoryEntry(31, "B", 2)]
    assert common_point(src, 100, rcv, 40) == 30


@pytest.mark.parametrize("field,code", [("name", "SAME_NAME"), ("group", "GROUP_MISMATCH")])
def test_identity_and_group_refusals(field, code):
    a = primary("A")
    b = primary("A" if field == "name" else "B", group="other" if field == "group" else "default")
    for i_am, (me, peer) in (("source", (a, b)), ("receiver", (b, a))):
        r = check_peer(hello_for(me, 10), hello_for(peer, 0), i_am=i_am)
        assert r is not None and r.code == code, i_am
        assert "A" in r.message


def test_a_supplementary_instance_never_feeds_a_bc_instance():
    a, b = primary("A"), primary("B")
    a.supplementary = True
    r = check_peer(hello_for(b, 0), hello_for(a, 10), i_am="receiver")
    assert r is not None and r.code == "SUPPLEMENTARY_MISMATCH"


def test_a_source_refuses_a_receiver_of_another_name_than_its_secondary():
    """``source start --secondary C`` reached B: refused, and the message names both and the remedies."""
    b = hello_for(primary("B"), 0)
    assert check_secondary_name(b, "B", source="A", address="127.0.0.1:7100") is None
    r = check_secondary_name(b, "C", source="A", address="127.0.0.1:7100")
    assert r is not None and r.code is RefusalCode.WRONG_NAME and r.common_seqno == -1
    assert "'C'" in r.message and "'B'" in r.message and "127.0.0.1:7100" in r.message
    assert "--secondary B" in r.message and "--connect" in r.message


histories = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 3)), min_size=1, max_size=4)


def build(spec: list[tuple[int, int]]) -> list[HistoryEntry]:
    out, start = [], 1
    for gap, uid in spec:
        out.append(HistoryEntry(start, "A", uid))
        start += gap
    return out


@settings(max_examples=300, deadline=None)
@given(hx=histories, hy=histories, sx=st.integers(0, 100), sy=st.integers(0, 100))
def test_common_point_properties(hx, hy, sx, sy):
    x, y = build(hx), build(hy)
    c = common_point(x, sx, y, sy)
    assert 0 <= c <= min(sx, sy)
    assert c == common_point(y, sy, x, sx)  # symmetric
    assert common_point(x, sx, x, sx) == sx  # an instance agrees with itself
    # Every seqno up to c lies in a record that both hold (same uid, same start).
    for s in range(1, c + 1):
        rx = max((e for e in x if e.start_seqno <= s), key=lambda e: e.start_seqno)
        ry = max((e for e in y if e.start_seqno <= s), key=lambda e: e.start_seqno)
        assert (rx.uid, rx.start_seqno) == (ry.uid, ry.start_seqno)
