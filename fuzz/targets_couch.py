"""Fuzz targets for the CouchDB endpoints' decisions on a client's JSON (``multimaster/couch.py``,
``couch_selector.py``; issue 28): a document body with ``new_edits`` true and false, ``_local``
checkpoints, ``since``, document ids, revision ids and Mango selectors. The endpoints decode the JSON
first (an undecodable body is a 400 there); what a decoded body may do is the target's business."""

from __future__ import annotations

import msgspec

from multisite.multimaster import couch
from multisite.multimaster.couch_selector import compile_selector

from fuzz.target import Target

NOW_US = 1_700_000_000_000_000


def run_couch(data: bytes) -> None:
    try:
        body = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return
    if not isinstance(body, dict):
        couch.from_couch(body)  # refused, as every entry below refuses a non-object
        return
    for step in (_replicated, _edited, _edited_over, _checkpoint, _checkpoint_over, _since, _rev, _selector):
        try:
            step(body)
        except couch.CouchError:
            pass


def _replicated(body: dict) -> None:
    """``new_edits: false``: the version a replicating client sends, then planned onto its family."""
    d = couch.from_couch(body)
    fam = couch.Family(d.unid, None)
    couch.plan(fam, [d])
    couch.to_json(d, 1, None)


def _edited(body: dict) -> None:
    """``new_edits: true`` on a new document, then an edit of it naming its revision."""
    doc_id = couch.check_doc_id(body.get("_id", "fuzz"))
    d = couch.new_edit(couch.Family(couch.unid_for(doc_id), None), {k: v for k, v in body.items() if k != "_rev"},
                       doc_id, NOW_US, "db1")
    couch.new_edit(couch.Family(d.unid, d), {**body, "_rev": couch.doc_rev(d)}, doc_id, NOW_US + 1, "db1")


def _edited_over(body: dict) -> None:
    """``new_edits: true`` with the body's own ``_rev`` over a document it may not name."""
    doc_id = couch.check_doc_id(body.get("_id", "fuzz"))
    d = couch.new_edit(couch.Family(couch.unid_for(doc_id), None), {"v": 0}, doc_id, NOW_US, "db1")
    couch.new_edit(couch.Family(d.unid, d), body, doc_id, NOW_US + 1, "db1")


def _checkpoint(body: dict) -> None:
    couch.check_local_put(None, body)


def _checkpoint_over(body: dict) -> None:
    couch.check_local_put({"n": 1, "body": {}}, body)


def _since(body: dict) -> None:
    couch.parse_since(body.get("since"), "d1", 10)


def _rev(body: dict) -> None:
    couch.parse_rev(body.get("_rev"))


def _selector(body: dict) -> None:
    compile_selector(body.get("selector")).matches(body)


def seeds_couch() -> list[bytes]:
    rev = couch.rev_of(2, NOW_US, "db1")
    return [msgspec.json.encode(x) for x in (
        {"_id": "a", "_rev": rev, "_revisions": {"start": 2, "ids": [rev.split("-", 1)[1],
                                                                    couch.rev_hash(NOW_US - 5, "db2")]}, "v": 1},
        {"_id": "b", "v": [1, 2, {"x": None}], "_deleted": False, "since": "3-d1", "selector": {"v": 2}},
        {"_id": "_local/cp", "_rev": "0-1", "history": [], "since": 0},
        {"_id": "c", "selector": {"v": {"$gt": 1}, "$or": [{"w": {"$exists": True}}, {"x": {"$in": [1, "a"]}}]},
         "v": 2, "w": "x"},
    )]


TARGETS = {"multimaster_couch": Target("multimaster_couch", run_couch, seeds_couch)}
