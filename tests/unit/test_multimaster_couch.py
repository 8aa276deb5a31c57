"""The CouchDB vocabulary of multi-master documents (``multimaster/couch.py``), and the proof that the
two winner rules agree.

The model test runs a multisite replica A (documents, conflict documents, the native reconcile for
sessions with a second replica B, ``couch.plan`` for what a client pushes) beside a CouchDB model
written here from CouchDB's rules alone (a revision tree per document; new_edits:false merges paths;
the winner is the live leaf with the highest position, then the highest hash; ``_conflicts`` are the
other live leaves). Random edits on all three sides, random replications both ways (the client pushes
the leaves of the documents it changed, as PouchDB's changes feed lists them; it pulls the leaves of
A's changed documents it lacks), then both ways until nothing moves: every document has the same
winner on both sides (the same revision and body when it is live, deleted on both otherwise), the
client's ``_conflicts`` are exactly A's live conflict documents, and A and B hold the same documents.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multisite.multimaster import couch
from multisite.multimaster.conflicts import Kind, reconcile, settle
from multisite.multimaster.document import COUCH_ID_FIELD, REF_FIELD, Doc, first_version
from multisite.multimaster.ids import Stamp

HEX = "0123456789abcdef"


# -- revision ids ----------------------------------------------------------------------------------
def test_a_version_is_a_revision_id_and_back():
    assert couch.rev_of(3, 0x62a1, "00112233aabbccdd") == "3-00000000000062a100112233aabbccdd"
    assert couch.parse_rev("3-00000000000062a100112233aabbccdd") == Stamp(3, 0x62a1, "00112233aabbccdd")
    md5 = "0dc33db52a43872b6f3371cef7de0277"  # a hash CouchDB made
    s = couch.parse_rev("1-" + md5)
    assert couch.rev_of(*s) == "1-" + md5


@pytest.mark.parametrize("rev", ["", "1", "x-00000000000000000a", "0-0000000000000000aa", "1-abc", "1-",
                                 "1-ZZ00000000000000aa", "1-0000000000000000 a", "99999999999-0000000000000000aa",
                                 3, None, "1-ffffffffffffffffaa"])
def test_malformed_revisions_get_couchdbs_error(rev):
    with pytest.raises(couch.CouchError) as e:
        couch.parse_rev(rev)
    assert e.value.status == 400 and e.value.body() == {"error": "bad_request", "reason": "Invalid rev format"}


hashes = st.one_of(st.text(HEX, min_size=32, max_size=32),  # a client's (md5)
                   st.builds(lambda t, o: f"{t:016x}{o}", st.integers(0, 2**53), st.text(HEX, min_size=16, max_size=16)),
                   st.builds(lambda t, o: f"{t:016x}m{o}", st.integers(0, 2**53), st.text(HEX, min_size=15, max_size=15)))


@settings(max_examples=500)
@given(st.integers(1, 50), hashes, st.integers(1, 50), hashes)
def test_couchdbs_order_of_revisions_is_the_seeds_order_of_versions(p1, h1, p2, h2):
    a, b = couch.parse_rev(f"{p1}-{h1}"), couch.parse_rev(f"{p2}-{h2}")
    assert couch.rev_of(*a) == f"{p1}-{h1}"
    assert ((p1, h1) < (p2, h2)) == (tuple(a) < tuple(b))  # (seq, time, origin): the seed's rule, ties aside


def test_ids_names_and_since():
    assert couch.unid_for("a" * 32) == "a" * 32
    assert couch.unid_for("profile:ada") == couch.unid_for("profile:ada") != couch.unid_for("profile:bob")
    assert len(couch.unid_for("x")) == 32
    assert couch.db_name("Profiles") == "profiles" and couch.db_name("My Mail 2") == "my-mail-2"
    assert couch.db_name("2024 logs") == "db-2024-logs"
    with pytest.raises(couch.CouchError) as e:
        couch.check_db_name("Bad Name")
    assert e.value.error == "illegal_database_name"
    assert couch.parse_since("12-aaaa", "aaaa", 20) == 12
    assert couch.parse_since("12-bbbb", "aaaa", 20) == 0  # another database's: from the start, nothing lost
    assert couch.parse_since("30-aaaa", "aaaa", 20) == 0  # past the end (a restored backup): likewise
    assert couch.parse_since("now", "aaaa", 20) == 20 and couch.parse_since(7, "aaaa", 20) == 7
    with pytest.raises(couch.CouchError) as e:
        couch.parse_since("x-1", "aaaa", 20)
    assert e.value.body()["reason"] == "Malformed sequence supplied in 'since' parameter."


def test_local_documents_take_their_current_rev_only():
    assert couch.check_local_put(None, {"last_seq": 1}) == 1
    assert couch.check_local_put({"n": 1, "body": {}}, {"_rev": "0-1"}) == 2
    for cur, body in (({"n": 2, "body": {}}, {"_rev": "0-1"}), ({"n": 2, "body": {}}, {}), (None, {"_rev": "0-3"})):
        with pytest.raises(couch.CouchError) as e:
            couch.check_local_put(cur, body)
        assert e.value.status == 409 and e.value.error == "conflict"


def test_a_clients_document_is_kept_exactly():
    body = {"_id": "profile:ada", "_rev": "2-" + "b" * 32, "_revisions": {"start": 2, "ids": ["b" * 32, "a" * 32]},
            "name": "Ada", "tags": ["x", {"y": 1.5}], "n": None}
    d = couch.from_couch(body)
    assert d.unid == couch.unid_for("profile:ada") and d.seq == 2 and d.fields[COUCH_ID_FIELD] == "profile:ada"
    assert d.form == couch.DEFAULT_FORM and not d.merge
    Doc.from_value(d.to_value())  # a valid stored document
    assert couch.to_json(d, revs=True) == body
    gone = couch.from_couch({"_id": "profile:ada", "_rev": "3-" + "c" * 32, "_deleted": True,
                             "_revisions": {"start": 3, "ids": ["c" * 32, "b" * 32]}})
    assert gone.deleted and gone.fields == {COUCH_ID_FIELD: "profile:ada"} and gone.revisions[0] == couch.STEM
    assert couch.to_json(gone, revs=True)["_revisions"] == {"start": 3, "ids": ["c" * 32, "b" * 32]}


@pytest.mark.parametrize("body,status,error", [
    ({"_id": "a", "_rev": "1-" + "a" * 32, "$Conflict": 1}, 400, "doc_validation"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "_foo": 1}, 400, "doc_validation"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "_attachments": {"f": {"follows": True}}}, 415, "bad_content_type"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "_attachments": {"f": {"data": "not base64!"}}}, 400, "bad_request"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "_attachments": {"_f": {"data": ""}}}, 400, "bad_request"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "$File/f": 1}, 400, "doc_validation"),
    ({"_id": "_bad", "_rev": "1-" + "a" * 32}, 400, "illegal_docid"),
    ({"_id": "a"}, 400, "bad_request"),
    ({"_id": "a", "_rev": "2-" + "a" * 32, "_revisions": {"start": 2, "ids": ["b" * 32]}}, 400, "bad_request"),
    ({"_id": "a", "_rev": "1-" + "a" * 32, "big": 2**70}, 400, "doc_validation"),
    ([1], 400, "bad_request"),
])
def test_what_a_client_may_not_send(body, status, error):
    with pytest.raises(couch.CouchError) as e:
        couch.from_couch(body)
    assert (e.value.status, e.value.error) == (status, error)


# -- the model -------------------------------------------------------------------------------------
class CouchModel:
    """A CouchDB database from CouchDB's rules: per document, revisions with their parent, body, deletion."""

    def __init__(self):
        self.docs: dict[str, dict[str, dict]] = {}
        self.dirty: set[str] = set()  # documents changed since the last push (its changes feed)

    @staticmethod
    def _pos(rev):
        p, _, h = rev.partition("-")
        return int(p), h

    def leaves(self, i):
        revs = self.docs.get(i, {})
        parents = {n["parent"] for n in revs.values()}
        return [r for r in revs if r not in parents]

    def rank(self, i, r):
        p, h = self._pos(r)
        return (not self.docs[i][r]["deleted"], p, h)

    def winner(self, i):
        return max(self.leaves(i), key=lambda r: self.rank(i, r))

    def conflicts(self, i):
        w = self.winner(i)
        return {r for r in self.leaves(i) if r != w and not self.docs[i][r]["deleted"]}

    def path(self, i, r):
        out = []
        while r is not None:
            out.append(self._pos(r)[1])
            r = self.docs[i][r]["parent"]
        return out

    def put_path(self, i, revs, deleted, body):
        """new_edits: false: ``revs`` newest first."""
        d = self.docs.setdefault(i, {})
        if revs[0] in d:
            return False
        for k, r in enumerate(revs):
            parent = revs[k + 1] if k + 1 < len(revs) else None
            if r in d:
                if d[r]["parent"] is None:
                    d[r]["parent"] = parent
                continue
            d[r] = {"parent": parent, "deleted": deleted if k == 0 else False, "body": body if k == 0 else None}
        self.dirty.add(i)
        return True

    def edit(self, i, parent, body, deleted, h):
        pos = self._pos(parent)[0] + 1 if parent else 1
        r = f"{pos}-{h}"
        self.docs.setdefault(i, {})[r] = {"parent": parent, "deleted": deleted, "body": None if deleted else body}
        self.dirty.add(i)


