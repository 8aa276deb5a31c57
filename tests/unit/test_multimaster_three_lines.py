"""Three lines of one document on three replicas (issue 28): whatever the order the replicas meet in,
they end with the same winner, the same conflict documents and the same deleted ones. Each case is a
shape the simulation found (``testing/sim``, seeds 1009 and 1102), here on plain values: a replica is
its document and conflict documents, a meeting is ``reconcile`` and ``settle`` both ways, as
``DocDB.apply_incoming`` does them."""

from __future__ import annotations

from itertools import permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.multimaster.conflicts import (
    conflict_document,
    descends,
    merge_conflicts,
    reconcile,
    settle,
    winner,
)
from multisite.multimaster.document import Doc, first_version

UNID = "00" * 8 + "11" * 8
Replica = dict  # UNID -> Doc: the document and its conflict documents


def receive(rep: Replica, inc: Doc) -> Replica:
    """``rep`` after version ``inc`` (the document's or a conflict document's) arrives."""
    rep = dict(rep)
    out = reconcile(rep.get(inc.unid), inc)
    if out.write is not None:
        rep[out.write.unid] = out.write
    for cd in (out.conflict_doc, out.record):
        old = rep.get(cd.unid) if cd is not None else None
        if cd is not None and (old is None or (old.stamp != cd.stamp and descends(cd, old))):
            rep[cd.unid] = cd
    st = settle(rep.get(UNID), [d for u, d in rep.items() if u != UNID])
    rep.update((r.unid, r) for r in st.retire)
    for u in st.remove:
        del rep[u]
    return rep


def meet(reps: list[Replica], i: int, j: int) -> None:
    """A pull-push session: i takes j's versions, then j takes i's."""
    for d in list(reps[j].values()):
        reps[i] = receive(reps[i], d)
    for d in list(reps[i].values()):
        reps[j] = receive(reps[j], d)


def converge_in_every_order(lines: list[Doc]) -> list[Replica]:
    """Replica k starts with ``lines[k]``; for each order of the three pairs, meet in that order, then
    full rounds until nothing moves: the end of each order (all replicas identical in each)."""
    ends = []
    for order in permutations([(0, 1), (0, 2), (1, 2)]):
        for first in (False, True):  # and each pair the other way round
            reps = [{d.unid: d} for d in lines]
            for i, j in order:
                meet(reps, *((j, i) if first else (i, j)))
            for _ in range(4):
                for i, j in order:
                    meet(reps, i, j)
            assert reps[0] == reps[1] == reps[2], "replicas did not converge"
            ends.append(reps[0])
    return ends


def _state(rep: Replica) -> dict:
    return {u: (tuple(d.stamp), d.deleted, d.fields) for u, d in rep.items()}


def test_three_lines_on_a_merge_form_end_alike_in_every_order():
    """Seed 1009's shape: X and Y change fields apart, Z changes both, all from one ancestor, on a form
    with merge on. A session used to merge X and Y when they met first (and the merged version beat
    Z); met by Z first, each lost to it. Sessions no longer merge: Z (the highest) wins, X and Y are
    its conflict documents, in every order."""
    base = first_version(UNID, "memo", {"a": 0, "b": 0, "c": 0}, 100, "o0", True)
    x = base.next_version(200, "ox", {"a": 1})
    y = base.next_version(300, "oy", {"b": 2})
    z = base.next_version(250, "oz", {"a": 3, "b": 3}).next_version(260, "oz", {"c": 3})
    ends = converge_in_every_order([x, y, z])
    assert all(_state(e) == _state(ends[0]) for e in ends)
    end = ends[0]
    assert end[UNID] == z == winner(z, winner(x, y))
    assert {u: d for u, d in end.items() if u != UNID} == {cd.unid: cd for cd in map(conflict_document, (x, y))}


def test_the_ancestor_of_the_winner_that_meets_a_third_line_first_leaves_no_record():
    """Seed 1102's shape: replica R holds P, an ancestor of the winner W (on replica Q); S holds T,
    which beats P and loses to W. R meeting S first kept P as a conflict document, deleted when W came;
    meeting Q first made none. P is no leaf of the union of lines: no conflict document, no record, in
    every order; T is W's only conflict document."""
    base = first_version(UNID, "memo", {"a": 0, "b": 0}, 100, "o0", False)
    p = base.next_version(200, "op", {"a": 1})
    w = p.next_version(210, "op", {"a": 2})
    t = base.next_version(300, "ot", {"b": 5})  # beats p (same seq, later), loses to w (lower seq)
    assert winner(p, t) is t and winner(t, w) is w
    ends = converge_in_every_order([p, t, w])
    assert all(_state(e) == _state(ends[0]) for e in ends)
    assert ends[0] == {UNID: w, conflict_document(t).unid: conflict_document(t)}


