"""Cookie sessions on the CouchDB endpoints (issue 26): ``POST /_session`` (JSON or a form) answers an
``AuthSession`` cookie, a request with it acts as that user (its database's ACL decides), ``GET
/_session`` names the user, ``DELETE /_session`` ends the cookie; a wrong password, a forged or
malformed cookie, a cookie of a user whose password changed since are refused with CouchDB's errors.
Real PouchDB replicates with a cookie session (its ``fetch`` keeps the cookie, as a browser does);
aiohttp's client shows the rest over plain HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from multisite import documents
from multisite.instance.users import add_user
from multisite.multimaster import couch_session
from multisite.testing.pouchdb import Pouch, PouchUnavailable, node_modules

from .test_couch_http import serve


def _with_users(dc) -> object:
    a = dc.server("A", ["Profiles", "Open"], start=False)
    add_user(a.path("Profiles"), "alice", "read-write", "alice-password")
    add_user(a.path("Profiles"), "bob", "read-only", "bob-password")
    add_user(a.path("Profiles"), "root", "admin", "root-password")
    d = documents.open(a.path("Profiles"))
    d.set_access("*", "none")
    d.set_access("alice", "writer")
    d.set_access("bob", "reader")
    d.close()
    return serve(dc, titles=("Profiles", "Open"))


async def _session_flow(base: str, path) -> None:
    jar = aiohttp.CookieJar(unsafe=True)  # 127.0.0.1: an IP host
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async def call(method, url, **kw):
            async with http.request(method, base + url, **kw) as r:
                return r.status, await r.json(), r.headers.getall("Set-Cookie", [])
        assert (await call("GET", "/profiles"))[0] == 401
        st, body, _ = await call("POST", "/_session", json={"name": "alice", "password": "wrong-password"})
        assert (st, body) == (401, {"error": "unauthorized", "reason": "Name or password is incorrect."})
        st, body, _ = await call("POST", "/_session", json={"name": "alice"})
        assert st == 400 and "name and a password" in body["reason"]
        st, body, cookies = await call("POST", "/_session", data={"name": "alice", "password": "alice-password"})
        assert (st, body) == (200, {"ok": True, "name": "alice", "roles": []})
        assert cookies[0].startswith("AuthSession=") and "HttpOnly" in cookies[0] and "Max-Age=600" in cookies[0]
        st, body, _ = await call("GET", "/_session")
        assert body["userCtx"] == {"name": "alice", "roles": []} and body["info"]["authenticated"] == "cookie"
        assert (await call("PUT", "/profiles/doc1", json={"v": 1}))[0] == 201  # a writer by its ACL entry
        assert (await call("GET", "/profiles/doc1"))[1]["v"] == 1
        assert (await call("GET", "/_all_dbs"))[1] == ["open", "profiles"]
        st, body, cookies = await call("DELETE", "/_session")
        assert st == 200 and cookies[0].startswith("AuthSession=;") and "Max-Age=0" in cookies[0]
        assert (await call("GET", "/profiles"))[0] == 401  # the cookie is gone
        assert (await call("POST", "/_session", json={"name": "bob", "password": "bob-password"}))[0] == 200
        st, body, _ = await call("PUT", "/profiles/doc2", json={"v": 2})
        assert st == 403 and body["error"] == "forbidden"  # a reader
        add_user(path, "bob", "read-only", "bob-new-password", replace=True)  # a changed password ends it
        assert (await call("GET", "/profiles"))[0] == 401
    async with aiohttp.ClientSession() as raw:  # forged and malformed cookies
        async def with_cookie(value):
            async with raw.get(base + "/profiles", headers={"Cookie": f"AuthSession={value}"}) as r:
                return r.status, await r.json()
        forged = couch_session.sign(b"not the server's secret!", "alice", ["x"], __import__("time").time())
        assert (await with_cookie(forged))[0] == 401
        st, body = await with_cookie("%%%garbage")
        assert (st, body["error"]) == (400, "bad_request") and "Malformed AuthSession cookie" in body["reason"]


def test_cookie_sessions_over_http(dc):
    a = _with_users(dc)
    asyncio.run(_session_flow(a.url, a.path("Profiles")))
    assert (a.home / "couch_session.secret").stat().st_mode & 0o777 == 0o600


def test_a_cookie_outlives_a_restart_of_the_server(dc):
    a = _with_users(dc)

    async def login() -> str:
        async with aiohttp.ClientSession() as http:
            async with http.post(a.url + "/_session", json={"name": "alice", "password": "alice-password"}) as r:
                return r.cookies["AuthSession"].value

    cookie = asyncio.run(login())
    dc.stop(a)
    dc.start(a)

    async def get() -> int:
        async with aiohttp.ClientSession() as http:
            async with http.get(a.url + "/profiles", headers={"Cookie": f"AuthSession={cookie}"}) as r:
                return r.status

    assert asyncio.run(get()) == 200


def test_pouchdb_replicates_with_a_cookie_session(dc, tmp_path):
    try:
        node_modules()
    except PouchUnavailable as e:
        pytest.skip(f"PouchDB cannot be installed: {e}")
    a = _with_users(dc)
    with Pouch(tmp_path / "pouch") as pouch:
        pouch("open", name="p1")
        pouch("put", name="p1", doc={"_id": "made-in-pouch", "v": 1})
        bad = pouch("login", session="s", url=a.url + "/_session", name="alice", password="nope")
        assert bad["status"] == 401 and bad["cookie"] is None
        with pytest.raises(RuntimeError, match="unauthorized|not authorized"):
            pouch("replicate", name="p1", url=a.url + "/profiles", direction="to", session="s")
        ok = pouch("login", session="s", url=a.url + "/_session", name="alice", password="alice-password")
        assert ok["status"] == 200 and ok["cookie"].startswith("AuthSession=")
        assert pouch("session_get", session="s", url=a.url + "/_session")["body"]["userCtx"]["name"] == "alice"
        up = pouch("replicate", name="p1", url=a.url + "/profiles", direction="to", session="s")
        assert up["ok"] and up["docs_written"] == 1
        documents.connect(a.home, db="Profiles").create("Person", {"name": "from the server"})
        pouch("open", name="p2")
        down = pouch("replicate", name="p2", url=a.url + "/profiles", direction="from", session="s")
        assert down["ok"] and down["docs_written"] == 2


def test_login_takes_as_long_for_a_name_no_database_has_so_it_does_not_tell_which_users_exist(dc):
    # a wrong password costs an Argon2 verification (~30 ms); an unknown name must cost one too
    # (UserTable.verify hashes against a dummy for it), else POST /_session's time names the users
    import statistics
    import time

    a = _with_users(dc)

    async def timings() -> tuple[list[float], list[float]]:
        out: dict[str, list[float]] = {"alice": [], "nobody-here": []}
        async with aiohttp.ClientSession() as http:
            for k in range(7):
                for name in out:  # a new password each time: no cached verification
                    t = time.perf_counter()
                    async with http.post(a.url + "/_session", json={"name": name, "password": f"wrong-{k}"}) as r:
                        assert r.status == 401 and (await r.json())["reason"] == "Name or password is incorrect."
                    out[name].append(time.perf_counter() - t)
        return out["alice"], out["nobody-here"]

    known, unknown = asyncio.run(timings())
    assert statistics.median(unknown) > 0.5 * statistics.median(known), (known, unknown)


def test_a_removed_users_cookie_is_anonymous_there(dc):
    a = _with_users(dc)

    async def flow() -> None:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.post(a.url + "/_session", json={"name": "alice", "password": "alice-password"}) as r:
                assert r.status == 200
            async with http.get(a.url + "/profiles") as r:
                assert r.status == 200
            from multisite.instance.users import remove_user
            remove_user(a.path("Profiles"), "alice")
            async with http.get(a.url + "/profiles") as r:
                assert r.status == 401
            async with http.get(a.url + "/_session") as r:
                assert (await r.json())["userCtx"]["name"] is None

    asyncio.run(flow())


def test_get_session_with_a_wrong_basic_password_is_401_as_couchdbs(dc):
    # CouchDB checks basic credentials on /_session too: a wrong password is not an anonymous answer
    from .test_couch_http import http

    a = _with_users(dc)
    assert http("GET", a.url + "/_session", auth=("alice", "wrong-password")) == (
        401, {"error": "unauthorized", "reason": "Name or password is incorrect."})
    assert http("GET", a.url + "/_session", auth=("nobody-here", "x"))[0] == 401
    st, body = http("GET", a.url + "/_session", auth=("alice", "alice-password"))
    assert st == 200 and body["userCtx"] == {"name": "alice", "roles": []}
    assert body["info"]["authenticated"] == "default"
    st, body = http("GET", a.url + "/_session")  # no credentials: anonymous, as CouchDB's
    assert st == 200 and body["userCtx"]["name"] is None