class Replica:
    """A multisite replica, free of storage: documents by UNID; native sessions reconcile each version."""

    def __init__(self, db_id):
        self.db_id = db_id
        self.docs: dict[str, Doc] = {}
        self.changed: set[str] = set()  # families written since the client last pulled

    def family(self, unid):
        cur = self.docs.get(unid)
        if cur is not None and cur.is_conflict:
            cur = None
        return couch.Family(unid, cur, tuple(d for d in self.docs.values()
                                             if d.is_conflict and d.fields.get(REF_FIELD) == unid))

    def write(self, d):
        self.docs[d.unid] = d
        self.changed.add(d.fields[REF_FIELD] if d.is_conflict else d.unid)

    def receive(self, d):
        """A version from a replica (seed step 9, as ``DocDB.apply_incoming``); True if anything was written."""
        out = reconcile(self.docs.get(d.unid), d)
        moved = False
        if out.write is not None:
            self.write(out.write)
            moved = True
        for cd in (out.conflict_doc, out.record):
            if cd is not None and cd.unid not in self.docs:
                self.write(cd)
                moved = True
        ref = d.fields[REF_FIELD] if d.is_conflict else d.unid
        fam = self.family(ref)
        return self.settle(fam) or moved

    def settle(self, fam):
        """``conflicts.settle`` on a family, as ``DocDB`` runs it with every write: True if anything moved."""
        st = settle(fam.current, fam.conflicts)
        for r in st.retire:
            self.write(r)
        for u in st.remove:
            del self.docs[u]
        return bool(st.retire or st.remove)

    def mains(self):
        return [d for d in self.docs.values() if not d.is_conflict]


