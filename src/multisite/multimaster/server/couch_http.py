"""The CouchDB replication endpoints of a document server (``--couch-listen HOST:PORT``): aiohttp on the
server's event loop, JSON by msgspec, database work in threads. This module is the server (its life,
names, users and access, routing, databases); ``couch_feed.py`` answers ``_changes``,
``couch_docs.py`` the documents, ``couch_io.py`` what they share.

PouchDB, CouchDB's replicator and anything else that speaks CouchDB's replication protocol replicate
with the server's databases here; every decision (names, revisions, trees, what a pushed revision
writes, sequences, checkpoints) is ``couch.py``'s, this module reads and writes through ``DocDB``
(``families``, ``transact``, ``change_rows``, ``local_*``) and answers in CouchDB's shapes, errors
included (``{"error", "reason"}`` with CouchDB's status).

A database's name in URLs is ``couch.db_name(title)`` (its title in lower case, other characters
``-``); two served databases with one name are refused at start. ``PUT /{db}`` of a new name makes a
new database in ``HOME/couch/<name>`` and serves it (an admin's right, or anyone's with no users).

Who may do what is ``couch_auth.py``'s: basic authentication and cookie sessions (``/_session``)
against each database's users (``DIR/users.json``), mapped to its ACL. Which browser pages may read
the answers is ``couch_cors.py``'s: the origins given by ``--couch-cors-origin``, and the endpoints' own. Creating a database takes an
``admin`` user of a served database, or no users anywhere.

Bounds: a request body is at most ``MAX_REQUEST_BYTES`` and a document ``couch.MAX_DOCUMENT_BYTES``
(413 either way, nothing written); a longpoll or continuous feed waits at most
``couch_feed.MAX_FEED_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from ... import __version__
from ...errors import ConfigError, MultisiteError
from ...net.tls import TLSConfig, parse_hostport
from .. import couch, couch_cors
from ..couch import CouchError
from . import couch_attach, couch_docs, couch_feed, couch_purge_http
from . import docdb as docdb_mod
from .couch_auth import CouchAuth, Cred
from .couch_io import ERROR_STATUS, MAX_REQUEST_BYTES, json_response, read_body
from .docdb import DocDB
from .docdb_files import record_served_by

COUNT_REFRESH_S = 10.0  # GET /{db}'s doc_count is at most this old (a scan of the database)


class CouchServer:
    """The CouchDB endpoints over a ``DocServer``'s databases (``ds.dbs``), for its lifetime."""

    def __init__(self, ds: Any, listen: str, tls: TLSConfig | None = None, cors_origins: Iterable[str] = ()):
        self.ds, self.listen, self.tls = ds, listen, tls
        self.cors_origins = couch_cors.parse_origins(cors_origins)  # a malformed one: ConfigError now
        self.log = logging.getLogger("multisite.docserver.couch")
        self.auth = CouchAuth(ds, secure=tls is not None)
        self.uuid = hashlib.sha256(f"multisite-docserver|{ds.name}".encode()).hexdigest()[:32]
        self._changed: dict[str, asyncio.Event] = {}
        self._counts: dict[str, tuple[float, int, tuple[int, int]]] = {}
        self._watched: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.names()  # two databases with one name: refused now

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> int:
        self.loop = asyncio.get_running_loop()
        host, port = parse_hostport(self.listen)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_response_prepare.append(self._cors)  # every answer, streamed feeds included
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        ctx = self.tls.server_context(client_cert_required=False) if self.tls else None
        site = web.TCPSite(self._runner, host, port, ssl_context=ctx)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise ConfigError(f"the CouchDB endpoints cannot listen on {self.listen}: {e.strerror or e}") from None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        for db in list(self.ds.dbs.values()):
            self._watch(db)
        open_dbs = [couch.db_name(db.title) for db in self.ds.dbs.values() if not len(self.auth.table(db))]
        if open_dbs:
            self.log.warning("CouchDB endpoints on %s:%d take anonymous requests to %s (no DIR/users.json): "
                             "their '*' ACL entry decides", host, self.port, ", ".join(sorted(open_dbs)))
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _watch(self, db: DocDB) -> None:
        if db.db_id in self._watched:
            return
        self._watched.add(db.db_id)
        ev = self._changed.setdefault(db.db_id, asyncio.Event())
        db.add_listener(lambda n: self.loop.call_soon_threadsafe(ev.set))

    # -- names ----------------------------------------------------------------------------------
    def names(self) -> dict[str, DocDB]:
        out: dict[str, DocDB] = {}
        for db in self.ds.dbs.values():
            name = couch.db_name(db.title)
            if name in out and out[name] is not db:
                raise ConfigError(f"two databases would be named {name!r} on the CouchDB endpoints ({out[name].path} "
                                  f"and {db.path}): give one another title")
            out[name] = db
        return out

    # -- dispatch ---------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            if request.method == "OPTIONS":  # a browser's preflight: _cors answers it
                return web.Response(status=200)
            cred = self.auth.credentials(request)
            resp = await self._route(request, cred)
            self.auth.renew(cred, resp)
            return resp
        except CouchError as e:
            return json_response(e.body(), e.status)
        except MultisiteError as e:
            self.log.warning("CouchDB request %s %s failed: %s", request.method, request.path, e)
            return json_response({"error": e.code.lower(), "reason": e.message}, 500)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            self.log.exception("CouchDB request %s %s failed", request.method, request.path)
            return json_response({"error": "unknown_error", "reason": repr(e)}, 500)

    async def _cors(self, request: web.Request, resp: web.StreamResponse) -> None:
        """CORS headers for an origin ``couch_cors`` allows (configured, or the endpoints' own); none for
        any other: answers carry credentials, so an unknown page must not read them."""
        origin = request.headers.get("Origin")
        if couch_cors.allowed(origin, self.cors_origins, request.scheme, request.host):
            resp.headers.update(couch_cors.headers(origin, preflight=request.method == "OPTIONS"))

    async def _route(self, request: web.Request, cred: Cred | None) -> web.StreamResponse:
        parts = [unquote(p) for p in request.raw_path.split("?", 1)[0].split("/")[1:]]
        if parts and parts[-1] == "" and len(parts) > 1:
            parts.pop()
        m = request.method
        if parts in ([], [""]):
            return json_response({"couchdb": "Welcome", "version": "3.3.3", "uuid": self.uuid,
                          "vendor": {"name": "multisite", "version": __version__}, "features": []})
        top = parts[0]
        if top == "_all_dbs":
            return json_response(sorted([n for n, db in self.names().items()
                                 if await self.auth.access(db, cred) in ("reader", "writer")]))
        if top == "_session":
            return await self.auth.session(request, cred)
        if top == "_up":
            return json_response({"status": "ok"})
        if top.startswith("_"):
            raise CouchError(404, "not_found", "Database does not exist.")
        db = self.names().get(top)
        if len(parts) == 1:
            return await self._db_root(request, m, top, db, cred)
        if db is None:
            raise CouchError(404, "not_found", "Database does not exist.")
        rest = parts[1:]
        need = "writer" if m in ("PUT", "POST", "DELETE") and rest[0] not in (
            "_revs_diff", "_bulk_get", "_all_docs", "_changes", "_ensure_full_commit", "_local") else "reader"
        await self.auth.check(db, cred, need)
        if rest[0] == "_purge":
            await self.auth.check_admin(db, cred)
        return await self._db_op(request, db, rest)

    async def _db_op(self, request: web.Request, db: DocDB, rest: list[str]) -> web.StreamResponse:
        m, head = request.method, rest[0]
        if head == "_changes" and m in ("GET", "POST"):
            return await couch_feed.changes(request, db, self._changed[db.db_id])
        if head == "_revs_diff" and m == "POST":
            return await couch_docs.revs_diff(request, db)
        if head == "_bulk_docs" and m == "POST":
            return await couch_docs.bulk_docs(request, db)
        if head == "_bulk_get" and m == "POST":
            return await couch_docs.bulk_get(request, db)
        if head == "_all_docs" and m in ("GET", "POST", "HEAD"):
            return await couch_docs.all_docs(request, db)
        if head == "_ensure_full_commit" and m == "POST":
            await asyncio.to_thread(db.flush)
            return json_response({"ok": True, "instance_start_time": "0"}, 201)
        if head == "_local" and len(rest) >= 2:
            return await couch_docs.local(request, db, "/".join(rest[1:]))
        if head == "_purge" and m == "POST":
            resp = await couch_purge_http.purge(request, db)
            self._counts.pop(db.db_id, None)  # a removed document writes no change: the count's key stays
            return resp
        if head == "_revs_limit":
            return json_response(1000) if m == "GET" else json_response({"ok": True})
        if head == "_security" and m == "GET":
            return json_response({})
        if head == "_design" and len(rest) >= 2:
            return await couch_docs.doc(request, db, "_design/" + "/".join(rest[1:]))
        if head.startswith("_"):
            raise CouchError(404, "not_found", "missing")
        if len(rest) > 1:
            return await couch_attach.attachment(request, db, head, "/".join(rest[1:]))
        return await couch_docs.doc(request, db, head)

    # -- databases --------------------------------------------------------------------------------
    async def _db_root(self, request: web.Request, m: str, name: str, db: DocDB | None, cred: Any) -> web.Response:
        if m == "PUT":
            if db is not None:
                raise CouchError(412, "file_exists", "The database could not be created, the file already exists.")
            couch.check_db_name(name)
            if any(len(self.auth.table(d)) for d in list(self.ds.dbs.values())):
                user = await self.auth.who(cred)
                if user is None or user.role != "admin":
                    raise CouchError(401 if user is None else 403, "unauthorized" if user is None else "forbidden",
                                     "You are not a server admin.")
            await asyncio.to_thread(self._create_db, name)
            return json_response({"ok": True}, 201)
        if db is None:
            raise CouchError(404, "not_found", "Database does not exist.")
        await self.auth.check(db, cred, "reader")
        if m == "POST":
            await self.auth.check(db, cred, "writer")
            body = await read_body(request)
            if not isinstance(body, dict):
                raise couch.bad_request("Document must be a JSON object")
            body.setdefault("_id", uuid.uuid4().hex)  # 32 hex digits: a UNID
            res = await couch_docs.write_docs(db, [body], True)
            r = res[0]
            if "error" in r:
                raise CouchError(ERROR_STATUS.get(r["error"], 400), r["error"], r["reason"])
            return json_response(r, 201)
        if m == "DELETE":
            raise CouchError(403, "forbidden", "multisite does not delete databases over HTTP")
        if m not in ("GET", "HEAD"):
            raise CouchError(405, "method_not_allowed", "Only GET,HEAD,PUT,POST,DELETE allowed")
        live, deleted = await self._count(db)
        return json_response({"db_name": name, "doc_count": live, "doc_del_count": deleted,
                      "update_seq": couch.seq_text(db.changeno, db.db_id), "purge_seq": 0, "compact_running": False,
                      "sizes": {"active": 0, "external": 0, "file": 0}, "instance_start_time": "0",
                      "disk_format_version": 8, "props": {}})

    def _create_db(self, name: str) -> None:
        path = Path(self.ds.home) / "couch" / name
        if path.exists():
            raise CouchError(412, "file_exists", "The database could not be created, the file already exists.")
        path.parent.mkdir(mode=0o700, exist_ok=True)
        db = docdb_mod.create(path, name)
        self.ds.dbs[db.replica_id] = db
        record_served_by(db.path, self.ds.home, self.ds.name)
        self.loop.call_soon_threadsafe(self._watch, db)
        self.log.info("CouchDB endpoints: database %s created in %s (replica %s)", name, path, db.replica_id)

    async def _count(self, db: DocDB) -> tuple[int, int]:
        hit = self._counts.get(db.db_id)
        now = time.monotonic()
        if hit is not None and (hit[1] == db.changeno or hit[0] > now):
            return hit[2]
        counts = await asyncio.to_thread(db.count_main)
        self._counts[db.db_id] = (now + COUNT_REFRESH_S, db.changeno, counts)
        return counts
