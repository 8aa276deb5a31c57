"""Who a request to the CouchDB endpoints is, and what it may do: HTTP basic authentication and cookie
sessions (``/_session``) against the served databases' users, mapped to each database's ACL.

A database's users are those of its directory (``DIR/users.json``, ``multisite user add DIR NAME --role
R``); a user's access is the ACL entry of its name, else ``*``'s, at most ``reader`` for a
``read-only`` user. A database without users is open (``*`` decides); one with users answers an
anonymous request 401. A verified password is cached ``AUTH_CACHE_S`` (Argon2 takes ~30 ms).

``POST /_session`` (a form or JSON with ``name`` and ``password``) checks the password against every
served database that has the user and answers an ``AuthSession`` cookie naming those users' records
(``couch_session``: signed with the server's secret, ``HOME/couch_session.secret``, made once, so
sessions outlive a restart); a request with the cookie then acts as that user where the record is
unchanged. A cookie past half its life is renewed on the next answer (``Set-Cookie``). ``GET
/_session`` says who the request is (401 for basic credentials that name no user or a wrong password,
as CouchDB's; an expired cookie is anonymous); ``DELETE /_session`` ends the cookie.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ...fsutil import atomic_write
from ...instance.users import UserFile
from .. import couch_session
from ..couch import CouchError
from .couch_io import json_response, read_body
from .docdb import DocDB

AUTH_CACHE_S = 300.0  # a verified password is not hashed again for this long (Argon2: ~30 ms each)
SECRET_FILE = "couch_session.secret"
SESSION_TIMEOUT_S = couch_session.DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Cred:
    """A request's credentials: a name and password (basic), or a verified session (cookie)."""

    name: str
    password: str | None = None
    session: couch_session.Session | None = None


def load_secret(home: Path) -> bytes:
    """The server's session secret (32 random bytes), made crash-safely (0600) the first time."""
    path = Path(home) / SECRET_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        atomic_write(path, key.hex().encode(), mode=0o600)
        return key
    except ValueError:
        raise CouchError(500, "server_error", f"{path} is not a session secret (hex); remove it to make a new one") from None