def session(a, b):
    moved = 0
    for x, y in ((a, b), (b, a)):
        for d in list(x.docs.values()):
            moved += y.receive(d)
    return moved


def pull(model, a, only_changed=True):
    """The client pulls A's changed documents: each leaf it lacks, with its path (revs_diff + _bulk_get)."""
    moved = 0
    unids = set(a.changed) if only_changed else {d.unid for d in a.mains()}
    a.changed.clear()
    for unid in sorted(unids):
        fam = a.family(unid)
        i = fam.doc_id()
        if i is None:
            continue
        for lf in couch.Tree(fam).leaves:
            revs = [f"{lf.seq - k}-{h}" for k, h in enumerate(lf.path)]
            j = lf.json(i)
            body = {k: v for k, v in j.items() if not k.startswith("_")}
            moved += model.put_path(i, revs, lf.deleted, None if lf.deleted else body)
    return moved


def push(model, a):
    """The client pushes the leaves of its changed documents that A's tree lacks (_revs_diff, then
    _bulk_docs new_edits: false), applied with ``couch.plan``."""
    moved = 0
    dirty, model.dirty = model.dirty, set()
    for i in sorted(dirty):
        unid = couch.unid_for(i)
        tree = couch.Tree(a.family(unid))
        sent = []
        for r in sorted(model.leaves(i), key=lambda r: model.rank(i, r), reverse=True):
            if tree.knows(couch.parse_rev(r)):
                continue
            n = model.docs[i][r]
            path = model.path(i, r)
            body = {"_id": i, "_rev": r, "_revisions": {"start": model._pos(r)[0], "ids": path}}
            body.update({"_deleted": True} if n["deleted"] else n["body"])
            sent.append(couch.from_couch(body))
        p = couch.plan(a.family(unid), sent)
        for d in p.writes:
            a.write(d)
        for u in p.removes:
            a.docs.pop(u, None)
        moved += len(p.writes) + len(p.removes)
    return moved


