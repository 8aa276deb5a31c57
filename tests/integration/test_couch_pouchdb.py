"""Real PouchDB (9, Node, LevelDB) replicating with a real document server's CouchDB endpoints (issue 26):
one-shot both ways, on through multisite to a second PouchDB and through the native protocol to a
second server, live sync with edits on both sides, conflicts made on each side and resolved with the
same winner and losers as ``multisite doc get`` shows, a reader refused, and the server killed in the
middle of a large replication with the client's retry finishing it, nothing doubled.

The pinned packages are installed once into a cache (``multisite.testing.pouchdb``); the tests skip,
saying why, only where Node, npm or the npm registry cannot be had.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from click.testing import CliRunner

from multisite import documents
from multisite.cli.main import cli
from multisite.instance.users import add_user
from multisite.multimaster import couch
from multisite.testing.docservers import DocCluster


def serve(dc: DocCluster, name: str = "A", titles=("Profiles",), replica_of=None):
    node = dc.server(name, list(titles), start=False, replica_of=replica_of)
    node.options.setdefault("start", {})["couch_listen"] = "127.0.0.1:0"
    dc.start(node)
    port = json.loads((node.home / "run" / "docserver.json").read_text())["couch_port"]
    node.options["start"]["couch_listen"] = f"127.0.0.1:{port}"  # a restart keeps the port
    node.url = f"http://127.0.0.1:{port}/profiles"
    return node


def wait_for(fn, timeout=30.0, what="the condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def server_docs(node) -> dict[str, dict]:
    """The server's winners as CouchDB answers them: _id -> doc (with _conflicts)."""
    with urllib.request.urlopen(node.url + "/_all_docs?include_docs=true&conflicts=true", timeout=30) as r:
        return {row["id"]: row["doc"] for row in json.loads(r.read())["rows"]}


def strip(docs) -> dict:
    return {d["_id"]: d for d in docs}


def test_one_shot_both_ways_on_to_a_second_pouchdb_and_through_the_native_protocol(dc, pouch):
    a = serve(dc)
    ms = documents.connect(a.home, db="Profiles")
    unids = ms.create_many([("Person", {"name": f"m{i}", "i": i}) for i in range(40)])
    pouch("open", name="p1")
    pouch("bulk", name="p1", n=60, prefix="pouch:", body={"kind": "made in PouchDB", "nested": {"a": [1, 2.5, None]}})
    up = pouch("replicate", name="p1", url=a.url, direction="to")
    assert up["ok"] and up["docs_written"] == 60 and up["doc_write_failures"] == 0
    down = pouch("replicate", name="p1", url=a.url, direction="from")
    assert down["ok"] and down["docs_written"] == 40
    p1 = strip(pouch("all", name="p1"))
    assert len(p1) == 100 and p1 == {i: {k: v for k, v in d.items() if k != "_conflicts"} for i, d in server_docs(a).items()}
    made = ms.get(couch.unid_for("pouch:00000007"))  # kept exactly: its _id, body and revision
    assert made.fields == {"n": 7, "kind": "made in PouchDB", "nested": {"a": [1, 2.5, None]}, "$CouchId": "pouch:00000007"}
    assert couch.doc_rev(made) == p1["pouch:00000007"]["_rev"]
    assert p1[unids[3]] == {"_id": unids[3], "_rev": couch.doc_rev(ms.get(unids[3])), "name": "m3", "i": 3,
                            "$Form": "Person"}
    pouch("open", name="p2")  # a PouchDB database through multisite to a second one
    assert pouch("replicate", name="p2", url=a.url, direction="from")["docs_written"] == 100
    assert strip(pouch("all", name="p2")) == p1
    b = serve(dc, "B", replica_of=a)  # and on to another server by the native protocol
    rep = dc.replicate(b, a, mode="pull-only")
    assert rep["totals"]["new"] == 100
    pouch("open", name="p3")
    assert pouch("replicate", name="p3", url=b.url, direction="from")["docs_written"] == 100
    assert strip(pouch("all", name="p3")) == p1  # the same ids, revisions and bodies


