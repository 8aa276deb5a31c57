"""One cluster's keys in etcd, read as a ``decide.View`` and changed by leases and transactions.

Keys, under ``decide.cluster_prefix(cluster)``:

- ``group``: the LMS group, created once by the first member (a member of another group is refused);
- ``members/<name>``: a member's JSON record under the member's own lease (gone when it stops renewing);
- ``leader``: ``{"name", "term"}`` under the leader's lease of ``ttl_s``, created only by a
  transaction that finds it absent, so at most one member holds it;
- ``term``: the highest term ever taken, written in the same transaction (terms never go back);
- ``switchover``: the member a planned switchover hands the key to, under a lease of its own (a
  request nobody carries out expires).

etcd is reached through etcd3gw over its v3 JSON gateway (``docs/decisions.md``); its calls block, so
each runs in a thread. Several endpoints: a call that cannot reach one tries the next; when none
answers, ``CoordinatorUnavailable`` names them all. A member that answers with an error raises
``CoordinatorError``; revoking a lease that already expired is no error.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Callable
from urllib.parse import urlsplit

from etcd3gw.lease import Lease

from ..errors import ConfigError, CoordinatorError, CoordinatorUnavailable
from .decide import (GROUP_KEY, LEADER_KEY, MEMBERS_PREFIX, SWITCHOVER_KEY, Leader, Member, View,
                     cluster_prefix)

TERM_KEY = "term"
ETCD_TIMEOUT_S = 1.0  # one HTTP call to one etcd member


def parse_urls(urls: str | list[str]) -> list[str]:
    """``http://H:P[,http://H:P...]`` as a list, each checked."""
    items = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not items:
        raise ConfigError("--etcd: give at least one URL (http://HOST:PORT[,http://HOST:PORT...])")
    for u in items:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ConfigError(f"--etcd: expected http://HOST:PORT, got {u!r}")
    return items


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class Coordinator:
    """A member's handle on its cluster's keys (see the module docstring)."""

    def __init__(self, cluster: str, urls: str | list[str], name: str, ttl_s: float,
                 timeout_s: float = ETCD_TIMEOUT_S):
        import etcd3gw

        self.cluster, self.name, self.prefix = cluster, name, cluster_prefix(cluster)
        self.urls = parse_urls(urls)
        self.ttl_s = ttl_s
        self._clients = []
        for u in self.urls:
            p = urlsplit(u)
            self._clients.append(etcd3gw.client(host=p.hostname, port=p.port, protocol=p.scheme, timeout=timeout_s))
        self._current = 0
        self._member_lease: int | None = None  # lease ids: a Lease is bound to the client that answers
        self._leader_lease: int | None = None
        self.group: str | None = None

    # -- calls -------------------------------------------------------------------------------------
    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(client)`` on the endpoint that answered last, then on each other one."""
        import requests
        from etcd3gw import exceptions as ex

        errors = []
        n = len(self._clients)
        for i in range(n):
            k = (self._current + i) % n
            try:
                out = fn(self._clients[k])
            except (requests.RequestException, ex.ConnectionFailedError, ex.ConnectionTimeoutError,
                    ex.InternalServerError) as e:
                errors.append(f"{self.urls[k]}: {type(e).__name__}")
                continue
            except ex.Etcd3Exception as e:  # it answered, with an error: not for another member to retry
                raise CoordinatorError(f"etcd at {self.urls[k]} refused a request of cluster {self.cluster!r}: "
                                       f"{e.args[0] if e.args else ''} {(e.detail_text or '').strip()}") from None
            self._current = k
            return out
        raise CoordinatorUnavailable(f"no etcd member answered ({'; '.join(errors)}): check that etcd runs at "
                                     f"{','.join(self.urls)} and that a majority of its members are up")

    async def _run(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.to_thread(self._call, fn)

    async def _revoke(self, lease: int) -> None:
        """Revoke a lease; one that already expired (etcd answers Not Found) is as good as revoked."""
        from etcd3gw import exceptions as ex

        def revoke(c):
            try:
                Lease(lease, c).revoke()
            except ex.Etcd3Exception as e:
                if "not found" not in f"{e.args} {e.detail_text}".lower():
                    raise
        await self._run(revoke)

    # -- membership ------------------------------------------------------------------------------
    async def join(self, group: str) -> None:
        """Record the cluster's group (first member) or check it; ConfigError for another group's member."""
        key = self.prefix + GROUP_KEY
        await self._run(lambda c: c.create(key, group))
        (got, _meta), = await self._run(lambda c: c.get(key, metadata=True)) or [(b"", None)]
        if got.decode() != group:
            raise ConfigError(f"cluster {self.cluster!r} replicates LMS group {got.decode()!r}; this instance "
                              f"({self.name}) is of group {group!r}: give it another --cluster name")
        self.group = group

    async def publish(self, member: Member) -> None:
        """Write this member's record under its own lease (granted anew if it expired)."""
        def put(c):
            if self._member_lease is None or Lease(self._member_lease, c).refresh() <= 0:
                self._member_lease = c.lease(max(1, round(self.ttl_s))).id
            c.put(self.prefix + MEMBERS_PREFIX + member.name, json.dumps(member.__dict__),
                  lease=Lease(self._member_lease, c))
        await self._run(put)

    async def view(self) -> View:
        """The cluster as etcd has it now; ``reachable`` False when no member answers."""
        try:
            rows = await self._run(lambda c: c.get_prefix(self.prefix))
        except CoordinatorUnavailable:
            return View(False)
        leader, members, term, handover = None, [], 0, None
        for value, meta in rows:
            key = meta["key"].decode() if isinstance(meta["key"], bytes) else meta["key"]
            rest = key[len(self.prefix):]
            if rest == LEADER_KEY:
                d = json.loads(value)
                leader = Leader(d["name"], int(d["term"]), int(meta.get("mod_revision", 0)))
            elif rest == TERM_KEY:
                term = int(value)
            elif rest == SWITCHOVER_KEY:
                handover = value.decode()
            elif rest.startswith(MEMBERS_PREFIX):
                try:
                    d = json.loads(value)
                    d["links"] = tuple(tuple(x) for x in d.get("links", ()))
                    members.append(Member(**d))
                except (TypeError, ValueError):
                    continue  # a record of another version: not a candidate
        return View(True, leader, tuple(sorted(members)), term, handover)

    # -- the leader key --------------------------------------------------------------------------
    async def campaign(self, term: int, ttl_s: float) -> bool:
        """Take the leader key for ``term`` if nobody holds it (one transaction); True if taken."""
        def txn(c):
            lease = c.lease(max(1, round(ttl_s)))
            key = self.prefix + LEADER_KEY
            value = json.dumps({"name": self.name, "term": term})
            res = c.transaction({
                "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
                "success": [{"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease.id}},
                            {"request_put": {"key": _b64(self.prefix + TERM_KEY), "value": _b64(str(term))}}],
                "failure": []})
            if res.get("succeeded"):
                return lease.id
            lease.revoke()
            return None
        lease = await self._run(txn)
        self._leader_lease = lease
        return lease is not None

    async def renew(self) -> bool:
        """Keep the leader lease alive; False when it is gone (expired, revoked) or etcd is unreachable."""
        lease = self._leader_lease
        if lease is None:
            return False
        try:
            ttl = await self._run(lambda c: Lease(lease, c).refresh())
        except CoordinatorUnavailable:
            return False
        if ttl <= 0:
            self._leader_lease = None
            return False
        return True

    async def resign(self) -> None:
        """Give the leader key up (revoking the lease deletes it; a lease that already ended is fine)."""
        lease, self._leader_lease = self._leader_lease, None
        if lease is not None:
            await self._revoke(lease)

    async def request_switchover(self, to: str, ttl_s: float) -> None:
        """Ask the leader to hand the key to ``to`` (the request ends with its lease)."""
        def put(c):
            c.put(self.prefix + SWITCHOVER_KEY, to, lease=c.lease(max(1, round(ttl_s))))
        await self._run(put)

    async def clear_switchover(self) -> None:
        await self._run(lambda c: c.delete(self.prefix + SWITCHOVER_KEY))

    async def close(self) -> None:
        lease, self._member_lease = self._member_lease, None
        if lease is not None:
            try:
                await self._revoke(lease)
            except CoordinatorUnavailable:
                pass