edit = st.one_of(
    st.tuples(st.just("ms_update"), st.integers(0, 1), st.integers(0, 50), st.sampled_from("abc"), st.integers(0, 9)),
    st.tuples(st.just("cd_edit"), st.integers(0, 50), st.sampled_from("abc"), st.integers(0, 9)),
)
op = st.one_of(
    edit, edit, edit,
    st.tuples(st.just("ms_create"), st.integers(0, 1), st.sampled_from(["M", "P"])),
    st.tuples(st.just("ms_delete"), st.integers(0, 1), st.integers(0, 50)),
    st.tuples(st.just("ms_resolve"), st.integers(0, 1), st.integers(0, 50)),
    st.tuples(st.just("cd_create"), st.integers(0, 3)),
    st.tuples(st.just("cd_delete"), st.integers(0, 50)),
    st.tuples(st.just("cd_edit_conflict"), st.integers(0, 50), st.integers(0, 9)),
    st.tuples(st.just("cd_resolve"), st.integers(0, 50)),
    st.tuples(st.just("cd_resolve"), st.integers(0, 50)),
    st.tuples(st.just("cd_recreate"), st.integers(0, 50)),
)
sync = st.one_of(st.tuples(st.just("pull"), st.booleans()), st.tuples(st.just("push"),), st.tuples(st.just("session"),))
ops_and_syncs = st.lists(st.one_of(op, op, sync), min_size=20, max_size=100)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_and_syncs, seed=st.integers(0, 2**32))
def test_couchdbs_winner_is_the_seeds_winner_over_random_histories(ops, seed):
    rng = random.Random(seed)
    a, b = Replica("aaaaaaaaaaaaaaaa"), Replica("bbbbbbbbbbbbbbbb")
    model = CouchModel()
    tick = [1_000_000]

    last = {}

    def clock(db_id=None):  # same-µs edits on two replicas on purpose; one database's times increase (DocDB._now)
        tick[0] += rng.choice([0, 1, 5])
        t = max(tick[0], last.get(db_id, 0) + 1) if db_id else tick[0]
        last[db_id] = t
        return t

    def client_hash():  # md5-like, or with a time-like prefix in the servers' range (ties at equal positions)
        if rng.random() < 0.5:
            return "".join(rng.choice(HEX) for _ in range(32))
        return f"{tick[0] + rng.choice([-1, 0, 1]):016x}" + "".join(rng.choice(HEX) for _ in range(16))

    def pick(xs, k):
        return xs[k % len(xs)] if xs else None

    for k in range(3):  # a few documents every side holds, to edit apart
        t = clock(a.db_id)
        a.write(first_version(f"{t:016x}{rng.getrandbits(64):016x}", "MP"[k % 2], {f: 0 for f in "abc"}, t,
                              a.db_id, k % 2 == 0))
        model.edit(f"doc:{k}", None, {"a": 0, "b": 0}, False, client_hash())
    push(model, a), pull(model, a), session(a, b)

    for o in ops:
        kind = o[0]
        if kind.startswith("ms_"):
            r = (a, b)[o[1]]
            live = sorted((d for d in r.mains() if not d.deleted), key=lambda d: d.unid)
            if kind == "ms_create":
                t = clock(r.db_id)
                r.write(first_version(f"{t:016x}{rng.getrandbits(64):016x}", o[2], {f: 0 for f in "abc"}, t,
                                      r.db_id, o[2] == "M"))
            elif kind == "ms_update" and live:
                d = pick(live, o[2])
                r.write(d.next_version(clock(r.db_id), r.db_id, {o[3]: o[4]}))
            elif kind == "ms_delete" and live:
                gone = pick(live, o[2]).next_version(clock(r.db_id), r.db_id, deleted=True)
                r.write(gone)
                r.settle(r.family(gone.unid))  # as DocDB.delete
            elif kind == "ms_resolve":
                cds = sorted((d for d in r.docs.values() if d.is_conflict and not d.deleted), key=lambda d: d.unid)
                if cds:
                    r.write(pick(cds, o[2]).next_version(clock(r.db_id), r.db_id, deleted=True))
        elif kind == "cd_create":
            i = rng.choice([f"doc:{len(model.docs)}", f"{rng.getrandbits(128):032x}"])
            model.edit(i, None, {"a": o[1]}, False, client_hash())
        elif kind in ("cd_edit", "cd_delete", "cd_recreate"):
            ids = sorted(model.docs)
            i = pick(ids, o[1])
            if i is None:
                continue
            w = model.winner(i)
            if kind == "cd_recreate" and model.docs[i][w]["deleted"]:
                model.edit(i, w, {"a": 7}, False, client_hash())
            elif kind != "cd_recreate" and not model.docs[i][w]["deleted"]:
                if kind == "cd_edit":
                    model.edit(i, w, {**model.docs[i][w]["body"], o[2]: o[3]}, False, client_hash())
                else:
                    model.edit(i, w, None, True, client_hash())
        elif kind in ("cd_edit_conflict", "cd_resolve"):
            ids = sorted(i for i in model.docs if model.conflicts(i))
            i = pick(ids, o[1])
            if i is None:
                continue
            c = min(model.conflicts(i))
            if kind == "cd_resolve":
                model.edit(i, c, None, True, client_hash())
            else:
                model.edit(i, c, {**(model.docs[i][c]["body"] or {}), "a": o[2]}, False, client_hash())
        elif kind == "pull":
            pull(model, a, only_changed=o[1])
        elif kind == "push":
            push(model, a)
        else:
            session(a, b)

    for _round in range(12):  # both ways until nothing moves
        moved = push(model, a) + pull(model, a) + session(a, b)
        if moved == 0:
            break
    assert moved == 0, "replication did not settle"
    assert a.docs == b.docs, "the two multisite replicas differ"
    for d in a.mains():
        fam = a.family(d.unid)
        i = fam.doc_id()
        assert i in model.docs, f"document {i} never reached the client"
        w = model.winner(i)
        tree = couch.Tree(fam)
        assert tree.winner.rev == w or (d.deleted and model.docs[i][w]["deleted"]), (i, w, tree.winner.rev)
        if d.deleted:
            assert model.docs[i][w]["deleted"], f"{i}: deleted in multisite, live {w} in CouchDB"
            continue
        assert w == couch.doc_rev(d) and not model.docs[i][w]["deleted"], f"{i}: CouchDB's winner {w} is not {d.stamp}"
        assert model.docs[i][w]["body"] == couch.body_of(d)
        losers = {couch.doc_rev(c) for c in fam.conflicts if not c.deleted}
        assert model.conflicts(i) == losers, f"{i}: CouchDB's _conflicts {model.conflicts(i)} != conflict documents {losers}"
    for i in model.docs:
        assert couch.unid_for(i) in a.docs, f"the client's document {i} is not in multisite"