class CouchAuth:
    """The users, sessions and access checks of a ``CouchServer``."""

    def __init__(self, ds: Any, secure: bool):
        self.ds, self.secure = ds, secure
        self.secret = load_secret(ds.home)
        self._users: dict[str, UserFile] = {}
        self._verified: dict[tuple, tuple[Any, float, Any]] = {}

    def table(self, db: DocDB) -> Any:
        uf = self._users.get(db.db_id)
        if uf is None:
            uf = self._users[db.db_id] = UserFile(db.path)
        return uf.current()

    def credentials(self, request: web.Request) -> Cred | None:
        """Basic credentials, else a valid session cookie's, else None (an expired cookie: anonymous)."""
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            try:
                name, _, secret = base64.b64decode(header[6:].strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise CouchError(400, "bad_request", "Malformed Authorization header") from None
            return Cred(name, secret)
        cookie = request.cookies.get(couch_session.COOKIE_NAME)
        if cookie:
            s = couch_session.verify(self.secret, cookie, time.time())
            if s is not None:
                return Cred(s.name, session=s)
        return None

    async def _verify(self, table: Any, name: str, password: str) -> Any:
        """The user of ``table`` named ``name`` if ``password`` is right (cached a while: Argon2)."""
        key = (id(table), name, hashlib.sha256(password.encode()).digest())
        hit = self._verified.get(key)
        if hit is not None and hit[2] is table and hit[1] > time.monotonic():
            return hit[0]
        user = await asyncio.to_thread(table.verify, name, password)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[key] = (user, time.monotonic() + AUTH_CACHE_S, table)
        return user

    async def user_in(self, table: Any, cred: Cred) -> Any:
        """The user of ``table`` that ``cred`` proves, or None."""
        if cred.session is None:
            return await self._verify(table, cred.name, cred.password or "")
        u = table.get(cred.name)
        ok = u is not None and couch_session.user_tag(u.name, u.role, u.secret) in cred.session.tags
        return u if ok else None

    async def access(self, db: DocDB, cred: Cred | None) -> str:
        """``none``, ``reader``, ``writer``; ``anonymous`` or ``badauth`` where the database has users."""
        table = self.table(db)
        if not len(table):
            return db.acl().get("*", "none")
        if cred is None:
            return "anonymous"
        user = await self.user_in(table, cred)
        if user is None:
            return "badauth" if cred.session is None else "anonymous"
        a = db.access(user.name)
        return "reader" if a == "writer" and user.role == "read-only" else a

    async def check(self, db: DocDB, cred: Cred | None, need: str) -> None:
        """CouchError unless ``cred`` has ``need`` (``reader``, ``writer``) on ``db``."""
        a = await self.access(db, cred)
        if a == "anonymous":
            raise CouchError(401, "unauthorized", "You are not authorized to access this db.")
        if a == "badauth":
            raise CouchError(401, "unauthorized", "Name or password is incorrect.")
        if a == "none":
            raise CouchError(403, "forbidden", "You are not allowed to access this db.")
        if need == "writer" and a != "writer":
            raise CouchError(403, "forbidden", "You are not allowed to write to this db (the ACL makes you a reader).")

    async def check_admin(self, db: DocDB, cred: Cred | None) -> None:
        """CouchError 403 unless ``cred`` is an ``admin`` user of ``db`` (a database without users: anyone
        ``check`` let write)."""
        table = self.table(db)
        if len(table) and (cred is None or getattr(await self.user_in(table, cred), "role", None) != "admin"):
            raise CouchError(403, "forbidden", "You are not a db or server admin (an admin user of this database).")

    async def who(self, cred: Cred | None) -> Any:
        """The user ``cred`` names in some served database's users (its first), or None."""
        if cred is None:
            return None
        for db in list(self.ds.dbs.values()):
            table = self.table(db)
            if len(table) and (user := await self.user_in(table, cred)) is not None:
                return user
        return None

    # -- /_session --------------------------------------------------------------------------------
    async def session(self, request: web.Request, cred: Cred | None) -> web.Response:
        m = request.method
        if m == "POST":
            return await self._login(request)
        if m == "DELETE":
            return json_response({"ok": True}, headers={"Set-Cookie": couch_session.set_cookie("", secure=self.secure)})
        if m not in ("GET", "HEAD"):
            raise CouchError(405, "method_not_allowed", "Only DELETE,GET,HEAD,POST allowed")
        user = await self.who(cred)
        if user is None and cred is not None and cred.session is None:  # basic credentials that prove no one
            raise CouchError(401, "unauthorized", "Name or password is incorrect.")
        how = None if user is None else ("cookie" if cred.session is not None else "default")
        return json_response({"ok": True, "userCtx": {"name": user.name if user else None, "roles": _roles(user)},
                              "info": {"authentication_handlers": ["cookie", "default"], "authenticated": how}})

    async def _login(self, request: web.Request) -> web.Response:
        name, password = await _login_form(request)
        tags, first = [], None
        for db in list(self.ds.dbs.values()):  # every database with users, whether it has the name or not:
            table = self.table(db)               # the time taken must not tell which users exist
            if len(table) and (u := await self._verify(table, name, password)):
                tags.append(couch_session.user_tag(u.name, u.role, u.secret))
                first = first or u
        if first is None:
            raise CouchError(401, "unauthorized", "Name or password is incorrect.")
        cookie = couch_session.sign(self.secret, name, tags, time.time(), SESSION_TIMEOUT_S)
        return json_response({"ok": True, "name": name, "roles": _roles(first)},
                             headers={"Set-Cookie": couch_session.set_cookie(cookie, SESSION_TIMEOUT_S, secure=self.secure)})

    def renew(self, cred: Cred | None, resp: web.StreamResponse) -> None:
        """Give a fresh cookie with an answer to a request whose session is past half its life."""
        s = cred.session if cred is not None else None
        if s is None or resp.prepared or not s.refresh_due(time.time(), SESSION_TIMEOUT_S):
            return
        cookie = couch_session.sign(self.secret, s.name, s.tags, time.time(), SESSION_TIMEOUT_S)
        resp.headers["Set-Cookie"] = couch_session.set_cookie(cookie, SESSION_TIMEOUT_S, secure=self.secure)


def _roles(user: Any) -> list[str]:
    return ["_admin"] if user is not None and user.role == "admin" else []


async def _login_form(request: web.Request) -> tuple[str, str]:
    """``name`` and ``password`` of a login: a form (what browsers and PouchDB's plugins send) or JSON."""
    if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        name, password = form.get("name"), form.get("password")
    else:
        body = await read_body(request)
        body = body if isinstance(body, dict) else {}
        name, password = body.get("name"), body.get("password")
    if not isinstance(name, str) or not name or not isinstance(password, str):
        raise CouchError(400, "bad_request", "POST /_session takes a name and a password (a form, or JSON "
                         "{\"name\": ..., \"password\": ...})")
    return name, password


__all__ = ["CouchAuth", "Cred", "load_secret"]
