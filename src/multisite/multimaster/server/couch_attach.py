"""``GET|PUT|DELETE /{db}/{id}/{name}`` of the CouchDB endpoints: one attachment of a document, as raw
bytes (PouchDB pulls each attachment of a replicated document this way). A ``PUT`` or ``DELETE`` is a
new edit of the revision ``rev`` names (409 when it is not a leaf any more), made through the same
write as ``PUT /{db}/{id}`` with the other attachments as stubs. What an attachment is in a multisite
document: ``couch_atts``."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from aiohttp import web

from .. import couch, couch_atts
from ..couch import CouchError, Family, Leaf, Tree
from .couch_docs import write_docs
from .couch_io import ERROR_STATUS, json_response
from .docdb import DocDB


def _leaf(db: DocDB, doc_id: str, rev: str | None) -> Leaf | None:
    """The version ``rev`` names of ``doc_id`` (its winner without ``rev``); None when there is none."""
    u = couch.unid_for(couch.check_doc_id(doc_id))
    cur, cds = db.families([u])[u]
    if cur is None or cur.is_conflict:
        return None
    tree = Tree(Family(u, cur, tuple(cds)))
    if rev is None:
        return tree.winner
    couch.parse_rev(rev)
    return tree.leaf(rev)


async def attachment(request: web.Request, db: DocDB, doc_id: str, name: str) -> web.StreamResponse:
    m = request.method
    couch_atts.check_name(name)
    rev = request.query.get("rev") or request.headers.get("If-Match")
    if m in ("GET", "HEAD"):
        lf = await asyncio.to_thread(_leaf, db, doc_id, rev)
        if lf is None or lf.doc is None or lf.deleted:
            raise CouchError(404, "not_found", "missing" if lf is None else "deleted")
        found = couch_atts.content(lf.doc.fields, name)
        if found is None:
            raise CouchError(404, "not_found", "Document is missing attachment")
        ctype, raw, digest = found
        if not ctype.isascii() or not ctype.isprintable():  # CR/LF: aiohttp drops the connection (header injection)
            ctype = couch_atts.DEFAULT_CONTENT_TYPE
        return web.Response(body=b"" if m == "HEAD" else raw, status=200, headers={
            "Content-Type": ctype, "ETag": f'"{digest}"', "Content-Length": str(len(raw)),
            "Accept-Ranges": "none"})
    if m == "PUT":
        raw = await _raw_body(request)
        att = {"content_type": request.headers.get("Content-Type") or couch_atts.DEFAULT_CONTENT_TYPE,
               "data": base64.b64encode(raw).decode()}
        return await _edit(db, doc_id, name, rev, att)
    if m == "DELETE":
        if not rev:
            raise CouchError(409, "conflict", "Document update conflict.")
        return await _edit(db, doc_id, name, rev, None)
    raise CouchError(405, "method_not_allowed", "Only DELETE,GET,HEAD,PUT allowed")


async def _raw_body(request: web.Request) -> bytes:
    limit = couch_atts.MAX_ATTACHMENTS_BYTES
    if (request.content_length or 0) > limit:
        raise CouchError(413, "attachment_too_large", f"an attachment holds at most {limit} bytes")
    data = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > limit:
            raise CouchError(413, "attachment_too_large", f"an attachment holds at most {limit} bytes")
    return bytes(data)


async def _edit(db: DocDB, doc_id: str, name: str, rev: str | None, att: dict | None) -> web.Response:
    """A new edit of ``rev`` with attachment ``name`` set to ``att`` (None: removed)."""
    lf = await asyncio.to_thread(_leaf, db, doc_id, rev)
    if (rev is not None and lf is None) or (rev is None and lf is not None and not lf.deleted):
        raise CouchError(409, "conflict", "Document update conflict.")
    body: dict[str, Any] = {"_id": doc_id}
    if lf is not None and not lf.deleted:
        body = lf.json(doc_id)
    elif lf is not None and rev is not None:
        body["_rev"] = rev
    atts = dict(body.get("_attachments") or {})
    if att is None:
        if name not in atts:
            raise CouchError(404, "not_found", "Document is missing attachment")
        del atts[name]
    else:
        atts[name] = att
    body["_attachments"] = atts
    r = (await write_docs(db, [body], True))[0]
    if "error" in r:
        raise CouchError(ERROR_STATUS.get(r["error"], 400), r["error"], r["reason"])
    return json_response(r, 201 if att is not None else 200)
