"""The document endpoints of the CouchDB endpoints: ``_revs_diff``, ``_bulk_docs`` (``new_edits``
false: a replicator's revisions; true: new edits), ``_bulk_get``, ``/{db}/{id}``, ``_all_docs`` and
``_local`` checkpoints. Each reads and writes through ``DocDB`` in a worker thread; what a write does
is ``couch.plan``'s (or ``couch.new_edit``'s) decision, taken inside ``DocDB.transact``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .. import couch
from ..couch import CouchError, Family, Tree
from .couch_io import (
    ERROR_STATUS,
    atts_for,
    conflicts_extra,
    encode,
    flag,
    int_param,
    json_response,
    qjson,
    read_body,
)
from .docdb import DocDB


async def revs_diff(request: web.Request, db: DocDB) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not all(isinstance(v, list) for v in body.values()):
        raise couch.bad_request("Request body must be a JSON object of document ids to lists of revisions")
    asked = {i: [couch.parse_rev(r) for r in revs] for i, revs in body.items()}
    return json_response(await asyncio.to_thread(revs_diff_sync, db, body, asked))

def revs_diff_sync(db: DocDB, body: dict, asked: dict) -> dict:
    fams = db.families(couch.unid_for(couch.check_doc_id(i)) for i in body)
    out = {}
    for i, revs in body.items():
        u = couch.unid_for(i)
        cur, cds = fams[u]
        if cur is None and not cds:  # a new document: every revision is missing
            out[i] = {"missing": revs}
            continue
        tree = Tree(Family(u, None if cur.is_conflict else cur, tuple(cds)))
        missing = [r for r, st in zip(revs, asked[i]) if not tree.knows(st)]
        if missing:
            out[i] = {"missing": missing}
    return out

async def bulk_docs(request: web.Request, db: DocDB) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("docs"), list):
        raise couch.bad_request("POST body must include `docs` parameter.")
    new_edits = body.get("new_edits", True)
    if not isinstance(new_edits, bool):
        raise couch.bad_request("`new_edits` parameter must be a boolean.")
    check_sizes(request, body["docs"])
    res = await write_docs(db, body["docs"], new_edits)
    return json_response([r for r in res if "error" in r] if not new_edits else res, 201)

def check_sizes(request: web.Request, docs: list) -> None:
    if (request.content_length or 0) <= couch.MAX_DOCUMENT_BYTES:
        return
    for d in docs:
        if len(encode(d)) > couch.MAX_DOCUMENT_BYTES:
            raise CouchError(413, "document_too_large", str(d.get("_id") if isinstance(d, dict) else "")[:200])

async def write_docs(db: DocDB, docs: list, new_edits: bool) -> list[dict]:
    return await asyncio.to_thread(write_docs_sync, db, docs, new_edits)

def write_docs_sync(db: DocDB, docs: list, new_edits: bool) -> list[dict]:
    """Apply each document (a pushed revision, or a new edit), grouped by document, in one transaction."""
    results: list[dict] = [{} for _ in docs]
    groups: dict[str, list[tuple[int, Any]]] = {}
    for k, d in enumerate(docs):
        if not new_edits:  # a revision CouchDB would not take refuses the request: nothing is written
            item: Any = couch.from_couch(d)
            groups.setdefault(item.unid, []).append((k, item))
            continue
        try:
            if not isinstance(d, dict):
                raise couch.bad_request("Document must be a JSON object")
            item = (couch.check_doc_id(d.get("_id")), d)
            groups.setdefault(couch.unid_for(item[0]), []).append((k, item))
        except CouchError as e:
            results[k] = {"id": d.get("_id") if isinstance(d, dict) else None, "error": e.error, "reason": e.reason}

    def decide(fams: dict, now: Callable[[], int]) -> tuple[list, None, list]:
        writes, removes = [], []
        for u, items in groups.items():
            cur, cds = fams[u]
            stored = {c.unid for c in cds}
            fam = Family(u, None if cur is not None and cur.is_conflict else cur, tuple(cds))
            for k, item in items:
                try:
                    v = couch.new_edit(fam, item[1], item[0], now(), db.db_id) if new_edits else item
                    p = couch.plan(fam, [v])
                except CouchError as e:
                    results[k] = {"id": item[0] if new_edits else couch.couch_id(item), "error": e.error,
                                  "reason": e.reason}
                    continue
                fam = p.fam
                writes = [w for w in writes if w.unid not in p.removes] + p.writes
                removes = [r for r in removes if r not in {w.unid for w in p.writes}]
                removes += [r for r in p.removes if r in stored and r not in removes]
                results[k] = {"ok": True, "id": couch.couch_id(v), "rev": couch.doc_rev(v)}
        return writes, None, removes

    db.transact(list(groups), decide)
    return results

async def bulk_get(request: web.Request, db: DocDB) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("docs"), list):
        raise couch.bad_request("Missing JSON list of 'docs'.")
    reqs = []
    for r in body["docs"]:
        if not isinstance(r, dict) or not isinstance(r.get("id"), str):
            raise couch.bad_request("Each entry of 'docs' needs an 'id'")
        if r.get("rev") is not None:
            couch.parse_rev(r["rev"])
        reqs.append(r)
    q = request.query
    atts = 0 if flag(q, "attachments") else None
    return json_response({"results": await asyncio.to_thread(bulk_get_sync, db, reqs, flag(q, "revs"), flag(q, "latest"),
                                                             atts)})

def bulk_get_sync(db: DocDB, reqs: list[dict], revs: bool, latest: bool, atts: int | None = None) -> list[dict]:
    fams = db.families(couch.unid_for(r["id"]) for r in reqs)
    out = []
    for r in reqs:
        i, rev = r["id"], r.get("rev")
        u = couch.unid_for(i)
        cur, cds = fams[u]
        docs = []
        if cur is not None and not cur.is_conflict:
            tree = Tree(Family(u, cur, tuple(cds)))
            if rev is None:
                found = [] if tree.deleted else [tree.winner]
            else:
                lf = tree.leaf(rev)
                found = [lf] if lf is not None else (tree.latest(rev) if latest else [])
            docs = [{"ok": lf.json(i, revs=revs, atts=atts)} for lf in found]
        if not docs:
            docs = [{"error": {"id": i, "rev": rev or "undefined", "error": "not_found",
                               "reason": "missing" if rev or cur is None else "deleted"}}]
        out.append({"id": i, "docs": docs})
    return out

async def doc(request: web.Request, db: DocDB, doc_id: str) -> web.StreamResponse:
    m = request.method
    if m in ("GET", "HEAD"):
        return json_response(await asyncio.to_thread(get_doc_sync, db, doc_id, request.query))
    if m == "PUT":
        body = await read_body(request)
        if not isinstance(body, dict):
            raise couch.bad_request("Document must be a JSON object")
        body["_id"] = doc_id
        if request.query.get("rev"):
            body.setdefault("_rev", request.query["rev"])
        check_sizes(request, [body])
        new_edits = request.query.get("new_edits", "true") != "false"
        return _one(await write_docs(db, [body], new_edits), body)
    if m == "DELETE":
        rev = request.query.get("rev") or request.headers.get("If-Match")
        if not rev:
            raise CouchError(409, "conflict", "Document update conflict.")
        body = {"_id": doc_id, "_rev": rev, "_deleted": True}
        return _one(await write_docs(db, [body], True), body, 200)
    raise CouchError(405, "method_not_allowed", "Only DELETE,GET,HEAD,PUT allowed")

def _one(res: list[dict], body: dict, status: int = 201) -> web.Response:
    r = res[0]
    if "error" in r:
        raise CouchError(ERROR_STATUS.get(r["error"], 400), r["error"], r["reason"])
    return json_response(r or {"ok": True, "id": body["_id"], "rev": body.get("_rev")}, status)

def get_doc_sync(db: DocDB, doc_id: str, q: Any) -> Any:
    u = couch.unid_for(doc_id)
    cur, cds = db.families([u])[u]
    if cur is None or cur.is_conflict:
        raise CouchError(404, "not_found", "missing")
    tree = Tree(Family(u, cur, tuple(cds)))
    revs = flag(q, "revs")
    open_revs = q.get("open_revs")
    if open_revs is not None:
        wanted = [lf.rev for lf in tree.leaves] if open_revs == "all" else qjson(q, "open_revs")
        if not isinstance(wanted, list):
            raise couch.bad_request("open_revs must be a JSON list of revisions or \"all\"")
        out = []
        for rev in wanted:
            couch.parse_rev(rev)
            lf = tree.leaf(rev)
            found = [lf] if lf is not None else (tree.latest(rev) if flag(q, "latest") else [])
            out.extend({"ok": x.json(doc_id, revs=revs, atts=atts_for(q, x))} for x in found)
            if not found:
                out.append({"missing": rev})
        return out
    rev = q.get("rev")
    if rev is not None:
        couch.parse_rev(rev)
        lf = tree.leaf(rev)
        if lf is None:
            raise CouchError(404, "not_found", "missing")
    else:
        lf = tree.winner
        if lf is None or lf.deleted:
            raise CouchError(404, "not_found", "deleted")
    extra: dict[str, Any] = {}
    if flag(q, "conflicts") or flag(q, "meta"):
        extra.update(conflicts_extra(tree, True) or {})
    if (flag(q, "deleted_conflicts") or flag(q, "meta")) and tree.deleted_conflicts():
        extra["_deleted_conflicts"] = tree.deleted_conflicts()
    if flag(q, "revs_info"):
        extra["_revs_info"] = [{"rev": f"{lf.seq - k}-{h}", "status": "available" if k == 0 else "missing"}
                               for k, h in enumerate(lf.path)]
    return lf.json(doc_id, revs=revs, extra=extra, atts=atts_for(q, lf))

async def all_docs(request: web.Request, db: DocDB) -> web.Response:
    q = request.query
    body = await read_body(request) if request.method == "POST" else None
    keys = body.get("keys") if isinstance(body, dict) else qjson(q, "keys")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        raise couch.bad_request("`keys` member must be an array of document ids.")
    opts = {"docs": flag(q, "include_docs"), "conflicts": flag(q, "conflicts"),
            "start": qjson(q, "startkey") if "startkey" in q else qjson(q, "start_key"),
            "end": qjson(q, "endkey") if "endkey" in q else qjson(q, "end_key"),
            "key": qjson(q, "key"), "desc": flag(q, "descending"),
            "incl_end": q.get("inclusive_end", "true") != "false",
            "limit": int_param(q, "limit", 2**62), "skip": int_param(q, "skip", 0)}
    return json_response(await asyncio.to_thread(all_docs_sync, db, keys, opts))

def all_docs_sync(db: DocDB, keys: list | None, o: dict) -> dict:
    def row(doc_id: str, fam: Family) -> dict | None:
        tree = Tree(fam)
        w = tree.winner
        if w is None:
            return None
        r: dict[str, Any] = {"id": doc_id, "key": doc_id, "value": {"rev": w.rev}}
        if w.deleted:
            r["value"]["deleted"] = True
        if o["docs"]:
            r["doc"] = None if w.deleted else w.json(doc_id, extra=conflicts_extra(tree, o["conflicts"]))
        return r

    if keys is not None:
        fams = db.families(couch.unid_for(k) for k in keys)
        rows = []
        for k in keys:
            cur, cds = fams[couch.unid_for(k)]
            r = row(k, Family(cur.unid, cur, tuple(cds))) if cur is not None and not cur.is_conflict else None
            rows.append(r or {"key": k, "error": "not_found"})
        return {"total_rows": len(rows), "offset": 0, "rows": rows}
    docs = {}
    for d in db.documents():
        if not d.is_conflict:
            docs[couch.couch_id(d)] = d
    ids = sorted(docs, reverse=o["desc"])
    total = len(ids)
    if o["key"] is not None:
        ids = [i for i in ids if i == o["key"]]
    lo, hi = (o["end"], o["start"]) if o["desc"] else (o["start"], o["end"])
    if lo is not None:
        ids = [i for i in ids if i >= lo]
    if hi is not None:
        ids = [i for i in ids if i < hi or (o["incl_end"] and i == hi)]
    ids = ids[o["skip"]:o["skip"] + o["limit"]]
    fams = db.families(docs[i].unid for i in ids)
    rows = []
    for i in ids:
        cur, cds = fams[docs[i].unid]
        r = row(i, Family(cur.unid, cur, tuple(cds)))
        if r is not None:
            rows.append(r)
    return {"total_rows": total, "offset": o["skip"], "rows": rows}

async def local(request: web.Request, db: DocDB, name: str) -> web.Response:
    m = request.method
    if m in ("GET", "HEAD"):
        cur = await asyncio.to_thread(db.local_get, name)
        if cur is None:
            raise CouchError(404, "not_found", "missing")
        return json_response({**cur["body"], "_id": "_local/" + name, "_rev": couch.local_rev(cur["n"])})
    if m == "PUT":
        body = await read_body(request)
        if len(encode(body)) > couch.MAX_DOCUMENT_BYTES:
            raise CouchError(413, "document_too_large", "_local/" + name)
    elif m == "DELETE":
        body = {"_rev": request.query.get("rev")}
    else:
        raise CouchError(405, "method_not_allowed", "Only DELETE,GET,HEAD,PUT allowed")

    def update(cur: Any) -> Any:
        if m == "DELETE" and cur is None:
            raise CouchError(404, "not_found", "missing")
        n = couch.check_local_put(cur, body)
        if m == "DELETE":
            return None
        return {"n": n, "body": {k: v for k, v in body.items() if not k.startswith("_")}}

    new = await asyncio.to_thread(db.local_update, name, update)
    rev = couch.local_rev(new["n"]) if new else "0-0"
    return json_response({"ok": True, "id": "_local/" + name, "rev": rev}, 201 if m == "PUT" else 200)
