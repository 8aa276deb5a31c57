"""``POST /{db}/_purge`` on the CouchDB endpoints (issue 26): named leaf revisions removed completely
(no deletion stub: the document reads "missing", is in no listing, a fresh PouchDB pulls nothing of
it), a purged winner's conflict becoming the document, what is not a leaf left alone, bad bodies
refused with a 400 naming what is wrong, admins only where the database has users, and purge being
local: a second multisite server keeps the version and sends it back; purged on both, it is gone."""

from __future__ import annotations

import pytest

from multisite import documents
from multisite.instance.users import add_user
from multisite.multimaster import couch
from multisite.testing.pouchdb import Pouch, PouchUnavailable, node_modules

from .test_couch_http import H1, H2, H3, http, pushed, serve


def test_purge_removes_revisions_completely_and_a_conflict_takes_the_winners_place(dc, tmp_path):
    a = serve(dc)
    db = a.url + "/profiles"
    st, r = http("PUT", db + "/gone", {"v": 1})
    st, r2 = http("PUT", db + "/gone", {"_rev": r["rev"], "v": 2})
    assert http("POST", db + "/_purge", {"gone": [r["rev"], "9-" + H1]}) == (201, {"purge_seq": None, "purged": {"gone": []}})
    assert http("POST", db + "/_purge", {"gone": [r2["rev"]]}) == (201, {"purge_seq": None, "purged": {"gone": [r2["rev"]]}})
    assert http("GET", db + "/gone") == (404, {"error": "not_found", "reason": "missing"})  # not "deleted"
    assert http("GET", db + "/_all_docs")[1]["rows"] == [] and http("GET", db + "/_changes")[1]["results"] == []
    assert documents.connect(a.home, db="Profiles").get(couch.unid_for("gone"), include_deleted=True) is None
    # two conflicting leaves: purging the loser ends the conflict, purging the winner makes the loser it
    assert http("POST", db + "/_bulk_docs", {"new_edits": False, "docs": [pushed("c", ["1-" + H1], v="one"),
                                                                          pushed("c", ["1-" + H2], v="two"),
                                                                          pushed("d", ["1-" + H1], v="one"),
                                                                          pushed("d", ["1-" + H3], v="three")]})[0] == 201
    st, c = http("GET", db + "/c?conflicts=true")
    assert c["_rev"] == "1-" + H2 and c["_conflicts"] == ["1-" + H1]
    assert http("POST", db + "/_purge", {"c": ["1-" + H1], "d": ["1-" + H3]})[1]["purged"] == {"c": ["1-" + H1],
                                                                                            "d": ["1-" + H3]}
    st, c = http("GET", db + "/c?conflicts=true")
    assert c["_rev"] == "1-" + H2 and "_conflicts" not in c and c["v"] == "two"
    st, d = http("GET", db + "/d?conflicts=true")
    assert d["_rev"] == "1-" + H1 and "_conflicts" not in d and d["v"] == "one"
    try:
        node_modules()
    except PouchUnavailable:
        return
    with Pouch(tmp_path / "pouch") as pouch:  # a fresh client pulls nothing purged
        pouch("open", name="p")
        pouch("replicate", name="p", url=db, direction="from")
        got = {x["_id"]: x for x in pouch("all", name="p")}
        assert set(got) == {"c", "d"} and got["c"]["_rev"] == "1-" + H2 and "_conflicts" not in got["d"]


@pytest.mark.parametrize("body,words", [
    ([1], "JSON object of document ids"),
    ({"a": "1-" + H1}, "must be a list of revision ids"),
    ({"a": ["nope"]}, "Invalid rev format"),
    ({f"d{i}": [] for i in range(101)}, "at most 100 documents"),
    ({"_bad": []}, "reserved document ids"),
])
def test_a_bad_purge_is_a_400_naming_what_is_wrong(dc, body, words):
    a = serve(dc)
    st, err = http("POST", a.url + "/profiles/_purge", body)
    assert st == 400 and words in err["reason"], err


def test_purge_takes_an_admin_and_is_local_to_the_server(dc):
    a = dc.server("A", ["Profiles"], start=False)
    add_user(a.path("Profiles"), "alice", "read-write", "alice-password")
    add_user(a.path("Profiles"), "root", "admin", "root-password")
    a = serve(dc)
    db = a.url + "/profiles"
    ms = documents.connect(a.home, db="Profiles")
    unid = ms.create("Person", {"name": "Ada"})
    rev = couch.doc_rev(ms.get(unid))
    b = serve(dc, "B", replica_of=a)
    dc.replicate(b, a, mode="pull-push")  # B has it and has told A what it has
    st, err = http("POST", db + "/_purge", {unid: [rev]}, auth=("alice", "alice-password"))
    assert (st, err["error"]) == (403, "forbidden")
    assert http("POST", db + "/_purge", {unid: [rev]}, auth=("root", "root-password"))[1]["purged"] == {unid: [rev]}
    assert ms.get(unid) is None
    mb = documents.connect(b.home, db="Profiles")
    assert mb.get(unid).fields["name"] == "Ada"  # purge is local: B keeps it,
    dc.replicate(b, a, mode="pull-push")
    assert ms.get(unid).fields["name"] == "Ada"  # and sends it back (its bookmark toward A is before it)
    for node in (a, b):  # purged on every replica that holds it, it is gone for good
        assert http("POST", node.url + "/profiles/_purge", {unid: [rev]}, auth=("root", "root-password"))[0] == 201
    dc.replicate(b, a, mode="pull-push")
    assert ms.get(unid) is None and mb.get(unid) is None


def test_doc_count_drops_at_once_when_a_purge_removes_a_document(dc):
    # GET /{db}'s count is cached while the change number stays; a purge that removes a document
    # writes no change, so it must drop the cached count itself
    a = serve(dc)
    db = a.url + "/profiles"
    revs = [http("PUT", db + f"/d{i}", {"v": i})[1]["rev"] for i in range(3)]
    assert http("GET", db)[1]["doc_count"] == 3
    assert http("POST", db + "/_purge", {"d0": [revs[0]]})[1]["purged"] == {"d0": [revs[0]]}
    assert http("GET", db)[1]["doc_count"] == 2


def test_purge_counts_documents_and_revisions_before_checking_any(dc):
    # the bounds come first: a body past them is refused without a revision parsed (a 64 MiB body of
    # revisions would otherwise hold the event loop for seconds before the 400)
    a = serve(dc)
    url = a.url + "/profiles/_purge"
    st, err = http("POST", url, {"a": ["nope"] + ["1-" + H1] * 1000})
    assert st == 400 and "at most 1000 revisions" in err["reason"], err
    st, err = http("POST", url, {**{f"d{i}": [] for i in range(100)}, "_bad": ["nope"]})
    assert st == 400 and "at most 100 documents" in err["reason"], err
    st, err = http("POST", url, {"a": ["1-" + H1] * 600, "b": ["nope"] + ["1-" + H2] * 500})
    assert st == 400 and "at most 1000 revisions" in err["reason"], err


def test_a_huge_purge_is_refused_after_reading_it_not_after_parsing_every_revision(dc):
    import json
    import time

    a = serve(dc)
    body = json.dumps({"a": ["1-" + H1] * 1_500_000}).encode()  # ~55 MB: under the body bound, far past 1000 revisions
    t = time.monotonic()
    st, err = http("POST", a.url + "/profiles/_purge", raw=body, timeout=120)
    took = time.monotonic() - t
    assert st == 400 and "at most 1000 revisions" in err["reason"], err
    assert took < 4.0, took  # parsing each revision first took 13 s (the event loop held all along)
