"""``POST /{db}/_purge`` of the CouchDB endpoints: remove the named leaf revisions of each document
completely (``couch_purge`` decides which stored versions go, ``DocDB.purge`` removes them, one
transaction a document). Answers CouchDB's ``{"purge_seq": null, "purged": {id: [revisions]}}``,
listing only what was purged. Takes an ``admin`` user where the database has users (CouchDB: a
database admin), a writer otherwise."""

from __future__ import annotations

import asyncio

from aiohttp import web

from .. import couch, couch_purge
from ..couch import Family
from .couch_io import json_response, read_body
from .docdb import DocDB


async def purge(request: web.Request, db: DocDB) -> web.Response:
    asked = couch_purge.check_request(await read_body(request))
    for doc_id in asked:
        couch.check_doc_id(doc_id)
    purged = await asyncio.to_thread(purge_sync, db, asked)
    return json_response({"purge_seq": None, "purged": purged}, 201)


def purge_sync(db: DocDB, asked: dict[str, list[str]]) -> dict[str, list[str]]:
    out = {}
    for doc_id, revs in asked.items():
        u = couch.unid_for(doc_id)

        def decide(found: tuple, u: str = u, revs: list[str] = revs) -> couch_purge.PurgePlan:
            cur, cds = found
            fam = Family(u, None if cur is not None and cur.is_conflict else cur, tuple(cds))
            return couch_purge.plan_purge(fam, revs)

        out[doc_id] = db.purge(u, decide).purged
    return out
