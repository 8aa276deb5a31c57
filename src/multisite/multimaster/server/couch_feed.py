"""``GET|POST /{db}/_changes`` of the CouchDB endpoints: a page of changed documents (a conflict
document's change is its document's; every row its own sequence), and the longpoll and continuous
feeds that wait for the database's next write (``CouchServer`` sets the event a database's writes set)
with heartbeats, at most ``MAX_FEED_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .. import couch
from ..couch import Family, Tree
from ..couch_selector import compile_selector
from .couch_io import (
    JSON,
    conflicts_extra,
    encode,
    flag,
    int_param,
    json_response,
    qjson,
    read_body,
)
from .docdb import DocDB

MAX_FEED_TIMEOUT_S = 300.0
DEFAULT_FEED_TIMEOUT_S = 60.0
MAX_CHANGES_LIMIT = 10_000  # rows of one _changes answer (a client pages on)
CHANGES_ROW_BATCH = 500  # change rows read and turned into _changes rows at once


async def changes(request: web.Request, db: DocDB, ev: asyncio.Event) -> web.StreamResponse:
    q = request.query
    feed = q.get("feed", "normal")
    if feed not in ("normal", "longpoll", "continuous", "eventsource"):
        raise couch.bad_request(f"Supported `feed` types: normal, continuous, longpoll; not {feed!r:.20}")
    since = couch.parse_since(q.get("since"), db.db_id, db.changeno)
    limit = int_param(q, "limit", MAX_CHANGES_LIMIT, 1, MAX_CHANGES_LIMIT)
    opts = {"all": q.get("style") == "all_docs", "docs": flag(q, "include_docs"), "conflicts": flag(q, "conflicts"),
            "keep": await _filter(request), "atts": 0 if flag(q, "attachments") else None}
    timeout_s = min(int_param(q, "timeout", int(DEFAULT_FEED_TIMEOUT_S * 1000)) / 1000, MAX_FEED_TIMEOUT_S)
    heartbeat = q.get("heartbeat")
    beat_s = (60.0 if heartbeat == "true" else int_param(q, "heartbeat", 60_000, 1000) / 1000) if heartbeat else None
    if feed == "continuous":
        return await _continuous(request, db, ev, since, limit, opts, timeout_s, beat_s)
    rows, last = await asyncio.to_thread(changes_page, db, since, limit, opts)
    if rows or feed == "normal":
        return json_response({"results": rows, "last_seq": couch.seq_text(last, db.db_id), "pending": 0})
    resp = web.StreamResponse(headers={"Content-Type": JSON})
    await resp.prepare(request)
    deadline = time.monotonic() + timeout_s
    while not rows and time.monotonic() < deadline:
        await _wait(db, ev, last, min(deadline - time.monotonic(), beat_s or timeout_s), resp, beat_s)
        rows, last = await asyncio.to_thread(changes_page, db, last, limit, opts)
    await resp.write(encode({"results": rows, "last_seq": couch.seq_text(last, db.db_id), "pending": 0}))
    await resp.write_eof()
    return resp

async def _continuous(request, db, ev, since, limit, opts, timeout_s, beat_s) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": JSON})
    await resp.prepare(request)
    last, sent, idle_until = since, 0, time.monotonic() + timeout_s
    while sent < limit and time.monotonic() < idle_until:
        rows, last = await asyncio.to_thread(changes_page, db, last, limit - sent, opts)
        for r in rows:
            await resp.write(encode(r) + b"\n")
        sent += len(rows)
        if rows:
            idle_until = time.monotonic() + timeout_s
        elif sent < limit:
            await _wait(db, ev, last, min(idle_until - time.monotonic(), beat_s or timeout_s), resp, beat_s)
    await resp.write(encode({"last_seq": couch.seq_text(last, db.db_id), "pending": 0}) + b"\n")
    await resp.write_eof()
    return resp

async def _wait(db: DocDB, ev: asyncio.Event, last: int, wait_s: float, resp: web.StreamResponse, beat_s: float | None) -> None:
    """Until a write after ``last`` or ``wait_s``; a heartbeat newline each ``beat_s`` meanwhile."""
    end = time.monotonic() + max(0.0, wait_s)
    while db.changeno <= last and time.monotonic() < end:
        ev.clear()
        if db.changeno > last:
            return
        step = end - time.monotonic() if beat_s is None else min(beat_s, end - time.monotonic())
        try:
            await asyncio.wait_for(ev.wait(), max(0.0, step))
        except TimeoutError:
            if beat_s is not None and db.changeno <= last:
                await resp.write(b"\n")

Keep = Callable[[str, Tree], bool]  # a filter: is the row of this document (its id, its tree) sent?


async def _filter(request: web.Request) -> Keep | None:
    """The feed's filter: ``_doc_ids`` (ids in the query or the body) or ``_selector`` (a Mango
    selector in the body, matched against the winning revision's body); anything else is refused:
    ``_view`` and design-document filters are JavaScript, which multisite does not run."""
    q = request.query
    name = q.get("filter")
    if name is None:
        return None
    body = await read_body(request) if request.method == "POST" else None
    body = body if isinstance(body, dict) else {}
    if name == "_doc_ids":
        ids = qjson(q, "doc_ids")
        ids = body.get("doc_ids") if ids is None else ids
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise couch.bad_request("filter=_doc_ids needs doc_ids, a list of document ids")
        wanted = set(ids)
        return lambda doc_id, tree: doc_id in wanted
    if name == "_selector":
        if "selector" not in body:
            raise couch.bad_request("filter=_selector needs a selector in the POST body: {\"selector\": {...}}")
        m = compile_selector(body["selector"])
        return lambda doc_id, tree: m.matches(tree.winner.json(doc_id))
    if name in ("_view", "_design") or "/" in name:
        raise couch.bad_request(f"filter={name:.60} runs a design document's JavaScript, which multisite's "
                                f"document server does not run; use _doc_ids or _selector (a Mango selector)")
    raise couch.bad_request(f"filter {name!r:.60} is not supported by multisite (only _doc_ids and _selector)")

def changes_page(db: DocDB, since: int, limit: int, opts: dict) -> tuple[list[dict], int]:
    """Up to ``limit`` rows of documents changed after ``since`` (a conflict document's change is its
    document's), each at its latest change, and the change number they cover. Reads on until it has
    ``limit`` rows or there are no more changes: a short page tells a client it is done (PouchDB and
    CouchDB's replicator stop there), so documents a filter drops, and purged ones, do not count."""
    rows: dict[str, dict] = {}  # document -> its row, in change order
    last = since
    while True:
        want = limit - len(rows)
        picked, last = _pick(db, last, want)
        for u, row in _rows(db, picked, opts):
            rows.pop(u, None)
            rows[u] = row
        if len(picked) < want or len(rows) >= limit:  # no more changes, or a full page
            return list(rows.values()), last


def _pick(db: DocDB, since: int, limit: int) -> tuple[dict[str, int], int]:
    """Up to ``limit`` documents changed after ``since`` -> their latest change number, in change
    order, and the change number read up to (fewer than ``limit``: no more changes)."""
    picked: dict[str, int] = {}
    last = since
    while len(picked) < limit:
        rows, upto = db.change_rows(last, CHANGES_ROW_BATCH)
        if not rows:
            last = max(last, upto)
            break
        for n, u, _ in rows:
            main = db.ref_of(u) or u
            picked.pop(main, None)
            picked[main] = n
            last = n
            if len(picked) >= limit:
                break
        else:
            last = upto
    return picked, last


def _rows(db: DocDB, picked: dict[str, int], opts: dict) -> list[tuple[str, dict]]:
    """The ``_changes`` rows of the ``picked`` documents that exist and pass the feed's filter."""
    out = []
    keep = opts.get("keep")
    fams = db.families(list(picked))
    for u, n in picked.items():
        cur, cds = fams[u]
        if cur is None or cur.is_conflict:
            continue  # purged; or its conflict documents came first: listed once the document is here
        doc_id = couch.couch_id(cur)
        tree = Tree(Family(u, cur, tuple(cds)))
        if keep is not None and not keep(doc_id, tree):
            continue
        row: dict[str, Any] = {"seq": couch.seq_text(n, db.db_id), "id": doc_id,
                               "changes": [{"rev": lf.rev} for lf in (tree.leaves if opts["all"] else tree.leaves[:1])]}
        if tree.deleted:
            row["deleted"] = True
        if opts["docs"]:
            row["doc"] = tree.winner.json(doc_id, extra=conflicts_extra(tree, opts["conflicts"]), atts=opts.get("atts"))
        out.append((u, row))
    return out