def test_a_deletion_that_beats_a_clients_live_leaf_tombstones_it():
    base = couch.from_couch({"_id": "x", "_rev": "1-" + "1" * 32, "v": 0})
    a = Replica("aaaaaaaaaaaaaaaa")
    a.write(base)
    gone = base.next_version(0x7000000000000000, a.db_id, deleted=True)  # later than the client's edit below
    a.write(gone)
    edit = {"_id": "x", "_rev": "2-" + "2" * 32, "_revisions": {"start": 2, "ids": ["2" * 32, "1" * 32]}, "v": 1}
    p = couch.plan(a.family(base.unid), [couch.from_couch(edit)])
    assert p.outcomes == [Kind.KEPT.value]
    (rec,) = p.writes  # the record: the edit's conflict document, deleted at once
    assert rec.is_conflict and rec.deleted and rec.seq == 3 and rec.stamp_at(2) == (2, 0x2222222222222222, "2" * 16)
    tree = couch.Tree(couch.Family(base.unid, gone, (rec,)))
    assert tree.deleted and tree.conflicts() == []
    assert any(lf.deleted and lf.path[1] == "2" * 32 for lf in tree.leaves)  # the tombstone under the edit


def _client(i: str, revs: list[str], **body) -> Doc:
    pos = int(revs[0].split("-")[0])
    return couch.from_couch({"_id": i, "_rev": revs[0], "_revisions": {"start": pos, "ids": [r.split("-", 1)[1] for r in revs]},
                             **body})


