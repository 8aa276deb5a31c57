"""Step 9 a-d under Hypothesis: for any two versions grown from a common ancestor on two replicas,
both replicas decide the same: same divergence, same winner, same conflict document; a session never
merges (issue 28), the field merge is an edit (``merge_conflicts``)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from multisite.multimaster.conflicts import (Kind, common_seq, conflict_document, descends, merge_conflicts,
                                             reconcile, winner)
from multisite.multimaster.conflicts import settle as settle_family
from multisite.multimaster.document import CONFLICT_FIELD, REF_FIELD, Doc, first_version

FIELDS = ["a", "b", "c", "d"]
UNID = "00" * 8 + "11" * 8

# An edit: (field changes or None for a deletion, clock step in µs)
edit = st.tuples(st.one_of(st.none(), st.dictionaries(st.sampled_from(FIELDS), st.integers(0, 9), min_size=1)),
                 st.integers(0, 3))


def grow(doc: Doc, edits, origin: str, clock: int) -> Doc:
    for fields, step in edits:
        if doc.deleted:
            break
        clock += step
        doc = doc.next_version(clock, origin, deleted=True) if fields is None else doc.next_version(clock, origin, fields)
    return doc


@st.composite
def two_lines(draw):
    merge = draw(st.booleans())
    base = first_version(UNID, "F", {f: 0 for f in FIELDS}, 100, "o0", merge)
    base = grow(base, draw(st.lists(edit, max_size=3)), "o0", 100)
    a = grow(base, draw(st.lists(edit, max_size=4)), "oa", base.time_us)
    b = grow(base, draw(st.lists(edit, max_size=4)), "ob", base.time_us)
    return base, a, b


def settle(cur: Doc, inc: Doc):
    out = reconcile(cur, inc)
    return (out.write or cur), out


@settings(max_examples=400)
@given(two_lines())
def test_both_replicas_reach_the_same_version(lines):
    _, a, b = lines
    on_a, _ = settle(a, b)
    on_b, _ = settle(b, a)
    # One pull-push: A pulls B's version, then B gets A's result.
    final_b, _ = settle(b, on_a)
    final_a, _ = settle(on_a, on_b)
    assert final_a == final_b
    assert winner(a, b) == winner(b, a)


@settings(max_examples=400)
@given(two_lines())
def test_divergence_is_symmetric_and_ancestors_are_not_conflicts(lines):
    base, a, b = lines
    assert descends(a, base) and descends(b, base)
    assert reconcile(a, base).kind in (Kind.SAME, Kind.OLDER)
    diverged = not descends(a, b) and not descends(b, a)
    kinds = {reconcile(a, b).kind, reconcile(b, a).kind}
    if not diverged:
        assert kinds <= {Kind.SAME, Kind.OLDER, Kind.UPDATED, Kind.DELETED}
    else:
        assert kinds & {Kind.KEPT, Kind.CONFLICT, Kind.MERGED, Kind.UPDATED, Kind.DELETED}
        assert common_seq(a, b) >= base.seq


@settings(max_examples=400)
@given(two_lines())
def test_merge_and_conflict_documents_are_identical_wherever_made(lines):
    _, a, b = lines
    out_a, out_b = reconcile(a, b), reconcile(b, a)
    assert Kind.MERGED not in (out_a.kind, out_b.kind)  # a session never merges, whatever the form
    conflicts = [o.conflict_doc for o in (out_a, out_b) if o.conflict_doc is not None]
    assert len(conflicts) <= 1  # only the side holding the loser makes one
    if conflicts:
        cd = conflicts[0]
        loser = a if out_a.conflict_doc else b
        assert cd.fields[CONFLICT_FIELD] == 1 and cd.fields[REF_FIELD] == UNID
        assert {k: v for k, v in cd.fields.items() if not k.startswith("$")} == loser.fields
        assert reconcile(a if loser is b else b, loser).kind is Kind.KEPT


def test_higher_sequence_number_wins_then_later_time():
    base = first_version(UNID, "F", {"a": 0}, 100, "o0", False)
    a = base.next_version(200, "oa", {"a": 1}).next_version(201, "oa", {"a": 2})
    b = base.next_version(900, "ob", {"a": 3})
    assert winner(a, b) is a
    out = reconcile(b, a)
    assert out.kind is Kind.CONFLICT and out.write == a and out.conflict_doc.fields["a"] == 3
    c = base.next_version(300, "oc", {"a": 4})
    assert winner(b, c) is b  # same seq: later time


def test_a_tie_on_sequence_and_time_goes_to_the_greater_database_identifier():
    base = first_version(UNID, "F", {"a": 0}, 100, "o0", False)
    a = base.next_version(200, "oa", {"a": 1})
    b = base.next_version(200, "ob", {"a": 2})
    assert winner(a, b) is b and winner(b, a) is b


def test_a_deletion_is_a_version_like_any_other_the_higher_sequence_then_the_later_time_wins():
    base = first_version(UNID, "F", {"a": 0}, 100, "o0", False)
    upd = base.next_version(200, "oa", {"a": 1}).next_version(210, "oa", {"a": 2})
    dele = base.next_version(300, "ob", deleted=True)
    assert winner(upd, dele) is upd and winner(dele, upd) is upd  # the seed: the latest sequence number
    edit = base.next_version(350, "oa", {"a": 9})
    later_del = base.next_version(400, "ob", deleted=True)
    assert winner(edit, later_del) is later_del  # equal sequence numbers: the later time
    assert reconcile(edit, later_del).kind is Kind.DELETED and reconcile(edit, later_del).conflict_doc is None
    later = base.next_version(500, "oa", {"a": 5})
    assert winner(later, later_del) is later
    assert reconcile(later_del, later).write == later


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.booleans(), st.sampled_from("abc")),
                 min_size=3, max_size=3))
def test_the_winner_is_one_total_order_so_any_session_order_converges(specs):
    base = first_version(UNID, "F", {"a": 0}, 100, "o0", False)
    a, b, c = (replace(base, seq=q, time_us=200 + t, deleted=d, origin=o) for q, t, d, o in specs)
    assert winner(a, winner(b, c)) == winner(winner(a, b), c)
    assert winner(a, b) == winner(b, a)


def test_merge_conflicts_is_an_edit_that_needs_the_form_setting_and_disjoint_fields():
    base = first_version(UNID, "F", {"a": 0, "b": 0}, 100, "o0", True)
    a = base.next_version(200, "oa", {"a": 1})
    b = base.next_version(300, "ob", {"b": 1})
    cd = conflict_document(a)
    m = merge_conflicts(b, [cd], 400, "oc")
    assert m is not None and m.fields == {"a": 1, "b": 1} and m.seq == b.seq + 1 and m.origin == "oc"
    assert descends(m, b) and descends(m, a)  # the conflict's line is absorbed: an ancestor now
    assert settle_family(m, [cd]).remove == (cd.unid,)  # so its conflict document goes, leaving no record
    overlapping = conflict_document(base.next_version(200, "oa", {"b": 7}))
    assert merge_conflicts(b, [overlapping], 400, "oc") is None
    plain = first_version(UNID, "F", {"a": 0, "b": 0}, 100, "o0", False)
    assert merge_conflicts(plain.next_version(300, "ob", {"b": 1}),
                           [conflict_document(plain.next_version(200, "oa", {"a": 1}))], 400, "oc") is None


def test_merge_conflicts_takes_in_a_field_removal_made_on_the_conflicts_line():
    """A CouchDB client's edit can take a field out (``couch.new_edit`` records its change in
    ``field_seqs``); merged, that removal is the conflict's change, and its conflict document goes:
    the merge that kept the field lost the losing edit with the only copy of it."""
    base = first_version(UNID, "F", {"a": 0, "b": 0}, 100, "o0", True)
    won = base.next_version(300, "ob", {"a": 1})
    took_b_out = replace(base.next_version(200, "oa", {}), fields={"a": 0}, field_seqs={"a": 1, "b": 2})
    cd = conflict_document(took_b_out)
    m = merge_conflicts(won, [cd], 400, "oc")
    assert m is not None and m.fields == {"a": 1} and m.field_seqs["b"] == m.seq
    assert settle_family(m, [cd]).remove == (cd.unid,)
    # a second conflict that changed the field the first one removed overlaps it and stays
    b_edit = conflict_document(base.next_version(150, "od", {"b": 5}))
    m2 = merge_conflicts(won, [cd, b_edit], 400, "oc")
    assert m2 is not None and m2.fields == {"a": 1} and settle_family(m2, [cd, b_edit]).remove == (cd.unid,)
