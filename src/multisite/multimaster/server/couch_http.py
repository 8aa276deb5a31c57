"""The CouchDB replication endpoints of a document server (``--couch-listen HOST:PORT``): aiohttp on the
server's event loop, JSON by msgspec, database work in threads.

PouchDB, CouchDB's replicator and anything else that speaks CouchDB's replication protocol replicate
with the server's databases here; every decision (names, revisions, trees, what a pushed revision
writes, sequences, checkpoints) is ``couch.py``'s, this module reads and writes through ``DocDB``
(``families``, ``transact``, ``change_rows``, ``local_*``) and answers in CouchDB's shapes, errors
included (``{"error", "reason"}`` with CouchDB's status).

A database's name in URLs is ``couch.db_name(title)`` (its title in lower case, other characters
``-``); two served databases with one name are refused at start. ``PUT /{db}`` of a new name makes a
new database in ``HOME/couch/<name>`` and serves it (an admin's right, or anyone's with no users).

Who may do what: a database's users are those of its directory (``DIR/users.json``, made by
``multisite user add DIR NAME --role R``: a database directory is an instance), by HTTP basic
authentication; a user's access is the database's ACL entry of its name, else ``*``'s (as a server's
is), and at most ``reader`` for a ``read-only`` user. A database without users is open: every request
has ``*``'s access; one with users answers an anonymous request 401. ``none`` shows nothing (401, or
403 when logged in; the database is left out of ``_all_dbs``), ``reader`` reads and keeps checkpoints
(``_local``), ``writer`` also writes. Creating a database takes an ``admin`` user of a served database,
or no users anywhere.

Bounds: a request body is at most ``MAX_REQUEST_BYTES`` and a document ``couch.MAX_DOCUMENT_BYTES``
(413 either way, nothing written); a longpoll or continuous feed waits at most ``MAX_FEED_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec
from aiohttp import web

from ... import __version__
from ...errors import ConfigError, MultisiteError
from ...instance.users import UserFile
from ...net.tls import TLSConfig, parse_hostport
from .. import couch
from ..couch import CouchError, Family, Tree
from . import docdb as docdb_mod
from .docdb import DocDB

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_FEED_TIMEOUT_S = 300.0
DEFAULT_FEED_TIMEOUT_S = 60.0
MAX_CHANGES_LIMIT = 10_000  # rows of one _changes answer (a client pages on)
COUNT_REFRESH_S = 10.0  # GET /{db}'s doc_count is at most this old (a scan of the database)
AUTH_CACHE_S = 300.0  # a verified password is not hashed again for this long (Argon2: ~30 ms each)
CHANGES_ROW_BATCH = 500  # change rows read and turned into _changes rows at once
_enc = msgspec.json.Encoder().encode
_dec = msgspec.json.Decoder().decode
_JSON = "application/json"


def _json(obj: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=_enc(obj), status=status, content_type=_JSON, headers=headers)


def _flag(q: Any, name: str) -> bool:
    return q.get(name, "false").lower() == "true"


def _int(q: Any, name: str, default: int, lo: int = 0, hi: int = 2**62) -> int:
    v = q.get(name)
    if v is None:
        return default
    try:
        return max(lo, min(hi, int(v)))
    except ValueError:
        raise couch.bad_request(f"Invalid value for {name}: {v!r:.40}") from None


def _qjson(q: Any, name: str) -> Any:
    v = q.get(name)
    if v is None:
        return None
    try:
        return _dec(v)
    except msgspec.DecodeError:
        raise couch.bad_request(f"Invalid JSON in {name}") from None


class CouchServer:
    """The CouchDB endpoints over a ``DocServer``'s databases (``ds.dbs``), for its lifetime."""

    def __init__(self, ds: Any, listen: str, tls: TLSConfig | None = None):
        self.ds, self.listen, self.tls = ds, listen, tls
        self.log = logging.getLogger("multisite.docserver.couch")
        self._users: dict[str, UserFile] = {}
        self.uuid = hashlib.sha256(f"multisite-docserver|{ds.name}".encode()).hexdigest()[:32]
        self._verified: dict[tuple, tuple[Any, float, Any]] = {}
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
        open_dbs = [couch.db_name(db.title) for db in self.ds.dbs.values() if not len(self._table(db))]
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

    # -- names, users, access ---------------------------------------------------------------------
    def names(self) -> dict[str, DocDB]:
        out: dict[str, DocDB] = {}
        for db in self.ds.dbs.values():
            name = couch.db_name(db.title)
            if name in out and out[name] is not db:
                raise ConfigError(f"two databases would be named {name!r} on the CouchDB endpoints ({out[name].path} "
                                  f"and {db.path}): give one another title")
            out[name] = db
        return out

    def _table(self, db: DocDB) -> Any:
        uf = self._users.get(db.db_id)
        if uf is None:
            uf = self._users[db.db_id] = UserFile(db.path)
        return uf.current()

    @staticmethod
    def _credentials(request: web.Request) -> tuple[str, str] | None:
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("basic "):
            return None
        try:
            name, _, secret = base64.b64decode(header[6:].strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise CouchError(400, "bad_request", "Malformed Authorization header") from None
        return name, secret

    async def _verify(self, table: Any, cred: tuple[str, str]) -> Any:
        """The user of ``table`` whom ``cred`` names, if the password is right (cached a while: Argon2)."""
        key = (id(table), cred[0], hashlib.sha256(cred[1].encode()).digest())
        hit = self._verified.get(key)
        if hit is not None and hit[2] is table and hit[1] > time.monotonic():
            return hit[0]
        user = await asyncio.to_thread(table.verify, *cred)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[key] = (user, time.monotonic() + AUTH_CACHE_S, table)
        return user

    async def _access(self, db: DocDB, cred: tuple[str, str] | None) -> str:
        """``none``, ``reader``, ``writer``; ``anonymous`` or ``badauth`` where the database has users."""
        table = self._table(db)
        if not len(table):
            return db.acl().get("*", "none")
        if cred is None:
            return "anonymous"
        user = await self._verify(table, cred)
        if user is None:
            return "badauth"
        a = db.access(user.name)
        return "reader" if a == "writer" and user.role == "read-only" else a

    async def _check(self, db: DocDB, cred: tuple[str, str] | None, need: str) -> None:
        a = await self._access(db, cred)
        if a == "anonymous":
            raise CouchError(401, "unauthorized", "You are not authorized to access this db.")
        if a == "badauth":
            raise CouchError(401, "unauthorized", "Name or password is incorrect.")
        if a == "none":
            raise CouchError(403, "forbidden", "You are not allowed to access this db.")
        if need == "writer" and a != "writer":
            raise CouchError(403, "forbidden", "You are not allowed to write to this db (the ACL makes you a reader).")

    async def _who(self, cred: tuple[str, str] | None) -> Any:
        """The user ``cred`` names in some served database's users (its first), or None."""
        if cred is None:
            return None
        for db in list(self.ds.dbs.values()):
            table = self._table(db)
            if len(table) and (user := await self._verify(table, cred)) is not None:
                return user
        return None

    # -- dispatch ---------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            if request.method == "OPTIONS":
                return self._cors(request, web.Response(status=200))
            return self._cors(request, await self._route(request))
        except CouchError as e:
            return self._cors(request, _json(e.body(), e.status))
        except MultisiteError as e:
            self.log.warning("CouchDB request %s %s failed: %s", request.method, request.path, e)
            return self._cors(request, _json({"error": e.code.lower(), "reason": e.message}, 500))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            self.log.exception("CouchDB request %s %s failed", request.method, request.path)
            return self._cors(request, _json({"error": "unknown_error", "reason": repr(e)}, 500))

    @staticmethod
    def _cors(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin and not resp.prepared:
            resp.headers.update({"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
                                 "Access-Control-Allow-Methods": "GET, PUT, POST, HEAD, DELETE",
                                 "Access-Control-Allow-Headers": "accept, authorization, content-type, origin, referer"})
        return resp

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [unquote(p) for p in request.raw_path.split("?", 1)[0].split("/")[1:]]
        if parts and parts[-1] == "" and len(parts) > 1:
            parts.pop()
        cred = self._credentials(request)
        m = request.method
        if parts in ([], [""]):
            return _json({"couchdb": "Welcome", "version": "3.3.3", "uuid": self.uuid,
                          "vendor": {"name": "multisite", "version": __version__}, "features": []})
        top = parts[0]
        if top == "_all_dbs":
            return _json(sorted([n for n, db in self.names().items()
                                 if await self._access(db, cred) in ("reader", "writer")]))
        if top == "_session":
            user = await self._who(cred)
            return _json({"ok": True, "userCtx": {"name": user.name if user else None,
                                                  "roles": ["_admin"] if user and user.role == "admin" else []},
                          "info": {"authentication_handlers": ["default"], "authenticated": "default" if user else None}})
        if top == "_up":
            return _json({"status": "ok"})
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
        await self._check(db, cred, need)
        return await self._db_op(request, db, rest)

    async def _db_op(self, request: web.Request, db: DocDB, rest: list[str]) -> web.StreamResponse:
        m, head = request.method, rest[0]
        if head == "_changes" and m in ("GET", "POST"):
            return await self.changes(request, db)
        if head == "_revs_diff" and m == "POST":
            return await self.revs_diff(request, db)
        if head == "_bulk_docs" and m == "POST":
            return await self.bulk_docs(request, db)
        if head == "_bulk_get" and m == "POST":
            return await self.bulk_get(request, db)
        if head == "_all_docs" and m in ("GET", "POST", "HEAD"):
            return await self.all_docs(request, db)
        if head == "_ensure_full_commit" and m == "POST":
            await asyncio.to_thread(db.flush)
            return _json({"ok": True, "instance_start_time": "0"}, 201)
        if head == "_local" and len(rest) >= 2:
            return await self.local(request, db, "/".join(rest[1:]))
        if head == "_revs_limit":
            return _json(1000) if m == "GET" else _json({"ok": True})
        if head == "_security" and m == "GET":
            return _json({})
        if head == "_design" and len(rest) >= 2:
            return await self.doc(request, db, "_design/" + "/".join(rest[1:]))
        if head.startswith("_"):
            raise CouchError(404, "not_found", "missing")
        if len(rest) > 1:
            raise CouchError(415, "bad_content_type", "attachments are not supported by multisite's document server")
        return await self.doc(request, db, head)

    async def _body(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            raise CouchError(413, "too_large", f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
        data = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            data += chunk
            if len(data) > MAX_REQUEST_BYTES:
                raise CouchError(413, "too_large", f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
        if not data:
            return None
        try:
            return _dec(bytes(data))
        except msgspec.DecodeError:
            raise CouchError(400, "bad_request", "invalid UTF-8 JSON") from None

    # -- databases --------------------------------------------------------------------------------
    async def _db_root(self, request: web.Request, m: str, name: str, db: DocDB | None, cred: Any) -> web.Response:
        if m == "PUT":
            if db is not None:
                raise CouchError(412, "file_exists", "The database could not be created, the file already exists.")
            couch.check_db_name(name)
            if any(len(self._table(d)) for d in list(self.ds.dbs.values())):
                user = await self._who(cred)
                if user is None or user.role != "admin":
                    raise CouchError(401 if user is None else 403, "unauthorized" if user is None else "forbidden",
                                     "You are not a server admin.")
            await asyncio.to_thread(self._create_db, name)
            return _json({"ok": True}, 201)
        if db is None:
            raise CouchError(404, "not_found", "Database does not exist.")
        await self._check(db, cred, "reader")
        if m == "POST":
            await self._check(db, cred, "writer")
            body = await self._body(request)
            if not isinstance(body, dict):
                raise couch.bad_request("Document must be a JSON object")
            body.setdefault("_id", uuid.uuid4().hex)  # 32 hex digits: a UNID
            res = await self._write_docs(db, [body], True)
            r = res[0]
            if "error" in r:
                raise CouchError(409 if r["error"] == "conflict" else 400, r["error"], r["reason"])
            return _json(r, 201)
        if m == "DELETE":
            raise CouchError(403, "forbidden", "multisite does not delete databases over HTTP")
        if m not in ("GET", "HEAD"):
            raise CouchError(405, "method_not_allowed", "Only GET,HEAD,PUT,POST,DELETE allowed")
        live, deleted = await self._count(db)
        return _json({"db_name": name, "doc_count": live, "doc_del_count": deleted,
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
        docdb_mod.record_served_by(db.path, self.ds.home, self.ds.name)
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

    # -- _changes ---------------------------------------------------------------------------------
    async def changes(self, request: web.Request, db: DocDB) -> web.StreamResponse:
        q = request.query
        feed = q.get("feed", "normal")
        if feed not in ("normal", "longpoll", "continuous", "eventsource"):
            raise couch.bad_request(f"Supported `feed` types: normal, continuous, longpoll; not {feed!r:.20}")
        since = couch.parse_since(q.get("since"), db.db_id, db.changeno)
        limit = _int(q, "limit", MAX_CHANGES_LIMIT, 1, MAX_CHANGES_LIMIT)
        opts = {"all": q.get("style") == "all_docs", "docs": _flag(q, "include_docs"), "conflicts": _flag(q, "conflicts"),
                "ids": await self._doc_ids(request)}
        timeout_s = min(_int(q, "timeout", int(DEFAULT_FEED_TIMEOUT_S * 1000)) / 1000, MAX_FEED_TIMEOUT_S)
        heartbeat = q.get("heartbeat")
        beat_s = (60.0 if heartbeat == "true" else _int(q, "heartbeat", 60_000, 1000) / 1000) if heartbeat else None
        if feed == "continuous":
            return await self._continuous(request, db, since, limit, opts, timeout_s, beat_s)
        rows, last = await asyncio.to_thread(self._changes_page, db, since, limit, opts)
        if rows or feed == "normal":
            return _json({"results": rows, "last_seq": couch.seq_text(last, db.db_id), "pending": 0})
        resp = web.StreamResponse(headers={"Content-Type": _JSON})
        await resp.prepare(request)
        deadline = time.monotonic() + timeout_s
        while not rows and time.monotonic() < deadline:
            await self._wait(db, last, min(deadline - time.monotonic(), beat_s or timeout_s), resp, beat_s)
            rows, last = await asyncio.to_thread(self._changes_page, db, last, limit, opts)
        await resp.write(_enc({"results": rows, "last_seq": couch.seq_text(last, db.db_id), "pending": 0}))
        await resp.write_eof()
        return resp

    async def _continuous(self, request, db, since, limit, opts, timeout_s, beat_s) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": _JSON})
        await resp.prepare(request)
        last, sent, idle_until = since, 0, time.monotonic() + timeout_s
        while sent < limit and time.monotonic() < idle_until:
            rows, last = await asyncio.to_thread(self._changes_page, db, last, limit - sent, opts)
            for r in rows:
                await resp.write(_enc(r) + b"\n")
            sent += len(rows)
            if rows:
                idle_until = time.monotonic() + timeout_s
            elif sent < limit:
                await self._wait(db, last, min(idle_until - time.monotonic(), beat_s or timeout_s), resp, beat_s)
        await resp.write(_enc({"last_seq": couch.seq_text(last, db.db_id), "pending": 0}) + b"\n")
        await resp.write_eof()
        return resp

    async def _wait(self, db: DocDB, last: int, wait_s: float, resp: web.StreamResponse, beat_s: float | None) -> None:
        """Until a write after ``last`` or ``wait_s``; a heartbeat newline each ``beat_s`` meanwhile."""
        ev = self._changed[db.db_id]
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

    async def _doc_ids(self, request: web.Request) -> set[str] | None:
        q = request.query
        if q.get("filter") is None:
            return None
        if q["filter"] != "_doc_ids":
            raise couch.bad_request(f"filter {q['filter']!r:.60} is not supported by multisite (only _doc_ids)")
        ids = _qjson(q, "doc_ids")
        if ids is None and request.method == "POST":
            body = await self._body(request)
            ids = body.get("doc_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise couch.bad_request("filter=_doc_ids needs doc_ids, a list of document ids")
        return set(ids)

    def _changes_page(self, db: DocDB, since: int, limit: int, opts: dict) -> tuple[list[dict], int]:
        """Up to ``limit`` rows of documents changed after ``since`` (a conflict document's change is its
        document's), each at its latest change, and the change number they cover. Reads on until it has
        ``limit`` rows or there are no more changes (a short page tells a client it is done)."""
        picked: dict[str, int] = {}  # document -> its latest change number, in change order
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
        out = []
        mains = list(picked)
        fams = db.families(mains)
        for u in mains:
            cur, cds = fams[u]
            if cur is None or cur.is_conflict:
                continue  # its conflict documents came first; listed once the document is here
            fam = Family(u, cur, tuple(cds))
            doc_id = couch.couch_id(cur)
            if opts["ids"] is not None and doc_id not in opts["ids"]:
                continue
            tree = Tree(fam)
            row: dict[str, Any] = {"seq": couch.seq_text(picked[u], db.db_id), "id": doc_id,
                                   "changes": [{"rev": lf.rev} for lf in (tree.leaves if opts["all"] else tree.leaves[:1])]}
            if tree.deleted:
                row["deleted"] = True
            if opts["docs"]:
                row["doc"] = tree.winner.json(doc_id, extra=self._conflicts(tree, opts["conflicts"]))
            out.append(row)
        return out, last

    @staticmethod
    def _conflicts(tree: Tree, want: bool) -> dict | None:
        if not want:
            return None
        c = tree.conflicts()
        return {"_conflicts": c} if c else None

    # -- replication ------------------------------------------------------------------------------
    async def revs_diff(self, request: web.Request, db: DocDB) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict) or not all(isinstance(v, list) for v in body.values()):
            raise couch.bad_request("Request body must be a JSON object of document ids to lists of revisions")
        asked = {i: [couch.parse_rev(r) for r in revs] for i, revs in body.items()}
        return _json(await asyncio.to_thread(self._revs_diff, db, body, asked))

    @staticmethod
    def _revs_diff(db: DocDB, body: dict, asked: dict) -> dict:
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

    async def bulk_docs(self, request: web.Request, db: DocDB) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict) or not isinstance(body.get("docs"), list):
            raise couch.bad_request("POST body must include `docs` parameter.")
        new_edits = body.get("new_edits", True)
        if not isinstance(new_edits, bool):
            raise couch.bad_request("`new_edits` parameter must be a boolean.")
        self._check_sizes(request, body["docs"])
        res = await self._write_docs(db, body["docs"], new_edits)
        return _json([r for r in res if "error" in r] if not new_edits else res, 201)

    @staticmethod
    def _check_sizes(request: web.Request, docs: list) -> None:
        if (request.content_length or 0) <= couch.MAX_DOCUMENT_BYTES:
            return
        for d in docs:
            if len(_enc(d)) > couch.MAX_DOCUMENT_BYTES:
                raise CouchError(413, "document_too_large", str(d.get("_id") if isinstance(d, dict) else "")[:200])

    async def _write_docs(self, db: DocDB, docs: list, new_edits: bool) -> list[dict]:
        return await asyncio.to_thread(self._write_docs_sync, db, docs, new_edits)

    @staticmethod
    def _write_docs_sync(db: DocDB, docs: list, new_edits: bool) -> list[dict]:
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

        def decide(fams: dict, now: Callable[[], int]) -> tuple[list, None]:
            writes = []
            for u, items in groups.items():
                cur, cds = fams[u]
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
                    writes.extend(p.writes)
                    results[k] = {"ok": True, "id": couch.couch_id(v), "rev": couch.doc_rev(v)}
            return writes, None

        db.transact(list(groups), decide)
        return results

    async def bulk_get(self, request: web.Request, db: DocDB) -> web.Response:
        body = await self._body(request)
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
        return _json({"results": await asyncio.to_thread(self._bulk_get, db, reqs, _flag(q, "revs"), _flag(q, "latest"))})

    @staticmethod
    def _bulk_get(db: DocDB, reqs: list[dict], revs: bool, latest: bool) -> list[dict]:
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
                docs = [{"ok": lf.json(i, revs=revs)} for lf in found]
            if not docs:
                docs = [{"error": {"id": i, "rev": rev or "undefined", "error": "not_found",
                                   "reason": "missing" if rev or cur is None else "deleted"}}]
            out.append({"id": i, "docs": docs})
        return out

    # -- documents --------------------------------------------------------------------------------
    async def doc(self, request: web.Request, db: DocDB, doc_id: str) -> web.StreamResponse:
        m = request.method
        if m in ("GET", "HEAD"):
            return _json(await asyncio.to_thread(self._get_doc, db, doc_id, request.query))
        if m == "PUT":
            body = await self._body(request)
            if not isinstance(body, dict):
                raise couch.bad_request("Document must be a JSON object")
            body["_id"] = doc_id
            if request.query.get("rev"):
                body.setdefault("_rev", request.query["rev"])
            self._check_sizes(request, [body])
            new_edits = request.query.get("new_edits", "true") != "false"
            return self._one(await self._write_docs(db, [body], new_edits), body)
        if m == "DELETE":
            rev = request.query.get("rev") or request.headers.get("If-Match")
            if not rev:
                raise CouchError(409, "conflict", "Document update conflict.")
            body = {"_id": doc_id, "_rev": rev, "_deleted": True}
            return self._one(await self._write_docs(db, [body], True), body, 200)
        raise CouchError(405, "method_not_allowed", "Only DELETE,GET,HEAD,PUT allowed")

    @staticmethod
    def _one(res: list[dict], body: dict, status: int = 201) -> web.Response:
        r = res[0]
        if "error" in r:
            code = {"conflict": 409, "forbidden": 403, "bad_content_type": 415}.get(r["error"], 400)
            raise CouchError(code, r["error"], r["reason"])
        return _json(r or {"ok": True, "id": body["_id"], "rev": body.get("_rev")}, status)

    @staticmethod
    def _get_doc(db: DocDB, doc_id: str, q: Any) -> Any:
        u = couch.unid_for(doc_id)
        cur, cds = db.families([u])[u]
        if cur is None or cur.is_conflict:
            raise CouchError(404, "not_found", "missing")
        tree = Tree(Family(u, cur, tuple(cds)))
        revs = _flag(q, "revs")
        open_revs = q.get("open_revs")
        if open_revs is not None:
            wanted = [lf.rev for lf in tree.leaves] if open_revs == "all" else _qjson(q, "open_revs")
            if not isinstance(wanted, list):
                raise couch.bad_request("open_revs must be a JSON list of revisions or \"all\"")
            out = []
            for rev in wanted:
                couch.parse_rev(rev)
                lf = tree.leaf(rev)
                found = [lf] if lf is not None else (tree.latest(rev) if _flag(q, "latest") else [])
                out.extend({"ok": x.json(doc_id, revs=revs)} for x in found)
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
        if _flag(q, "conflicts") or _flag(q, "meta"):
            extra.update(CouchServer._conflicts(tree, True) or {})
        if (_flag(q, "deleted_conflicts") or _flag(q, "meta")) and tree.deleted_conflicts():
            extra["_deleted_conflicts"] = tree.deleted_conflicts()
        if _flag(q, "revs_info"):
            extra["_revs_info"] = [{"rev": f"{lf.seq - k}-{h}", "status": "available" if k == 0 else "missing"}
                                   for k, h in enumerate(lf.path)]
        return lf.json(doc_id, revs=revs, extra=extra)

    async def all_docs(self, request: web.Request, db: DocDB) -> web.Response:
        q = request.query
        body = await self._body(request) if request.method == "POST" else None
        keys = body.get("keys") if isinstance(body, dict) else _qjson(q, "keys")
        if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
            raise couch.bad_request("`keys` member must be an array of document ids.")
        opts = {"docs": _flag(q, "include_docs"), "conflicts": _flag(q, "conflicts"),
                "start": _qjson(q, "startkey") if "startkey" in q else _qjson(q, "start_key"),
                "end": _qjson(q, "endkey") if "endkey" in q else _qjson(q, "end_key"),
                "key": _qjson(q, "key"), "desc": _flag(q, "descending"),
                "incl_end": q.get("inclusive_end", "true") != "false",
                "limit": _int(q, "limit", 2**62), "skip": _int(q, "skip", 0)}
        return _json(await asyncio.to_thread(self._all_docs, db, keys, opts))

    @staticmethod
    def _all_docs(db: DocDB, keys: list | None, o: dict) -> dict:
        def row(doc_id: str, fam: Family) -> dict | None:
            tree = Tree(fam)
            w = tree.winner
            if w is None:
                return None
            r: dict[str, Any] = {"id": doc_id, "key": doc_id, "value": {"rev": w.rev}}
            if w.deleted:
                r["value"]["deleted"] = True
            if o["docs"]:
                r["doc"] = None if w.deleted else w.json(doc_id, extra=CouchServer._conflicts(tree, o["conflicts"]))
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

    # -- checkpoints ------------------------------------------------------------------------------
    async def local(self, request: web.Request, db: DocDB, name: str) -> web.Response:
        m = request.method
        if m in ("GET", "HEAD"):
            cur = await asyncio.to_thread(db.local_get, name)
            if cur is None:
                raise CouchError(404, "not_found", "missing")
            return _json({**cur["body"], "_id": "_local/" + name, "_rev": couch.local_rev(cur["n"])})
        if m == "PUT":
            body = await self._body(request)
            if len(_enc(body)) > couch.MAX_DOCUMENT_BYTES:
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
        return _json({"ok": True, "id": "_local/" + name, "rev": rev}, 201 if m == "PUT" else 200)