def test_a_deletion_beaten_by_a_deletion_leaves_a_record_so_the_line_reads_dead():
    base = _client("d", ["1-" + "1" * 32], v=0)
    a = Replica("aaaaaaaaaaaaaaaa")
    a.write(base)
    live2 = base.next_version(0x10, a.db_id, {"v": 2})  # the client pulled this one
    a.write(live2)
    mine = live2.next_version(0x11, a.db_id, deleted=True)  # A deletes it
    a.write(mine)
    theirs = _client("d", ["3-" + "e" * 32, "2-" + "e" * 32, "1-" + "1" * 32], _deleted=True)  # the client's, later
    p = couch.plan(a.family(base.unid), [theirs])
    assert p.fam.current == theirs
    (rec,) = [d for d in p.writes if d.is_conflict]
    assert rec.deleted and rec.stamp == mine.stamp  # A's deletion, recorded: its line ends live2
    tree = couch.Tree(p.fam)
    assert tree.deleted and couch.doc_rev(rec) in tree.deleted_conflicts() + [tree.winner.rev]
    assert tree.knows(live2.stamp)  # a client holding live2 sees it end in a tombstone


def _two_lines_in_conflict(db):
    """A document whose local edit ``loser`` lost to a received line of two versions (w, w2): one
    conflict document holds it. Returns (unid, the common version, loser)."""
    u = db.create("F", {"v": 0})
    base = db.get(u)
    w = base.next_version(base.time_us + 10, "bbbbbbbbbbbbbbbb", {"v": "w"}).next_version(
        base.time_us + 11, "bbbbbbbbbbbbbbbb", {"v": "w2"})
    loser = db.update(u, {"v": "l"})
    assert db.apply_incoming([w])["conflict"] == 1
    return u, base, loser


def test_a_conflict_whose_line_goes_on_is_removed_and_a_deleted_document_takes_its_conflicts(tmp_path):
    from multisite import documents
    db = documents.create(tmp_path / "a", "T", durability="none")
    try:
        u, base, loser = _two_lines_in_conflict(db)
        (c,) = [d for d in db.documents() if d.is_conflict]
        assert c.stamp == loser.stamp and c.revisions == loser.revisions  # the loser's line
        later = loser.next_version(base.time_us + 20, "cccccccccccccccc", {"v": "l2"}).next_version(
            base.time_us + 21, "cccccccccccccccc", {"v": "l3"})  # the losing line goes on and wins
        db.apply_incoming([later])
        assert db.get(u) == later
        cds = {d.unid: d for d in db.documents(include_deleted=True) if d.is_conflict}
        assert c.unid not in cds  # its line went on: no losing leaf, no record (conflicts.settle)
        (now,) = cds.values()
        assert now.fields["v"] == "w2" and not now.deleted  # w2 is the loser now
        db.delete(u)
        assert all(d.deleted for d in db.documents(include_deleted=True) if d.is_conflict)
    finally:
        db.close()


