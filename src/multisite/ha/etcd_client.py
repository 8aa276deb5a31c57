"""An etcd v3 client for asyncio processes: keys, leases, transactions, watches and each member's health.

Why: the HA managers and the grid catalogs coordinate through etcd; their decisions are sans-IO, their
processes asyncio. etcd3gw (``docs/decisions.md``) speaks etcd's v3 JSON gateway with blocking
``requests`` calls, so each call here runs in a thread; what comes back is turned into ``KeyValue``s (the
gateway sends keys and values in base64 and revisions as strings). The threads are the client's own
(``ETCD_THREADS``), not the event loop's default executor: a grid container's fsyncs and journal reads
run there, and coordination must not wait behind a slow disk. Every call has a deadline
(``call_deadline_s``: each member's timeouts and a margin), so no await on etcd can last for ever.

Which member: the one that answered last, then each other one in turn. A read, a put, a delete, a
keepalive or a revoke goes to the next member after any transport failure: doing it twice changes
nothing. A transaction or a lease grant goes to the next member only when the failure shows the request
was never carried out (connection refused, connect timeout, "no leader"); after a read timeout its
outcome is unknown and ``CoordinatorUnavailable`` says so (read the key back before deciding). When no
member answers, ``CoordinatorUnavailable`` names every URL. A member that answers with an error (a
malformed request) raises ``CoordinatorError`` naming that member; revoking a lease that already ended is no
error.

Watches (``watch_prefix``) are one streaming request each, read by a thread of its own, sent with
``Grpc-Metadata-hasleader: true``: etcd then ends the stream when that member loses its leader, so a
member cut off from the others does not keep a watch silently. A stream that ends raises
``CoordinatorUnavailable`` carrying the last revision seen: read again, and watch from the next one. A
*paused* member (SIGSTOP) sends nothing at all: opening a watch on one times out like any call (the
next member is tried), but a watch opened before the pause stays silent: a caller that must notice pairs
the watch with its own lease keepalives or reads of its own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from ..errors import ConfigError, CoordinatorError, CoordinatorUnavailable

ETCD_CALL_TIMEOUT_S = 1.0  # one HTTP call to one member (connect, then each read)
ETCD_THREADS = 8  # a client's calls in flight at once (a container: its mirror, report, a currency report per primary)
HEALTH_KEY = "health"  # what health() reads linearizably, as etcd's own /health does


# -- values --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it; ``create_revision`` and ``mod_revision`` are what transactions compare."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class PrefixRead:
    """The keys under a prefix and the store's revision they were read at (watch from ``revision + 1``)."""

    kvs: list[KeyValue]
    revision: int


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``target`` (CREATE, MOD, VERSION, VALUE) of ``key`` ``result`` ``value``."""

    key: str
    target: str
    value: int | bytes
    result: str = "EQUAL"  # EQUAL, NOT_EQUAL, GREATER, LESS


@dataclass(frozen=True)
class Put:
    """A put inside a transaction (``lease`` 0: none)."""

    key: str
    value: str | bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    """A delete inside a transaction: one key, or every key under it when ``prefix``."""

    key: str
    prefix: bool = False


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held (the success ops ran) and the store's revision after the transaction."""

    succeeded: bool
    revision: int


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id and the TTL etcd gave it (etcd may raise a TTL below its minimum)."""

    id: int
    ttl_s: int


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix: ``kind`` is "put" or "delete" (a delete's value is empty)."""

    kind: str
    kv: KeyValue


@dataclass(frozen=True)
class MemberHealth:
    """One member as ``health()`` found it: ``healthy`` when it served a linearizable read in time."""

    url: str
    healthy: bool
    member_id: int = 0
    leader_id: int = 0
    raft_term: int = 0
    error: str = ""


def absent(key: str) -> Compare:
    """The key does not exist (its create revision is 0): the condition of "create if absent"."""
    return Compare(key, "CREATE", 0)


