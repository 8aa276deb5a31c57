"""The CouchDB endpoints of a real document server (``--couch-listen``), at the HTTP level: every
endpoint's answers and errors in CouchDB's shapes, and bad input (malformed JSON, revisions that do not
match, huge bodies, a ``since`` of another database, a checkpoint of another replication) refused or
taken the way CouchDB does, nothing lost. Real docserver processes; urllib as the client."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request


from multisite import documents
from multisite.instance.users import add_user
from multisite.multimaster import couch
from multisite.testing.docservers import DocCluster

H1, H2, H3 = "1" * 32, "2" * 32, "3" * 32


def serve(dc: DocCluster, name: str = "A", titles=("Profiles",), **kw):
    node = dc.server(name, list(titles), start=False, **kw)
    node.options.setdefault("start", {})["couch_listen"] = "127.0.0.1:0"
    dc.start(node)
    info = json.loads((node.home / "run" / "docserver.json").read_text())
    node.options["start"]["couch_listen"] = f"127.0.0.1:{info['couch_port']}"  # a restart keeps the port
    node.url = f"http://127.0.0.1:{info['couch_port']}"
    return node


def http(method: str, url: str, body=None, *, raw: bytes | None = None, auth: tuple | None = None,
         timeout: float = 30) -> tuple[int, object]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                          "Accept": "application/json"})
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return r.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def changeno(node) -> int:
    return documents.connect(node.home, db="Profiles").changeno


def pushed(i: str, revs: list[str], **body) -> dict:
    """A revision as a replicator sends it: ``revs`` newest first, "pos-hash"."""
    pos = int(revs[0].split("-")[0])
    return {"_id": i, "_rev": revs[0], "_revisions": {"start": pos, "ids": [r.split("-", 1)[1] for r in revs]},
            **body}


def test_server_and_database_endpoints(dc):
    a = serve(dc)
    st, root = http("GET", a.url + "/")
    assert st == 200 and root["couchdb"] == "Welcome" and len(root["uuid"]) == 32
    assert http("GET", a.url + "/_all_dbs") == (200, ["profiles"])
    st, info = http("GET", a.url + "/profiles")
    assert st == 200 and info["db_name"] == "profiles" and info["doc_count"] == 0 and info["update_seq"].startswith("0-")
    assert http("GET", a.url + "/nope") == (404, {"error": "not_found", "reason": "Database does not exist."})
    assert http("PUT", a.url + "/profiles")[1]["error"] == "file_exists"
    assert http("PUT", a.url + "/profiles")[0] == 412
    st, err = http("PUT", a.url + "/Bad%20Name")
    assert st == 400 and err["error"] == "illegal_database_name"
    assert http("PUT", a.url + "/made-here") == (201, {"ok": True})
    assert http("GET", a.url + "/_all_dbs") == (200, ["made-here", "profiles"])
    assert (a.home / "couch" / "made-here" / "docdb.json").exists()
    assert http("DELETE", a.url + "/profiles")[0] == 403
    st, s = http("GET", a.url + "/_session")
    assert st == 200 and s["userCtx"]["name"] is None


def test_malformed_json_is_refused_with_couchdbs_error_and_nothing_is_written(dc):
    a = serve(dc)
    before = changeno(a)
    for path in ("/profiles/_bulk_docs", "/profiles/_revs_diff", "/profiles/_bulk_get", "/profiles/_local/x"):
        method = "PUT" if "_local" in path else "POST"
        assert http(method, a.url + path, raw=b'{"docs": [') == (400, {"error": "bad_request", "reason": "invalid UTF-8 JSON"})
    assert http("POST", a.url + "/profiles/_bulk_docs", {"nodocs": 1})[1] == {
        "error": "bad_request", "reason": "POST body must include `docs` parameter."}
    st, err = http("POST", a.url + "/profiles/_bulk_docs", {"docs": [pushed("ok", ["1-" + H1]),
                                                                       {"_id": "bad", "_rev": "x-1"}], "new_edits": False})
    assert (st, err) == (400, {"error": "bad_request", "reason": "Invalid rev format"})
    st, err = http("POST", a.url + "/profiles/_bulk_docs", {"docs": [
        {"_id": "a", "_rev": "3-" + H3, "_revisions": {"start": 3, "ids": [H2, H1]}}], "new_edits": False})
    assert st == 400 and err["error"] == "bad_request" and "_revisions" in err["reason"]  # ids do not start with _rev
    st, err = http("POST", a.url + "/profiles/_bulk_docs", {"docs": [
        {"_id": "a", "_rev": "2-" + H2, "_revisions": {"start": 3, "ids": [H2, H1]}}], "new_edits": False})
    assert st == 400 and err["error"] == "bad_request"  # start is not _rev's position
    assert http("POST", a.url + "/profiles/_revs_diff", {"a": ["nope"]})[1]["reason"] == "Invalid rev format"
    assert changeno(a) == before


def test_json_nested_too_deep_or_not_utf8_is_a_400_not_a_500(dc):
    # msgspec raises RecursionError and UnicodeDecodeError for these, past its DecodeError
    a = serve(dc)
    before = changeno(a)
    deep = b'{"docs": [' + b'[' * 5000 + b']' * 5000 + b']}'
    for method, path, raw in [("POST", "/profiles/_bulk_docs", deep), ("POST", "/profiles/_revs_diff", deep),
                              ("POST", "/profiles/_bulk_docs", b'{"docs": [{"_id": "\xff"}]}'),
                              ("PUT", "/profiles/_local/x", b'{"v": "\xfe\xff"}'),
                              ("POST", "/profiles/_changes?filter=_selector", b'{"selector": ' + b'{"a": ' * 3000 + b'1'
                               + b'}' * 3001)]:
        st, err = http(method, a.url + path, raw=raw)
        assert (st, err["error"]) == (400, "bad_request"), (path, err)
    st, err = http("GET", a.url + "/profiles/_changes?filter=_doc_ids&doc_ids=" + "[" * 2000 + "]" * 2000)
    assert (st, err["error"]) == (400, "bad_request"), err
    assert changeno(a) == before


def test_revisions_that_do_not_descend_from_the_servers_become_a_conflict_and_nothing_is_lost(dc):
    a = serve(dc)
    url = a.url + "/profiles"
    assert http("POST", url + "/_bulk_docs", {"docs": [pushed("x", ["2-" + H2, "1-" + H1], v="server")],
                                              "new_edits": False}) == (201, [])
    other = "2-" + "0" * 15 + "f" + "9" * 16  # a sibling of 2-222..., lower: it loses
    assert http("POST", url + "/_revs_diff", {"x": [other, "2-" + H2]}) == (200, {"x": {"missing": [other]}})
    assert http("POST", url + "/_bulk_docs", {"docs": [pushed("x", [other, "1-" + H1], v="client")],
                                              "new_edits": False}) == (201, [])
    st, doc = http("GET", url + "/x?conflicts=true")
    assert st == 200 and doc["_rev"] == "2-" + H2 and doc["v"] == "server" and doc["_conflicts"] == [other]
    st, revs = http("GET", url + "/x?open_revs=all&revs=true")
    assert sorted(r["ok"]["_rev"] for r in revs) == sorted(["2-" + H2, other])
    assert all(r["ok"]["_revisions"]["ids"][-1] == H1 for r in revs)
    docs = list(documents.connect(a.home, db="Profiles").documents(include_deleted=True))
    (main,) = [d for d in docs if not d.is_conflict]
    (conflict,) = [d for d in docs if d.is_conflict]
    assert main.fields["v"] == "server" and conflict.fields["v"] == "client" and couch.doc_rev(conflict) == other
    # the client resolves it: a tombstone under the losing leaf deletes the conflict document
    tomb = "3-" + "4" * 32
    assert http("POST", url + "/_bulk_docs", {"docs": [pushed("x", [tomb, other, "1-" + H1], _deleted=True)],
                                              "new_edits": False}) == (201, [])
    st, doc = http("GET", url + "/x?conflicts=true")
    assert "_conflicts" not in doc
    assert all(d.deleted for d in documents.connect(a.home, db="Profiles").documents(include_deleted=True)
               if d.is_conflict)


def test_huge_bodies_and_documents_get_413_and_nothing_is_written(dc):
    a = serve(dc)
    before = changeno(a)
    big = {"_id": "big", "_rev": "1-" + H1, "blob": "x" * 8_100_000}
    st, err = http("POST", a.url + "/profiles/_bulk_docs", {"docs": [big], "new_edits": False})
    assert (st, err) == (413, {"error": "document_too_large", "reason": "big"})
    st, err = http("PUT", a.url + "/profiles/big2", {"blob": "y" * 8_100_000})
    assert st == 413 and err["error"] == "document_too_large"
    st, err = http("POST", a.url + "/profiles/_bulk_docs", raw=b'{"docs": ["' + b"z" * (65 * 1024 * 1024) + b'"]}')
    assert st == 413 and err["error"] == "too_large"
    assert changeno(a) == before
    assert http("GET", a.url + "/profiles")[0] == 200  # and the server goes on


def test_changes_pages_since_of_another_database_and_feeds(dc):
    a = serve(dc)
    url = a.url + "/profiles"
    assert http("POST", url + "/_bulk_docs", {"docs": [pushed(f"d{k}", [f"1-{k:032x}"]) for k in range(1, 8)],
                                              "new_edits": False}) == (201, [])
    st, page = http("GET", url + "/_changes?limit=3&style=all_docs")
    assert st == 200 and [r["id"] for r in page["results"]] == ["d1", "d2", "d3"] and len(page["results"]) == 3
    assert page["last_seq"] == page["results"][-1]["seq"]
    st, rest = http("GET", url + f"/_changes?since={page['last_seq']}")
    assert [r["id"] for r in rest["results"]] == ["d4", "d5", "d6", "d7"]
    db_id = page["last_seq"].split("-", 1)[1]
    st, again = http("GET", url + f"/_changes?since=5-{'f' * 16 if db_id[0] != 'f' else 'e' * 16}")
    assert st == 200 and len(again["results"]) == 7  # another database's sequence: everything again, nothing lost
    st, err = http("GET", url + "/_changes?since=banana")
    assert (st, err) == (400, {"error": "bad_request", "reason": "Malformed sequence supplied in 'since' parameter."})
    st, docs = http("GET", url + '/_changes?include_docs=true&filter=_doc_ids&doc_ids=["d2"]')
    assert [(r["id"], r["doc"]["_rev"]) for r in docs["results"]] == [("d2", f"1-{2:032x}")]
    # longpoll: waits for the next write, then answers with it
    box = {}

    def poll():
        box["r"] = http("GET", url + f"/_changes?feed=longpoll&since={rest['last_seq']}&heartbeat=500&timeout=20000")

    t = threading.Thread(target=poll)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.8)
    assert t.is_alive()
    http("PUT", url + "/late", {"v": 1})
    t.join(20)
    assert box["r"][0] == 200 and [r["id"] for r in box["r"][1]["results"]] == ["late"] and time.monotonic() - t0 < 10


def test_continuous_feed_is_one_json_a_line(dc):
    a = serve(dc)
    url = a.url + "/profiles"
    http("PUT", url + "/one", {"v": 1})
    with urllib.request.urlopen(url + "/_changes?feed=continuous&timeout=300&heartbeat=100", timeout=10) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln.strip()]
    rows = [json.loads(ln) for ln in lines]
    assert rows[0]["id"] == "one" and "last_seq" in rows[-1]


def test_checkpoints_of_another_replication_are_not_taken(dc):
    a = serve(dc)
    url = a.url + "/profiles/_local"
    assert http("GET", url + "/rep-a") == (404, {"error": "not_found", "reason": "missing"})
    assert http("PUT", url + "/rep-a", {"last_seq": "3-x", "session_id": "s1"}) == (201, {"ok": True, "id": "_local/rep-a", "rev": "0-1"})
    assert http("GET", url + "/rep-a")[0] == 200
    cp = http("GET", url + "/rep-a")[1]
    assert cp == {"last_seq": "3-x", "session_id": "s1", "_id": "_local/rep-a", "_rev": "0-1"}
    assert http("PUT", url + "/rep-b", {"_rev": "0-1", "last_seq": "9-y"}) == (409, {"error": "conflict", "reason": "Document update conflict."})
    assert http("PUT", url + "/rep-a", {"last_seq": "4-x"})[0] == 409  # no _rev: stale
    assert http("GET", url + "/rep-b")[0] == 404 and http("GET", url + "/rep-a")[1]["last_seq"] == "3-x"
    assert http("PUT", url + "/rep-a", {"_rev": "0-1", "last_seq": "4-x"}) == (201, {"ok": True, "id": "_local/rep-a", "rev": "0-2"})
    assert http("DELETE", url + "/rep-a?rev=0-2")[0] == 200 and http("GET", url + "/rep-a")[0] == 404
    assert changeno(a) == 0  # checkpoints are not documents: nothing replicates


def test_users_and_acls(dc):
    a = dc.server("A", ["Profiles", "Open"], start=False)
    for name, role in (("alice", "read-write"), ("bob", "read-write"), ("carol", "read-write"), ("dave", "read-only"),
                       ("root", "admin")):
        add_user(a.path("Profiles"), name, role, f"{name}-password")
    d = documents.open(a.path("Profiles"))
    d.set_access("*", "none")
    for name, access in (("alice", "writer"), ("bob", "reader"), ("dave", "writer"), ("root", "writer")):
        d.set_access(name, access)
    d.close()
    a = _restart_with_couch(dc, a)
    url = a.url + "/profiles"
    assert http("GET", url) == (401, {"error": "unauthorized", "reason": "You are not authorized to access this db."})
    assert http("GET", url, auth=("alice", "wrong-password")) == (401, {"error": "unauthorized",
                                                                       "reason": "Name or password is incorrect."})
    assert http("GET", url, auth=("carol", "carol-password")) == (403, {"error": "forbidden",
                                                                        "reason": "You are not allowed to access this db."})
    assert http("GET", a.url + "/_all_dbs", auth=("carol", "carol-password")) == (200, ["open"])  # nothing shown
    assert http("GET", a.url + "/_all_dbs", auth=("bob", "bob-password")) == (200, ["open", "profiles"])
    assert http("GET", a.url + "/_session", auth=("bob", "bob-password"))[1]["userCtx"]["name"] == "bob"
    assert http("GET", a.url + "/open")[0] == 200  # a database without users is open
    doc = pushed("x", ["1-" + H1], v=1)
    for reader in (("bob", "bob-password"), ("dave", "dave-password")):  # by the ACL; by a read-only role
        st, err = http("POST", url + "/_bulk_docs", {"docs": [doc], "new_edits": False}, auth=reader)
        assert st == 403 and err["error"] == "forbidden"
        assert http("PUT", url + "/_local/cp-" + reader[0], {"last_seq": 1}, auth=reader)[0] == 201  # its checkpoint
    assert changeno_of(a, "Profiles") == 0
    assert http("POST", url + "/_bulk_docs", {"docs": [doc], "new_edits": False}, auth=("alice", "alice-password")) == (201, [])
    assert http("GET", url + "/x", auth=("bob", "bob-password"))[1]["v"] == 1
    assert http("PUT", a.url + "/newdb", auth=("alice", "alice-password"))[0] == 403  # not an admin
    assert http("PUT", a.url + "/newdb")[0] == 401
    assert http("PUT", a.url + "/newdb", auth=("root", "root-password"))[0] == 201


def changeno_of(node, title: str) -> int:
    return documents.connect(node.home, db=title).changeno


def _restart_with_couch(dc, node):
    node.options.setdefault("start", {})["couch_listen"] = "127.0.0.1:0"
    dc.start(node)
    info = json.loads((node.home / "run" / "docserver.json").read_text())
    node.url = f"http://127.0.0.1:{info['couch_port']}"
    return node


def test_documents_bulk_get_and_new_edits(dc):
    a = serve(dc)
    url = a.url + "/profiles"
    st, r = http("PUT", url + "/ada", {"name": "Ada", "$Form": "Person"})
    assert st == 201 and r["id"] == "ada" and r["rev"].startswith("1-")
    rev1 = r["rev"]
    assert http("PUT", url + "/ada", {"name": "Ada L."})[1] == {"error": "conflict", "reason": "Document update conflict."}
    st, r2 = http("PUT", url + f"/ada?rev={rev1}", {"name": "Ada L.", "$Form": "Person"})
    assert st == 201 and r2["rev"].startswith("2-")
    d = documents.connect(a.home, db="Profiles").get(couch.unid_for("ada"))
    assert d.form == "Person" and d.fields == {"name": "Ada L.", "$CouchId": "ada"} and d.seq == 2
    st, got = http("POST", url + "/_bulk_get?revs=true&latest=true",
                   {"docs": [{"id": "ada", "rev": rev1}, {"id": "ada"}, {"id": "nobody"}]})
    res = got["results"]
    assert res[0]["docs"][0]["ok"]["_rev"] == r2["rev"]  # latest: the leaf that descends from rev1
    assert res[0]["docs"][0]["ok"]["_revisions"]["ids"] == [r2["rev"][2:], rev1[2:]]
    assert res[1]["docs"][0]["ok"]["name"] == "Ada L."
    assert res[2]["docs"][0]["error"]["error"] == "not_found"
    assert http("GET", url + "/nobody") == (404, {"error": "not_found", "reason": "missing"})
    st, gone = http("DELETE", url + f"/ada?rev={r2['rev']}")
    assert st == 200 and gone["rev"].startswith("3-")
    assert http("GET", url + "/ada") == (404, {"error": "not_found", "reason": "deleted"})
    st, all_docs = http("GET", url + "/_all_docs")
    assert all_docs["rows"] == []
    st, created = http("POST", url, {"v": 1})
    assert st == 201 and len(created["id"]) == 32  # an id made here is a UNID
    st, all_docs = http("GET", url + "/_all_docs?include_docs=true")
    assert [r["id"] for r in all_docs["rows"]] == [created["id"]] and all_docs["rows"][0]["doc"]["v"] == 1
    assert http("POST", url + "/_ensure_full_commit")[0] == 201
    st, err = http("PUT", url + "/att", {"_attachments": {"a.txt": {"follows": True, "content_type": "text/plain"}}})
    assert st == 415 and err["error"] == "bad_content_type"  # multipart attachments (test_couch_attachments: inline)