def test_a_retirement_a_client_pulled_and_settle_removed_is_known_not_taken_back_as_a_deletion(tmp_path):
    """A client pulls a retirement while it is a leaf (the document deleted, its conflict retired); the
    losing line goes on and wins, so settle removes the retirement. The client still holds it: the
    server must know it (``_revs_diff``, ``new_edits=false``), or the client pushes it back and it is
    stored as the record of a deletion that lost, under a new UNID, on this server only (one that
    ranks above a live conflict retires it)."""
    from multisite import documents
    from multisite.multimaster.server.couch_docs import revs_diff_sync, write_docs_sync
    db = documents.create(tmp_path / "a", "T", durability="none")
    try:
        u, base, loser = _two_lines_in_conflict(db)
        db.delete(u)  # it takes its conflict with it: a retirement
        cur, cds = db.families([u])[u]
        (r,) = cds
        tree = couch.Tree(couch.Family(u, cur, tuple(cds)))
        (lf,) = [lf for lf in tree.leaves if lf.doc is r]  # the client pulls it as a deleted leaf
        body = lf.json(couch.couch_id(cur), revs=True)
        later = loser
        for k in range(3):  # the losing line goes on and wins over the deletion
            later = later.next_version(base.time_us + 20 + k, "cccccccccccccccc", {"v": f"l{k}"})
        db.apply_incoming([later])
        assert db.get(u) == later and r.unid not in {d.unid for d in db.documents(include_deleted=True)}
        before = sorted(d.unid for d in db.documents(include_deleted=True))
        asked = {body["_id"]: [body["_rev"]]}
        assert revs_diff_sync(db, asked, {i: [couch.parse_rev(x) for x in v] for i, v in asked.items()}) == {}
        assert write_docs_sync(db, [body], new_edits=False) == [{"ok": True, "id": body["_id"], "rev": body["_rev"]}]
        assert sorted(d.unid for d in db.documents(include_deleted=True)) == before  # no record made of it
    finally:
        db.close()


# -- _purge (couch_purge.plan_purge) ---------------------------------------------------------------
def test_purge_plans_remove_leaves_and_put_the_best_conflict_in_the_winners_place():
    from multisite.multimaster import couch_purge
    from multisite.multimaster.couch import Family, from_couch, plan
    h = {k: k * 32 for k in "123"}
    vs = [from_couch({"_id": "x", "_rev": f"1-{h[k]}", "v": k}) for k in "123"]
    fam = plan(Family(couch.unid_for("x"), None), vs).fam  # a winner (3) and two conflict documents
    assert couch.doc_rev(fam.current) == "1-" + h["3"] and len(fam.conflicts) == 2
    p = couch_purge.plan_purge(fam, ["1-" + h["1"], "2-" + h["1"]])  # a conflict's leaf; no such revision
    assert p.purged == ["1-" + h["1"]] and len(p.removes) == 1 and p.writes == [fam.current]
    p = couch_purge.plan_purge(fam, ["1-" + h["3"]])  # the winner: the best conflict (2) takes its place
    (w,) = p.writes
    assert (w.unid, couch.doc_rev(w), w.fields, w.is_conflict) == (fam.unid, "1-" + h["2"], {"v": "2", "$CouchId": "x"}, False)
    assert p.removes == sorted(c.unid for c in fam.conflicts if couch.doc_rev(c) == "1-" + h["2"])
    p = couch_purge.plan_purge(fam, ["1-" + h[k] for k in "123"])  # every leaf: nothing is left
    assert p.writes == [] and sorted(p.removes) == sorted([fam.unid] + [c.unid for c in fam.conflicts])
    with pytest.raises(couch.CouchError, match="at most 100 documents"):
        couch_purge.check_request({str(i): [] for i in range(101)})


def test_the_retirement_of_a_conflict_edited_before_it_was_retired_is_known_once_removed():
    """``knows_retirement`` for a conflict document a client edited and that was then retired: its UNID
    comes from the first losing version, an ancestor of the version retired."""
    from dataclasses import replace

    from multisite.multimaster.conflicts import conflict_document, retired
    base = first_version("00" * 8 + "11" * 8, "F", {"v": 0}, 100, "o0", False)
    c = conflict_document(base.next_version(150, "ol", {"v": "l"}))
    edited = c.next_version(160, "oe", {"v": "l2"})  # an edit of the conflict document
    r = retired(edited)  # then its document was deleted
    went_on = replace(edited, unid=base.unid, fields={"v": "l3"}).next_version(170, "ol", {"v": "l3"})
    tree = couch.Tree(couch.Family(base.unid, went_on, ()))  # the edited line went on and won: r removed
    assert tree.knows(r.stamp)
    assert not couch.Tree(couch.Family(base.unid, base.next_version(150, "ol", {"v": "l"}), ())).knows(r.stamp)
