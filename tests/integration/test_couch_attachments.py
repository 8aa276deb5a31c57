"""Attachments on the CouchDB endpoints (issue 26): inline base64 in ``PUT``/``_bulk_docs``, stubs with
digest, length and revpos in reads, ``attachments=true`` and ``atts_since``, the attachment endpoint
(``GET|PUT|DELETE /{db}/{id}/{name}``), real PouchDB pushing and pulling a document with attachments
byte-identical (same MD5 digest), and the same attachments on a second server by the native protocol
and in a conflict document. Real docserver processes, real PouchDB 9 in Node."""

from __future__ import annotations

import base64
import hashlib
import os
import urllib.request

import pytest

from multisite import documents
from multisite.multimaster import couch, couch_atts

from .test_couch_http import http, serve


def md5_digest(raw: bytes) -> str:
    return "md5-" + base64.b64encode(hashlib.md5(raw).digest()).decode()


def raw_get(url: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read(), r.headers["Content-Type"]


def test_inline_attachments_read_back_as_stubs_with_data_on_request(dc):
    a = serve(dc)
    db = a.url + "/profiles"
    blob, text = os.urandom(3000), b"hello attachments"
    st, r = http("PUT", db + "/doc1", {"x": 1, "_attachments": {
        "blob.bin": {"content_type": "application/octet-stream", "data": base64.b64encode(blob).decode()},
        "a/b.txt": {"content_type": "text/plain", "data": base64.b64encode(text).decode()}}})
    assert st == 201
    rev1 = r["rev"]
    st, d = http("GET", db + "/doc1")
    assert d["x"] == 1 and d["_attachments"]["blob.bin"] == {
        "content_type": "application/octet-stream", "digest": md5_digest(blob), "length": 3000, "revpos": 1,
        "stub": True}
    assert raw_get(db + "/doc1/blob.bin")[1:] == (blob, "application/octet-stream")
    assert raw_get(db + "/doc1/a%2Fb.txt")[1] == text and raw_get(db + "/doc1/a/b.txt")[1] == text
    st, d = http("GET", db + "/doc1?attachments=true")
    assert base64.b64decode(d["_attachments"]["blob.bin"]["data"]) == blob and "stub" not in d["_attachments"]["blob.bin"]
    # a new edit with stubs keeps them (and their revpos); an attachment added at 2
    st, r = http("PUT", db + "/doc1", {"_rev": rev1, "x": 2, "_attachments": {
        "blob.bin": {"stub": True, "digest": md5_digest(blob)}, "a/b.txt": {"stub": True},
        "new.txt": {"content_type": "text/plain", "data": base64.b64encode(b"two").decode()}}})
    assert st == 201
    rev2 = r["rev"]
    st, d = http("GET", db + f"/doc1?atts_since=[\"{rev1}\"]")
    atts = d["_attachments"]
    assert atts["blob.bin"]["stub"] and atts["blob.bin"]["revpos"] == 1 and atts["new.txt"]["data"] == "dHdv"
    st, got = http("POST", db + "/_bulk_get?attachments=true", {"docs": [{"id": "doc1", "rev": rev2}]})
    assert base64.b64decode(got["results"][0]["docs"][0]["ok"]["_attachments"]["blob.bin"]["data"]) == blob
    # the attachment endpoint: PUT adds one as a new edit of rev, DELETE removes one
    req = urllib.request.Request(db + f"/doc1/raw.bin?rev={rev2}", data=b"\x00\x01raw", method="PUT",
                                 headers={"Content-Type": "image/png"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        rev3 = __import__("json").loads(resp.read())["rev"]
    assert raw_get(db + "/doc1/raw.bin") == (200, b"\x00\x01raw", "image/png")
    assert http("DELETE", db + f"/doc1/new.txt?rev={rev3}")[0] == 200
    st, d = http("GET", db + "/doc1")
    assert sorted(d["_attachments"]) == ["a/b.txt", "blob.bin", "raw.bin"] and d["x"] == 2
    assert http("GET", db + f"/doc1/new.txt?rev={rev2}")[0] == 404  # only leaves keep bodies (as after compaction)


def test_bad_attachments_get_couchdbs_errors_and_write_nothing(dc):
    a = serve(dc)
    db = a.url + "/profiles"
    before = documents.connect(a.home, db="Profiles").changeno
    cases = [
        ({"_attachments": {"f": {"data": "%%% not base64"}}}, 400, "bad_request"),
        ({"_attachments": {"f": {"stub": True, "digest": "md5-nope"}}}, 412, "missing_stub"),
        ({"_attachments": {"f": {"follows": True, "length": 3}}}, 415, "bad_content_type"),
        ({"_attachments": {"_f": {"data": ""}}}, 400, "bad_request"),
        ({"_attachments": ["f"]}, 400, "bad_request"),
        ({"$File/f": {"data": ""}}, 400, "doc_validation"),
        ({"_attachments": {"big": {"data": base64.b64encode(b"\0" * (couch_atts.MAX_ATTACHMENTS_BYTES + 1)).decode()}}},
         413, "document_too_large"),
    ]
    for body, status, error in cases:
        st, err = http("PUT", db + "/bad", body)
        assert (st, err["error"]) == (status, error), (body if len(str(body)) < 200 else "big", err)
        assert err["reason"]
    assert http("GET", db + "/bad/f")[0] == 404
    assert http("PUT", db + "/ok", {"_attachments": {"f": {"data": "AAEC"}}})[0] == 201
    assert http("GET", db + "/ok/none")[1] == {"error": "not_found", "reason": "Document is missing attachment"}
    assert http("DELETE", db + "/ok/f?rev=1-" + "0" * 32)[0] == 409
    pushed = {"_id": "p", "_rev": "1-" + "a" * 32, "_attachments": {"f": {"stub": True, "digest": "md5-x", "revpos": 1}}}
    st, err = http("POST", db + "/_bulk_docs", {"docs": [pushed], "new_edits": False})
    assert st == 201 and err[0]["error"] == "missing_stub"
    assert documents.connect(a.home, db="Profiles").changeno == before + 1  # only "ok" was written


def test_pouchdb_pushes_and_pulls_attachments_byte_identical_and_they_replicate_natively(dc, pouch):
    a = serve(dc)
    url = a.url + "/profiles"
    blob = os.urandom(200_000)
    pouch("open", name="p1")
    put = pouch("put", name="p1", doc={"_id": "photo", "title": "t", "_attachments": {
        "img.bin": {"content_type": "application/octet-stream", "data": base64.b64encode(blob).decode()},
        "note.txt": {"content_type": "text/plain", "data": base64.b64encode(b"a note").decode()}}})
    mine = pouch("get", name="p1", id="photo")
    assert mine["_attachments"]["img.bin"]["digest"] == md5_digest(blob)
    up = pouch("replicate", name="p1", url=url, direction="to")
    assert up["ok"] and up["docs_written"] == 1
    ms = documents.connect(a.home, db="Profiles")
    d = ms.get(couch.unid_for("photo"))
    assert couch.doc_rev(d) == put["rev"] and d.fields["$File/img.bin"]["digest"] == md5_digest(blob)
    assert raw_get(url + "/photo/img.bin")[1] == blob
    pouch("open", name="p2")  # pulled back into a fresh PouchDB: the same bytes, the same digests
    down = pouch("replicate", name="p2", url=url, direction="from")
    assert down["ok"] and down["docs_written"] == 1
    theirs = pouch("get", name="p2", id="photo")
    assert theirs["_rev"] == put["rev"] and theirs["_attachments"] == mine["_attachments"]
    assert base64.b64decode(pouch("get_att", name="p2", id="photo", att="img.bin")["data"]) == blob
    # an edit on the server side of the attachments reaches PouchDB; the other attachment stays a stub
    st, r = http("PUT", url + "/photo", {"_rev": put["rev"], "title": "t2", "_attachments": {
        "img.bin": {"stub": True}, "note.txt": {"content_type": "text/plain",
                                                 "data": base64.b64encode(b"edited").decode()}}})
    assert st == 201
    assert pouch("replicate", name="p2", url=url, direction="from")["docs_written"] == 1
    assert base64.b64decode(pouch("get_att", name="p2", id="photo", att="note.txt")["data"]) == b"edited"
    assert base64.b64decode(pouch("get_att", name="p2", id="photo", att="img.bin")["data"]) == blob
    # on to a second server by the native protocol, and a conflict whose loser keeps its attachment
    b = serve(dc, "B", replica_of=a)
    assert dc.replicate(b, a, mode="pull-only")["totals"]["new"] == 1
    b_url = b.url + "/profiles"
    assert raw_get(b_url + "/photo/img.bin")[1] == blob
    st, ra = http("PUT", url + "/photo", {"_rev": r["rev"], "_attachments": {
        "img.bin": {"content_type": "text/plain", "data": base64.b64encode(b"from A").decode()}}})
    st, rb = http("PUT", b_url + "/photo", {"_rev": r["rev"], "_attachments": {
        "img.bin": {"content_type": "text/plain", "data": base64.b64encode(b"from B").decode()}}})
    assert st == 201
    dc.replicate(b, a, mode="pull-push")  # the conflict document is made where the loser was,
    dc.replicate(b, a, mode="pull-push")  # and reaches the other side in the next session
    for u in (url, b_url):
        st, d = http("GET", u + "/photo?conflicts=true")
        assert sorted([d["_rev"]] + d["_conflicts"]) == sorted([ra["rev"], rb["rev"]])
        loser = d["_conflicts"][0]
        winner_bytes = raw_get(u + "/photo/img.bin")[1]
        loser_bytes = raw_get(u + f"/photo/img.bin?rev={loser}")[1]
        assert {winner_bytes, loser_bytes} == {b"from A", b"from B"}


def test_the_attachments_bound_counts_those_kept_by_stubs_too(dc):
    # MAX_ATTACHMENTS_BYTES is a version's: an attachment added beside stubs (by PUT, by the attachment
    # endpoint, by a replicator's revision) must not grow a version past it, 4 MB at a time
    a = serve(dc)
    db = a.url + "/profiles"
    four = base64.b64encode(b"\1" * 4_000_000).decode()
    st, r = http("PUT", db + "/big", {"_attachments": {"a": {"data": four}}})
    assert st == 201
    before = documents.connect(a.home, db="Profiles").changeno
    st, err = http("PUT", db + "/big", {"_rev": r["rev"], "_attachments": {"a": {"stub": True}, "b": {"data": four}}})
    assert (st, err["error"]) == (413, "attachment_too_large"), err
    req = urllib.request.Request(db + f"/big/c?rev={r['rev']}", data=b"\2" * 3_000_000, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 413
    pos, h = r["rev"].split("-")
    st, res = http("POST", db + "/_bulk_docs", {"new_edits": False, "docs": [{
        "_id": "big", "_rev": "2-" + "b" * 32, "_revisions": {"start": 2, "ids": ["b" * 32, h]},
        "_attachments": {"a": {"stub": True, "revpos": 1}, "b": {"data": four, "revpos": 2}}}]})
    assert st == 201 and res[0]["error"] == "attachment_too_large", res
    assert documents.connect(a.home, db="Profiles").changeno == before
    small = base64.b64encode(b"\3" * 1_000_000).decode()  # within the bound, beside a stub: taken
    assert http("PUT", db + "/big", {"_rev": r["rev"], "_attachments": {"a": {"stub": True}, "b": {"data": small}}})[0] == 201


def test_atts_since_with_a_position_that_is_not_ascii_digits_is_ignored_not_a_500(dc):
    a = serve(dc)
    db = a.url + "/profiles"
    assert http("PUT", db + "/d", {"_attachments": {"f": {"data": "AAEC"}}})[0] == 201
    for since in ("%5B%22%C2%B2-abc%22%5D", "%5B%22" + "9" * 5000 + "-abc%22%5D"):
        st, d = http("GET", db + "/d?atts_since=" + since)
        assert st == 200 and d["_attachments"]["f"]["data"] == "AAEC", d


def test_a_file_field_that_is_not_an_attachment_does_not_break_reads(dc):
    # $File/<name> is also an ordinary field name to multisite's own API and to its other replicas: a
    # value that is not an attachment's shape is not shown as one, and the document still reads
    a = serve(dc)
    db = a.url + "/profiles"
    ms = documents.connect(a.home, db="Profiles")
    u = ms.create("Document", {"x": 1, "$File/s": "hello", "$File/d": {"data": "not base64!"},
                               "$File/n": {"content_type": "text/plain", "digest": "md5-x", "length": 2,
                                           "revpos": 1, "data": "%%"}})
    st, d = http("GET", db + "/" + u)
    assert st == 200 and d["x"] == 1 and set(d["_attachments"]) == {"n"}, d  # n has an attachment's shape
    assert http("GET", db + f"/{u}?attachments=true")[0] == 200
    assert http("GET", db + "/_changes?include_docs=true&attachments=true")[0] == 200
    assert http("POST", db + "/_changes?filter=_selector", {"selector": {"x": 1}})[1]["results"][0]["id"] == u
    assert http("POST", db + "/_bulk_get", {"docs": [{"id": u}]})[0] == 200
    for name in ("s", "d", "n"):
        assert http("GET", db + f"/{u}/{name}")[0] == 404


def test_a_content_type_with_control_characters_is_served_as_octet_stream_not_a_500(dc):
    # a JSON body can carry any string as content_type; aiohttp refuses a header holding CR or LF
    # (header injection), so serving it was a 500 on the request PouchDB pulls each attachment with
    a = serve(dc)
    db = a.url + "/profiles"
    data = base64.b64encode(b"body").decode()
    assert http("PUT", db + "/ct", {"_attachments": {"f": {"content_type": "text/plain\r\nX-Evil: 1", "data": data}}})[0] == 201
    req = urllib.request.Request(db + "/ct/f")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert (r.status, r.read(), r.headers["Content-Type"], r.headers.get("X-Evil")) == (
            200, b"body", "application/octet-stream", None)


def test_a_stub_in_an_edit_is_taken_from_the_edited_revision_only_not_a_conflicting_one(dc):
    # CouchDB resolves a normal edit's stubs against the revision given in _rev: an attachment that
    # only a conflicting leaf holds is a 412 missing_stub, with or without a digest
    from .test_couch_http import H1, H2, pushed

    a = serve(dc)
    db = a.url + "/profiles"
    secret = base64.b64encode(b"only on the losing branch").decode()
    st, _ = http("POST", db + "/_bulk_docs", {"new_edits": False, "docs": [
        pushed("x", ["1-" + H1], v="loser", _attachments={"a.txt": {"content_type": "text/plain", "data": secret}}),
        pushed("x", ["1-" + H2], v="winner")]})
    assert st == 201
    st, x = http("GET", db + "/x?conflicts=true")
    assert x["_rev"] == "1-" + H2 and x["_conflicts"] == ["1-" + H1] and "_attachments" not in x
    digest = md5_digest(b"only on the losing branch")
    for stub in ({"stub": True}, {"stub": True, "digest": digest}):
        st, err = http("PUT", db + "/x", {"_rev": "1-" + H2, "v": 2, "_attachments": {"a.txt": stub}})
        assert (st, err["error"]) == (412, "missing_stub"), (stub, err)
        st, res = http("POST", db + "/_bulk_docs", {"docs": [{"_id": "x", "_rev": "1-" + H2,
                                                               "_attachments": {"a.txt": stub}}]})
        assert st == 201 and res[0]["error"] == "missing_stub", res
    assert http("GET", db + "/x")[1]["_rev"] == "1-" + H2  # nothing written
    st, r = http("PUT", db + "/x", {"_rev": "1-" + H1, "v": 2, "_attachments": {"a.txt": {"stub": True}}})
    assert st == 201  # the revision that holds it: kept
    st, x2 = http("GET", db + f"/x?rev={r['rev']}")
    assert x2["_attachments"]["a.txt"]["digest"] == digest