def created_at(key: str, revision: int) -> Compare:
    """The key is the one created at ``revision`` (not deleted and created again since)."""
    return Compare(key, "CREATE", revision)


def modified_at(key: str, revision: int) -> Compare:
    """The key was last written at ``revision``: nobody wrote it since it was read."""
    return Compare(key, "MOD", revision)


def value_is(key: str, value: str | bytes) -> Compare:
    """The key holds exactly ``value``."""
    return Compare(key, "VALUE", _bytes(value))


# -- encoding for the JSON gateway ----------------------------------------------------------------------
def _bytes(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def _b64(s: str | bytes) -> str:
    return base64.b64encode(_bytes(s)).decode()


def _prefix_end(prefix: str | bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (etcd's range_end for a prefix)."""
    b = bytearray(_bytes(prefix))
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"  # every key
    b[-1] += 1
    return bytes(b)


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(d["key"]).decode(), base64.b64decode(d.get("value", "")),
                    int(d.get("create_revision", 0)), int(d.get("mod_revision", 0)),
                    int(d.get("version", 0)), int(d.get("lease", 0)))


def _revision(res: dict[str, Any]) -> int:
    return int(res.get("header", {}).get("revision", 0))


def _compare_json(c: Compare) -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version", "VALUE": "value"}[c.target]
    value = _b64(c.value) if c.target == "VALUE" else int(c.value)
    return {"key": _b64(c.key), "target": c.target, "result": c.result, field: value}


def _op_json(op: Put | Delete) -> dict[str, Any]:
    if isinstance(op, Put):
        return {"request_put": {"key": _b64(op.key), "value": _b64(op.value), "lease": op.lease}}
    body = {"key": _b64(op.key)}
    if op.prefix:
        body["range_end"] = base64.b64encode(_prefix_end(op.key)).decode()
    return {"request_delete_range": body}


def parse_urls(urls: str | Iterable[str]) -> list[str]:
    """``http://H:P[,http://H:P...]`` (or a list of them) as a list, each checked: ConfigError if malformed."""
    items = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not items:
        raise ConfigError("etcd: give at least one URL (http://HOST:PORT[,http://HOST:PORT...])")
    for u in items:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ConfigError(f"etcd: expected http://HOST:PORT, got {u!r}")
    return items


# -- failures ------------------------------------------------------------------------------------------
def _never_carried_out(e: Exception) -> bool:
    """True when a failed request surely did nothing: it never connected, or etcd had no leader."""
    text = f"{e} {getattr(e, 'detail_text', '') or ''}".lower()
    return any(s in text for s in ("connection refused", "connecttimeout", "connect timeout",
                                   "newconnectionerror", "no leader", "failed to establish"))


def _transport_errors() -> tuple[type[Exception], ...]:
    import requests
    from etcd3gw import exceptions as ex

    return (requests.RequestException, ex.ConnectionFailedError, ex.ConnectionTimeoutError,
            ex.InternalServerError)


_REASONS = (("read timed out", "no answer in time"), ("connection refused", "connection refused"),
            ("connecttimeout", "connect timeout"), ("connect timeout", "connect timeout"),
            ("remotedisconnected", "connection closed"), ("connection aborted", "connection closed"))


def _summary(e: Exception) -> str:
    """A failure in a few words: what requests says at length, or what etcd answered."""
    detail = f"{getattr(e, 'detail_text', '') or ''} {e}".strip()
    low = detail.lower()
    for needle, reason in _REASONS:
        if needle in low:
            return reason
    return f"{type(e).__name__}: {detail[:160]}" if detail else type(e).__name__


class EtcdClient:
    """A handle on one etcd cluster through any of its members (see the module docstring)."""

    def __init__(self, urls: str | Iterable[str], timeout_s: float = ETCD_CALL_TIMEOUT_S):
        import etcd3gw

        self.urls = parse_urls(urls)
        self.timeout_s = timeout_s
        self._clients = [etcd3gw.client(host=p.hostname, port=p.port, protocol=p.scheme, timeout=timeout_s,
                                        api_path="/v3/")
                         for p in map(urlsplit, self.urls)]
        self._current = 0
        self._threads = ThreadPoolExecutor(max_workers=ETCD_THREADS, thread_name_prefix="etcd")
        # health() has threads of its own: a catalog asked its status in a loop (the members' health in
        # each answer) must not hold up its own coordination calls
        self._health_threads = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="etcd-health")

    @property
    def call_deadline_s(self) -> float:
        """The longest one call may take: every member's connect and read timeouts, and a margin."""
        return len(self.urls) * 2 * self.timeout_s + 1.0

    @property
    def current_url(self) -> str:
        """The member the next call tries first: the one that answered last."""
        return self.urls[self._current]

    # -- calling a member ------------------------------------------------------------------------------
    def _call(self, fn: Callable[[Any], Any], idempotent: bool = True) -> Any:
        """``fn(client)`` on the member that answered last, then on each other one (module docstring)."""
        from etcd3gw import exceptions as ex

        errors: list[str] = []
        for i in range(len(self._clients)):
            k = (self._current + i) % len(self._clients)
            try:
                out = fn(self._clients[k])
            except _transport_errors() as e:
                errors.append(f"{self.urls[k]}: {_summary(e)}")
                if idempotent or _never_carried_out(e):
                    continue
                raise CoordinatorUnavailable(
                    f"etcd at {self.urls[k]} did not answer a write ({_summary(e)}); its outcome is unknown: read "
                    f"the keys back (members: {','.join(self.urls)})", urls=self.urls) from None
            except ex.Etcd3Exception as e:
                raise CoordinatorError(f"etcd at {self.urls[k]} refused the request: {_summary(e)}",
                                       url=self.urls[k]) from None
            self._current = k
            return out
        raise CoordinatorUnavailable(f"no etcd member answered ({'; '.join(errors)}): check that etcd runs at "
                                     f"{','.join(self.urls)} and that a majority of its members are up",
                                     urls=self.urls)

    async def _run(self, fn: Callable[[Any], Any], idempotent: bool = True) -> Any:
        return await self._in_thread(self._call, fn, idempotent)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, pool: ThreadPoolExecutor | None = None) -> Any:
        """``fn(*args)`` in the client's threads, within ``call_deadline_s`` (CoordinatorUnavailable past it:
        a write's outcome is then unknown; the thread is left to end by itself)."""
        fut = asyncio.get_running_loop().run_in_executor(pool or self._threads, fn, *args)
        done, _ = await asyncio.wait({fut}, timeout=self.call_deadline_s)
        if not done:
            fut.cancel()
            raise CoordinatorUnavailable(f"etcd did not answer within {self.call_deadline_s:g} s (members "
                                         f"{','.join(self.urls)}); a write's outcome is unknown: read the keys back",
                                         urls=self.urls)
        return fut.result()

    async def _post(self, path: str, body: dict[str, Any], idempotent: bool = True) -> dict[str, Any]:
        """One gateway call (``/kv/range``, ``/kv/txn``...) through etcd3gw's session and error mapping."""
        return await self._run(lambda c: c.post(c.get_url(path), json=body), idempotent)

    # -- keys ------------------------------------------------------------------------------------------
    async def get(self, key: str, serializable: bool = False) -> KeyValue | None:
        """The key, or None. Linearizable unless ``serializable`` (then any member's possibly stale copy)."""
        res = await self._post("/kv/range", {"key": _b64(key), "serializable": serializable})
        kvs = res.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def read_prefix(self, prefix: str, serializable: bool = False) -> PrefixRead:
        """Every key under ``prefix`` in key order, with the revision they were read at."""
        res = await self._post("/kv/range", {"key": _b64(prefix), "serializable": serializable,
                                             "range_end": base64.b64encode(_prefix_end(prefix)).decode()})
        return PrefixRead([_kv(d) for d in res.get("kvs") or []], _revision(res))

    async def get_prefix(self, prefix: str, serializable: bool = False) -> list[KeyValue]:
        """Every key under ``prefix`` in key order."""
        return (await self.read_prefix(prefix, serializable)).kvs

    async def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Write the key (under ``lease`` unless 0); the store's revision after it."""
        res = await self._post("/kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})
        return _revision(res)

    async def delete(self, key: str, prefix: bool = False) -> int:
        """Delete the key (every key under it when ``prefix``); how many were deleted."""
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = base64.b64encode(_prefix_end(key)).decode()
        res = await self._post("/kv/deleterange", body)
        return int(res.get("deleted", 0))

    # -- transactions ----------------------------------------------------------------------------------
    async def txn(self, compare: Iterable[Compare], success: Iterable[Put | Delete],
                  failure: Iterable[Put | Delete] = ()) -> TxnResult:
        """If every compare holds, the success ops, else the failure ops: one atomic step in etcd."""
        body = {"compare": [_compare_json(c) for c in compare], "success": [_op_json(o) for o in success],
                "failure": [_op_json(o) for o in failure]}
        res = await self._post("/kv/txn", body, idempotent=False)
        return TxnResult(bool(res.get("succeeded", False)), _revision(res))

    async def put_if_absent(self, key: str, value: str | bytes, lease: int = 0) -> TxnResult:
        """Create the key unless it exists (the usual way to take a leader key or a lock)."""
        return await self.txn([absent(key)], [Put(key, value, lease)])

    async def put_if_revision(self, key: str, value: str | bytes, mod_revision: int, lease: int = 0) -> TxnResult:
        """Write the key only if nobody wrote it since ``mod_revision`` (compare-and-swap)."""
        return await self.txn([modified_at(key, mod_revision)], [Put(key, value, lease)])

    async def delete_if_revision(self, key: str, mod_revision: int) -> TxnResult:
        """Delete the key only if nobody wrote it since ``mod_revision``."""
        return await self.txn([modified_at(key, mod_revision)], [Delete(key)])

    # -- leases ----------------------------------------------------------------------------------------
    async def lease_grant(self, ttl_s: float) -> Lease:
        """A new lease of ``ttl_s`` seconds (rounded up to whole seconds, at least 1)."""
        ttl = max(1, int(-(-ttl_s // 1)))
        res = await self._post("/lease/grant", {"TTL": ttl}, idempotent=False)
        return Lease(int(res["ID"]), int(res.get("TTL", ttl)))

    async def lease_keepalive_once(self, lease: int) -> int:
        """Renew the lease once; the TTL it has again, or 0 when it already ended."""
        res = await self._post("/lease/keepalive", {"ID": lease})
        return max(0, int(res.get("result", {}).get("TTL", 0)))

    async def lease_revoke(self, lease: int) -> None:
        """End the lease now (its keys go with it); a lease that already ended is no error."""
        try:
            await self._post("/kv/lease/revoke", {"ID": lease})
        except CoordinatorError as e:
            if "not found" not in e.message.lower():
                raise

    # -- watches and health ----------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int = 0) -> "Watch":
        """The changes under ``prefix`` from ``start_revision`` (0: from now), as an async iterator.

            read = await client.read_prefix("p/")
            async with client.watch_prefix("p/", read.revision + 1) as events:
                async for ev in events: ...
        """
        return Watch(self, prefix, start_revision)

    async def health(self) -> list[MemberHealth]:
        """Each member, asked on its own and at once: its status and whether it serves a linearizable read."""
        return list(await asyncio.gather(*(self._health_of(i) for i in range(len(self.urls)))))

    async def _health_of(self, i: int) -> MemberHealth:
        try:
            return await self._in_thread(self._member_health, i, pool=self._health_threads)
        except CoordinatorUnavailable:
            return MemberHealth(self.urls[i], False, error="no answer in time")

    def _member_health(self, i: int) -> MemberHealth:
        c, url = self._clients[i], self.urls[i]
        try:
            st = c.status()
        except Exception as e:  # noqa: BLE001 - any failure is this member's health
            return MemberHealth(url, False, error=_summary(e))
        ids = dict(member_id=int(st.get("header", {}).get("member_id", 0)), leader_id=int(st.get("leader", 0)),
                   raft_term=int(st.get("raftTerm", 0)))
        try:
            c.post(c.get_url("/kv/range"), json={"key": _b64(HEALTH_KEY), "count_only": True})
        except Exception as e:  # noqa: BLE001
            return MemberHealth(url, False, **ids, error=_summary(e))
        return MemberHealth(url, True, **ids)


class Watch:
    """One watch stream (``EtcdClient.watch_prefix``): an async iterator of ``WatchEvent``s.

    ``async with`` (or the first ``__anext__``) opens the stream on the first member that accepts it
    and waits until etcd confirmed it: a change made after that is seen. ``close()`` ends it.
    """

    def __init__(self, client: EtcdClient, prefix: str, start_revision: int = 0):
        self._client, self.prefix, self.start_revision = client, prefix, start_revision
        self.last_revision = start_revision - 1 if start_revision else 0  # of the events handed out
        self._seen_revision = self.last_revision  # of the events the thread read (ahead of the queue)
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self.url: str | None = None

    async def __aenter__(self) -> "Watch":
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> WatchEvent:
        if self._queue is None:
            await self._open()
        kind, item = await self._queue.get()
        if kind == "event":
            self.last_revision = max(self.last_revision, item.kv.mod_revision)
            return item
        if kind == "closed":
            raise StopAsyncIteration
        raise item

    async def _open(self) -> None:
        """Start the reading thread and wait for etcd's "created" (or the error of every member)."""
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        created = loop.create_future()

        def deliver(kind: str, item: Any) -> None:
            def put() -> None:
                if kind == "created":
                    if not created.done():
                        created.set_result(item)
                    return
                if not created.done():
                    created.set_exception(item if isinstance(item, Exception) else RuntimeError(kind))
                else:
                    self._queue.put_nowait((kind, item))
            try:
                loop.call_soon_threadsafe(put)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                self._stop.set()

        threading.Thread(target=self._read, args=(deliver,), name=f"etcd-watch {self.prefix}", daemon=True).start()
        # Each member has its deadline in the thread; this one is the whole opening's, should a member
        # hold the thread past them (it is left to end by itself; what it reads then is dropped). Not
        # asyncio.wait_for: it swallows a cancel that lands as "created" arrives (Python 3.11), and the
        # task that opened the watch then goes on after its cancel.
        try:
            done, _ = await asyncio.wait({created}, timeout=len(self._client.urls) * 2 * self._client.timeout_s + 1)
        except BaseException:
            self.close()
            raise
        if not done:
            self.close()
            raise CoordinatorUnavailable(f"no etcd member opened a watch on {self.prefix!r} in time: check that etcd "
                                         f"runs at {','.join(self._client.urls)}", urls=self._client.urls)
        self.url = created.result()

    def close(self) -> None:
        """End the stream (the reading thread ends with it); the iterator then stops."""
        self._stop.set()
        resp, self._response = self._response, None
        if resp is not None:
            _shutdown(resp)
        if self._queue is not None:
            self._queue.put_nowait(("closed", None))

    # -- the reading thread ----------------------------------------------------------------------------
    def _read(self, deliver: Callable[[str, Any], None]) -> None:
        """Open the stream on a member, then hand every event to the loop; any end is reported."""
        c = self._client
        errors: list[str] = []
        for i in range(len(c.urls)):
            k = (c._current + i) % len(c.urls)
            if self._stop.is_set():
                return
            try:
                resp = self._request(c._clients[k])
                self._response = resp
                lines = _lines(resp)
                created_at_revision = _check_created(next(lines))
            except Exception as e:  # noqa: BLE001 - this member cannot watch: try the next one
                errors.append(f"{c.urls[k]}: {_summary(e)}")
                continue
            if self._stop.is_set():  # the caller gave up meanwhile
                _shutdown(resp)
                return
            _no_read_timeout(resp)  # opened: from now on a quiet stream is a quiet grid, not a failure
            if not self.start_revision:  # from now: nothing up to the revision it was created at is due
                self._seen_revision = created_at_revision
            deliver("created", c.urls[k])
            self._stream(lines, c.urls[k], deliver)
            return
        deliver("error", CoordinatorUnavailable(
            f"no etcd member accepted a watch on {self.prefix!r} ({'; '.join(errors)}): check that etcd runs at "
            f"{','.join(c.urls)}", urls=c.urls))

    def _request(self, client: Any) -> Any:
        import requests

        body = {"create_request": {"key": _b64(self.prefix), "start_revision": self.start_revision,
                                   "range_end": base64.b64encode(_prefix_end(self.prefix)).decode()}}
        # the read timeout bounds the wait for the answer and its "created" (a paused member accepts the
        # connection and says nothing); it is lifted once the watch is open
        resp = client.session.post(client.get_url("/watch"), json=body, stream=True,
                                   timeout=(self._client.timeout_s, self._client.timeout_s),
                                   headers={"Grpc-Metadata-hasleader": "true"})
        if resp.status_code != 200:
            resp.close()
            raise requests.HTTPError(f"HTTP {resp.status_code}: {resp.text[:120]}")
        return resp

    def _stream(self, lines: Any, url: str, deliver: Callable[[str, Any], None]) -> None:
        reason = "the stream ended"
        try:
            for msg in lines:
                reason = _stream_error(msg)
                if reason:
                    break
                for ev in msg.get("result", {}).get("events") or []:
                    kv = _kv(ev["kv"])
                    self._seen_revision = max(self._seen_revision, kv.mod_revision)
                    deliver("event", WatchEvent("delete" if ev.get("type") == "DELETE" else "put", kv))
                reason = "the stream ended"
        except Exception as e:  # noqa: BLE001 - a lost connection ends the watch like any other end
            reason = _summary(e)
        if not self._stop.is_set():
            deliver("error", CoordinatorUnavailable(
                f"the watch on {self.prefix!r} at {url} ended ({reason}): read again and watch from revision "
                f"{self._seen_revision + 1}", url=url, next_revision=self._seen_revision + 1))


def _lines(resp: Any) -> Any:
    """The stream's JSON messages (the gateway ends each with a newline)."""
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def _check_created(msg: dict[str, Any]) -> int:
    """The revision a new watch starts after; CoordinatorError if etcd did not create it."""
    err = _stream_error(msg)
    if err or not msg.get("result", {}).get("created"):
        raise CoordinatorError(f"etcd did not create the watch: {err or msg}")
    return _revision(msg["result"])


def _stream_error(msg: dict[str, Any]) -> str:
    """Why the stream ends ("" while it goes on): an error (no leader) or a cancel (compaction)."""
    if "error" in msg:
        return str(msg["error"].get("message", msg["error"]))
    result = msg.get("result", {})
    if result.get("canceled"):
        compacted = result.get("compact_revision")
        return f"canceled: {result.get('cancel_reason') or ''}" + (f" compacted at {compacted}" if compacted else "")
    return ""


def _no_read_timeout(resp: Any) -> None:
    """Let an opened watch stream wait for its next event as long as the grid stays quiet."""
    sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(None)


def _shutdown(resp: Any) -> None:
    """Wake the thread blocked reading ``resp``: shut its socket down, then close the response."""
    try:
        s = socket.fromfd(resp.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM)
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    except (OSError, ValueError, AttributeError):
        pass
    resp.close()
