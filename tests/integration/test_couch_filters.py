"""Filtered ``_changes`` on the CouchDB endpoints (issue 26): ``filter=_selector`` with a Mango selector
(real PouchDB's ``replicate.from(url, {selector})`` takes exactly the documents it selects, and a later
run only the new ones), and clear 400s for what multisite cannot run: a ``_view`` or design-document
filter (JavaScript), an operator it does not take, a selector not in a POST body."""

from __future__ import annotations

import pytest

from multisite import documents

from .test_couch_http import http, serve


def _people(url: str, n: int, start: int = 0) -> None:
    docs = [{"_id": f"p{i:03d}", "type": "person" if i % 2 else "place", "age": i, "tags": ["t" + str(i % 3)]}
            for i in range(start, start + n)]
    st, res = http("POST", url + "/_bulk_docs", {"docs": docs})
    assert st == 201 and all(r.get("ok") for r in res)


def test_pouchdb_replicates_only_what_a_selector_selects(dc, pouch):
    a = serve(dc)
    url = a.url + "/profiles"
    _people(url, 40)
    ms = documents.connect(a.home, db="Profiles")
    ms.create("Person", {"type": "person", "age": 99, "tags": ["t1"]})  # a multisite document, selected too
    sel = {"type": "person", "age": {"$gte": 10}, "tags": {"$in": ["t0", "t1"]}}
    pouch("open", name="p1")
    rep = pouch("replicate", name="p1", url=url, direction="from", opts={"selector": sel})
    want = {f"p{i:03d}" for i in range(10, 40) if i % 2 and i % 3 in (0, 1)}
    got = {d["_id"]: d for d in pouch("all", name="p1")}
    assert rep["ok"] and set(got) - want == {next(i for i in got if not i.startswith("p"))}
    assert want <= set(got) and all(d["type"] == "person" for d in got.values())
    _people(url, 10, start=100)  # the next run takes the new ones only (its checkpoint holds)
    rep = pouch("replicate", name="p1", url=url, direction="from", opts={"selector": sel})
    assert rep["docs_written"] == len([i for i in range(100, 110) if i % 2 and i % 3 in (0, 1)])
    st, ch = http("POST", url + "/_changes?filter=_selector&include_docs=true",
                  {"selector": {"$or": [{"age": 3}, {"age": {"$lt": 1}}]}})
    assert st == 200 and sorted(r["id"] for r in ch["results"]) == ["p000", "p003"]


@pytest.mark.parametrize("query,body,words", [
    ("filter=_view&view=app/by_type", None, "JavaScript"),
    ("filter=app/mine", None, "JavaScript"),
    ("filter=_design", None, "JavaScript"),
    ("filter=_nope", None, "not supported"),
    ("filter=_selector", None, "needs a selector in the POST body"),
    ("filter=_selector", {"selector": {"a": {"$regex": "x"}}}, "operator $regex is not supported"),
    ("filter=_selector", {"selector": [1]}, "a selector is a JSON object"),
    ("filter=_doc_ids", {"doc_ids": "a"}, "doc_ids, a list"),
])
def test_filters_it_cannot_run_get_a_clear_400(dc, query, body, words):
    a = serve(dc)
    st, err = http("POST" if body is not None else "GET", a.url + "/profiles/_changes?" + query, body)
    assert st == 400 and err["error"] in ("bad_request", "invalid_selector") and words in err["reason"], err


def test_a_filtered_page_reads_on_until_it_has_limit_rows_so_pouchdb_gets_every_selected_document(dc, pouch):
    # PouchDB (as CouchDB's replicator) ends a replication at a page shorter than its batch size: a
    # page must hold `limit` rows that pass the filter, not `limit` documents read before filtering.
    a = serve(dc)
    url = a.url + "/profiles"
    st, res = http("POST", url + "/_bulk_docs", {"docs": [{"_id": f"n{i:04d}", "type": "place"} for i in range(250)]})
    assert st == 201
    _people(url, 12, start=500)  # six persons, after 250 places and six of their own places
    st, ch = http("POST", url + "/_changes?filter=_selector&limit=4", {"selector": {"type": "person"}})
    assert st == 200 and [r["id"] for r in ch["results"]] == ["p501", "p503", "p505", "p507"]
    st, rest = http("POST", url + f"/_changes?filter=_selector&limit=4&since={ch['last_seq']}",
                    {"selector": {"type": "person"}})
    assert [r["id"] for r in rest["results"]] == ["p509", "p511"]
    st, ids = http("POST", url + "/_changes?filter=_doc_ids&limit=2", {"doc_ids": ["p500", "p510"]})
    assert [r["id"] for r in ids["results"]] == ["p500", "p510"]
    pouch("open", name="p1")
    rep = pouch("replicate", name="p1", url=url, direction="from", opts={"selector": {"type": "person"}})
    assert rep["ok"] and sorted(d["_id"] for d in pouch("all", name="p1")) == [f"p{i}" for i in range(501, 512, 2)]


def test_purged_documents_do_not_end_a_pouchdb_replication_early(dc, pouch):
    # a purged document's change entries read as absent: a page must read on past them too
    a = serve(dc)
    url = a.url + "/profiles"
    st, res = http("POST", url + "/_bulk_docs", {"docs": [{"_id": f"n{i:04d}"} for i in range(200)]})
    for k in range(0, 200, 100):
        assert http("POST", url + "/_purge", {r["id"]: [r["rev"]] for r in res[k:k + 100]})[0] == 201
    _people(url, 3)
    st, ch = http("GET", url + "/_changes?limit=100")
    assert [r["id"] for r in ch["results"]] == ["p000", "p001", "p002"]
    pouch("open", name="p1")
    assert pouch("replicate", name="p1", url=url, direction="from")["docs_written"] == 3


def test_a_selector_comparing_deeply_nested_values_is_a_400_not_a_recursion_error(dc):
    # the collation recurses into arrays and objects: an operator's argument is bounded when compiled
    a = serve(dc)
    url = a.url + "/profiles"
    nest = lambda n: [nest(n - 1)] if n else 1  # noqa: E731
    nobj = lambda n: {"a": nobj(n - 1)} if n else 1  # noqa: E731
    assert http("PUT", url + "/deep", {"v": nest(400), "o": nobj(300)})[0] == 201
    for sel in ({"v": {"$eq": nest(400)}}, {"v": nest(400)}, {"o": {"$gt": nobj(300)}}, {"v": {"$in": [nest(400)]}}):
        st, err = http("POST", url + "/_changes?filter=_selector", {"selector": sel})
        assert (st, err["error"]) == (400, "invalid_selector") and "nested deeper" in err["reason"], err
    st, ch = http("POST", url + "/_changes?filter=_selector", {"selector": {"v": {"$eq": nest(20)}}})
    assert st == 200 and ch["results"] == []