def test_live_sync_with_edits_on_both_sides(dc, pouch):
    a = serve(dc)
    ms = documents.connect(a.home, db="Profiles")
    unid = ms.create("Person", {"name": "Ada"})
    pouch("open", name="p1")
    pouch("put", name="p1", doc={"_id": "note:1", "text": "hello"})
    pouch("sync_start", name="p1", url=a.url)
    pouch("wait", name="p1", id=unid, rev=couch.doc_rev(ms.get(unid)))
    wait_for(lambda: ms.get(couch.unid_for("note:1")), what="PouchDB's document on the server")
    d2 = ms.update(unid, {"age": 36})  # an edit on the server reaches PouchDB
    got = pouch("wait", name="p1", id=unid, rev=couch.doc_rev(d2))
    assert got["age"] == 36 and got["name"] == "Ada"
    note = pouch("get", name="p1", id="note:1")  # an edit in PouchDB reaches the server
    r = pouch("put", name="p1", doc={**note, "text": "hello again"})
    wait_for(lambda: (d := ms.get(couch.unid_for("note:1"))) and couch.doc_rev(d) == r["rev"], what="the edit")
    assert ms.get(couch.unid_for("note:1")).fields["text"] == "hello again"
    gone = ms.delete(unid)  # deletions both ways
    pouch("wait", name="p1", id=unid, deleted=True)
    pouch("remove", name="p1", id="note:1", rev=r["rev"])
    wait_for(lambda: ms.get(couch.unid_for("note:1")) is None, what="the deletion on the server")
    assert ms.get(unid, include_deleted=True) == gone
    pouch("sync_stop", name="p1")
    assert not [e for e in pouch("events", name="p1") if e["ev"] in ("error", "denied")]


def _doc_get(node, unid: str) -> dict:
    res = CliRunner().invoke(cli, ["doc", "get", str(node.path("Profiles")), unid])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_conflicts_made_on_each_side_resolve_to_the_same_winner_and_losers(dc, pouch):
    a = serve(dc)
    ms = documents.connect(a.home, db="Profiles")
    x = ms.create("Person", {"name": "X", "v": 0})  # made in multisite
    pouch("open", name="p1")
    pouch("put", name="p1", doc={"_id": "y", "name": "Y", "v": 0})  # made in PouchDB
    pouch("put", name="p1", doc={"_id": "z", "name": "Z", "v": 0})
    pouch("replicate", name="p1", url=a.url, direction="to")
    pouch("replicate", name="p1", url=a.url, direction="from")
    y, z = couch.unid_for("y"), couch.unid_for("z")
    # apart: x is edited twice in PouchDB and once in multisite (PouchDB's line is longer: it wins);
    # y once in PouchDB and twice in multisite (multisite wins); z once on each side (time / hash decide)
    for i, n in ((x, 2), ("y", 1), ("z", 1)):
        for k in range(n):
            d = pouch("get", name="p1", id=i)
            pouch("put", name="p1", doc={**d, "v": f"pouch-{k}"})
    ms.update(x, {"v": "ms-0"})
    ms.update(y, {"v": "ms-0"})
    ms.update(y, {"v": "ms-1"})
    ms.update(z, {"v": "ms-0"})
    pouch("replicate", name="p1", url=a.url, direction="to")
    pouch("replicate", name="p1", url=a.url, direction="from")
    conflict_docs = [d for d in ms.documents(include_deleted=True) if d.is_conflict and not d.deleted]
    assert len(conflict_docs) == 3
    for i, unid, want in ((x, x, "pouch-1"), ("y", y, "ms-1"), ("z", z, None)):
        shown = _doc_get(a, unid)  # what multisite doc get shows
        p = pouch("get", name="p1", id=i, opts={"conflicts": True})
        assert p["_rev"] == f"{shown['seq']}-{shown['seq_time_us']:016x}{shown['origin']}"
        assert {k: v for k, v in p.items() if not k.startswith("_") and k != "$Form"} == \
            {k: v for k, v in shown["fields"].items() if not k.startswith("$")}
        if want:
            assert p["v"] == want
        losers = [c for c in conflict_docs if c.fields["$Ref"] == unid]
        assert p["_conflicts"] == [couch.doc_rev(c) for c in losers]
        loser_body = pouch("get", name="p1", id=i, opts={"rev": p["_conflicts"][0]})
        assert loser_body["v"] == losers[0].fields["v"]
    # resolved: x in PouchDB (the losing revision removed), y in multisite (its conflict document deleted)
    pouch("remove", name="p1", id=x, rev=pouch("get", name="p1", id=x, opts={"conflicts": True})["_conflicts"][0])
    ms.delete(next(c.unid for c in conflict_docs if c.fields["$Ref"] == y))
    pouch("replicate", name="p1", url=a.url, direction="to")
    pouch("replicate", name="p1", url=a.url, direction="from")
    for i in (x, "y"):
        assert "_conflicts" not in pouch("get", name="p1", id=i, opts={"conflicts": True})
    live = {c.fields["$Ref"] for c in ms.documents() if c.is_conflict}
    assert live == {z}  # only z's conflict is left, on both sides
    assert len(pouch("get", name="p1", id="z", opts={"conflicts": True})["_conflicts"]) == 1


