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

Watches (``watch_prefix``, ``etcd_watch``) are one streaming request each, read by a thread of its own, sent with
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from ..errors import ConfigError, CoordinatorError, CoordinatorUnavailable
from .etcd_values import (Compare, Delete, KeyValue, Lease, MemberHealth, PrefixRead, Put, TxnResult, _b64,
                          _compare_json, _kv, _op_json, _prefix_end, _revision, _summary, absent, modified_at)
from .etcd_watch import Watch

ETCD_CALL_TIMEOUT_S = 1.0  # one HTTP call to one member (connect, then each read)
ETCD_THREADS = 8  # a client's calls in flight at once (a container: its mirror, report, a currency report per primary)
HEALTH_KEY = "health"  # what health() reads linearizably, as etcd's own /health does


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
    def watch_prefix(self, prefix: str, start_revision: int = 0) -> Watch:
        """The changes under ``prefix`` from ``start_revision`` (0: from now), as an async iterator.

            read = await client.read_prefix("p/")
            async with client.watch_prefix("p/", read.revision + 1) as events:
                async for ev in events: ...
        """
        from .etcd_watch import (
            Watch,  # the watch's module builds on this one's values and helpers
        )

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