def test_a_line_beaten_by_a_deletion_leaves_one_record_for_its_last_version_in_every_order():
    """A deletion D beats X and X's successor X2 (on two replicas): a replica that met X first made X's
    record (its conflict document, retired), one that met X2 first only X2's. X is no leaf once X2 is
    known: its record goes, and only X2's is left, in every order."""
    base = first_version(UNID, "memo", {"a": 0}, 100, "o0", False)
    d = base.next_version(200, "od", {"a": 1}).next_version(210, "od", {"a": 2}).next_version(220, "od", deleted=True)
    x = base.next_version(300, "ox", {"a": 5})
    x2 = x.next_version(310, "ox", {"a": 6})
    ends = converge_in_every_order([x, x2, d])
    assert all(_state(e) == _state(ends[0]) for e in ends)
    end = ends[0]
    assert end[UNID] == d
    (rec,) = [c for u, c in end.items() if u != UNID]
    assert rec.deleted and rec.stamp_at(rec.seq - 1) == tuple(x2.stamp)


def test_an_update_beaten_by_a_deletion_that_lost_itself_is_dropped_in_every_order():
    """Seed 1128's shape: W beats the deletion D, which beats X. X meeting D first was dropped (its
    record: its conflict document, retired); meeting W first it stayed a live conflict document. A
    live conflict document that a losing deletion ranks above is retired: X is dropped in every order."""
    base = first_version(UNID, "memo", {"a": 0, "b": 0}, 100, "o0", True)
    w = base.next_version(400, "ow", {"a": 1})
    d = base.next_version(300, "od", deleted=True)
    x = base.next_version(200, "ox", {"b": 2})
    assert winner(w, d) is w and winner(d, x) is d
    ends = converge_in_every_order([x, d, w])
    assert all(_state(e) == _state(ends[0]) for e in ends)
    end = ends[0]
    assert end[UNID] == w
    assert {u: (c.deleted, c.stamp_at(c.seq - 1 if c.origin != d.origin else c.seq)) for u, c in end.items()
            if u != UNID} == {conflict_document(x).unid: (True, tuple(x.stamp)),
                              conflict_document(d).unid: (True, tuple(d.stamp))}


# An edit: (field changes, or None for a deletion; clock step in µs)
_edit = st.tuples(st.one_of(st.none(), st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), min_size=1)),
                  st.integers(0, 3))


def _grow(doc: Doc, edits, origin: str) -> Doc:
    for fields, step in edits:
        if doc.deleted:
            break
        t = doc.time_us + step
        doc = doc.next_version(t, origin, deleted=True) if fields is None else doc.next_version(t, origin, fields)
    return doc


_either = st.booleans()
_update = st.tuples(st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), min_size=1, max_size=1),
                    st.integers(0, 3))


@st.composite
def _three_lines(draw, merge=_either, edit=_edit):
    """Three versions of one document: each grown from the base or from an earlier one of them (so a
    line may be another's ancestor), by edits on its own replica."""
    base = first_version(UNID, "memo", {"a": 0, "b": 0, "c": 0}, 100, "o0", draw(merge))
    lines: list[Doc] = []
    for k in range(3):
        start = draw(st.sampled_from([base, *lines]))
        lines.append(_grow(start, draw(st.lists(edit, min_size=1, max_size=3)), f"o{k + 1}"))
    return lines


@settings(max_examples=300, deadline=None)
@given(_three_lines())
def test_any_three_lines_end_alike_in_every_order(lines):
    """The invariant itself, on any three lines from one base: every meeting order of three replicas
    ends with the same document and conflict documents, live and deleted."""
    ends = converge_in_every_order(lines)
    assert all(_state(e) == _state(ends[0]) for e in ends)


@settings(max_examples=200, deadline=None)
@given(_three_lines(st.just(True), _update), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1,
                                                   max_size=4), st.integers(0, 2))
def test_a_merge_made_as_an_edit_replicates_like_any_edit(lines, meetings, who):
    """``merge_conflicts`` on one replica after some meetings: a new version of the document that
    absorbs the conflicts it merged. Then every replica converges to the same document and conflict
    documents, and no conflict document is left for a line the document absorbed."""
    reps = [{d.unid: d} for d in lines]
    for i, j in meetings:
        if i != j:
            meet(reps, i, j)
    rep = reps[who]
    cur = rep.get(UNID)
    if cur is not None and not cur.deleted:
        m = merge_conflicts(cur, [d for u, d in rep.items() if u != UNID], cur.time_us + 1000, "om")
        if m is not None:
            reps[who] = receive(rep, m)
    for _ in range(4):
        for i, j in ((0, 1), (0, 2), (1, 2)):
            meet(reps, i, j)
    assert reps[0] == reps[1] == reps[2]
    doc = reps[0][UNID]
    assert not any(descends(doc, c) for u, c in reps[0].items() if u != UNID and not c.deleted)