def test_a_reader_is_refused_a_push_and_a_user_replicates(dc, pouch):
    a = dc.server("A", ["Profiles"], start=False)
    add_user(a.path("Profiles"), "alice", "read-write", "alice-password")
    add_user(a.path("Profiles"), "bob", "read-only", "bob-password")
    a = serve(dc)  # (the node exists: serve starts it with the CouchDB endpoints)
    pouch("open", name="p1")
    pouch("put", name="p1", doc={"_id": "a", "v": 1})
    as_bob = a.url.replace("http://", "http://bob:bob-password@")
    with pytest.raises(RuntimeError, match="forbidden|not allowed"):
        pouch("replicate", name="p1", url=as_bob, direction="to")
    assert documents.connect(a.home, db="Profiles").changeno == 0
    as_alice = a.url.replace("http://", "http://alice:alice-password@")
    assert pouch("replicate", name="p1", url=as_alice, direction="to")["docs_written"] == 1
    pouch("open", name="p2")
    assert pouch("replicate", name="p2", url=as_bob, direction="from")["docs_written"] == 1  # bob reads


def _update_seq(node) -> int:
    try:
        with urllib.request.urlopen(node.url, timeout=5) as r:
            return int(json.loads(r.read())["update_seq"].split("-")[0])
    except OSError:
        return -1


N_KILL = 20_000


def test_server_killed_in_the_middle_of_a_large_replication_the_retry_finishes_it_nothing_doubled(dc, pouch):
    a = serve(dc)
    pouch("open", name="p1")
    pouch("bulk", name="p1", n=N_KILL, prefix="big:", body={"pad": "x" * 40})
    pouch("replicate_start", name="p1", url=a.url, direction="to", opts={"retry": True, "batch_size": 250})
    wait_for(lambda: _update_seq(a) > N_KILL // 4, 120, "a quarter of the push")
    dc.kill(a)
    time.sleep(0.5)
    dc.start(a)
    wait_for(lambda: any(e["ev"] == "done" for e in pouch("events", name="p1")), 300, "the push to finish")
    ms = documents.connect(a.home, db="Profiles")
    docs = list(ms.documents(include_deleted=True))
    assert len(docs) == N_KILL and all(d.seq == 1 and not d.is_conflict for d in docs)
    assert ms.changeno == N_KILL  # every document written once: a retried batch was known, not written again
    # and a fresh PouchDB pulling while the server is killed again
    pouch("open", name="p2")
    pouch("replicate_start", name="p2", url=a.url, direction="from", opts={"retry": True, "batch_size": 250})
    wait_for(lambda: pouch("info", name="p2")["doc_count"] > N_KILL // 4, 120, "a quarter of the pull")
    dc.kill(a)
    time.sleep(0.5)
    dc.start(a)
    wait_for(lambda: any(e["ev"] == "done" for e in pouch("events", name="p2")), 300, "the pull to finish")
    info = pouch("info", name="p2")
    assert info["doc_count"] == N_KILL and int(info["update_seq"]) >= N_KILL
    sample = pouch("get", name="p2", id="big:00012345", opts={"revs_info": True, "conflicts": True})
    assert sample["_rev"].startswith("1-") and "_conflicts" not in sample
    assert sample["_rev"] == pouch("get", name="p1", id="big:00012345")["_rev"]
