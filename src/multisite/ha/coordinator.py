"""One cluster's keys in etcd, read as a ``decide.View`` and changed by leases and transactions.

Keys, under ``decide.cluster_prefix(cluster)``:

- ``group``: the LMS group, created once by the first member (a member of another group is refused);
- ``members/<name>``: a member's JSON record under the member's own lease (gone when it stops renewing);
- ``leader``: ``{"name", "term"}`` under the leader's lease of ``ttl_s``, created only by a
  transaction that finds it absent, so at most one member holds it;
- ``term``: the highest term ever taken, written in the same transaction (terms never go back);
- ``switchover``: the member a planned switchover hands the key to, under a lease of its own (a
  request nobody carries out expires).

etcd is reached through ``etcd_client.EtcdClient`` (any member, the next one when a member does not
answer; ``CoordinatorUnavailable`` naming them all when none does).
"""

from __future__ import annotations

import asyncio
import json
import time

from ..errors import ConfigError, CoordinatorUnavailable
from .decide import (GROUP_KEY, LEADER_KEY, MEMBERS_PREFIX, SWITCHOVER_KEY, Leader, Member, View,
                     cluster_prefix)
from .etcd_client import ETCD_CALL_TIMEOUT_S, EtcdClient, parse_urls
from .etcd_values import Put, absent, value_is

JOIN_TIMEOUT_S = 15.0  # etcd slow or electing when a manager starts: its join is retried this long
TERM_KEY = "term"

__all__ = ["Coordinator", "parse_urls", "TERM_KEY"]


class Coordinator:
    """A member's handle on its cluster's keys (see the module docstring)."""

    def __init__(self, cluster: str, urls: str | list[str], name: str, ttl_s: float,
                 timeout_s: float = ETCD_CALL_TIMEOUT_S):
        self.cluster, self.name, self.prefix = cluster, name, cluster_prefix(cluster)
        self.etcd = EtcdClient(urls, timeout_s)
        self.urls = self.etcd.urls
        self.ttl_s = ttl_s
        self._member_lease: int | None = None
        self._leader_lease: int | None = None
        self.group: str | None = None

    # -- membership ------------------------------------------------------------------------------
    async def join(self, group: str, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Record the cluster's group (first member) or check it; ConfigError for another group's member.
        An etcd that does not answer in time (loaded, electing) is asked again for up to ``timeout_s``:
        the put-if-absent changes nothing the second time, so an unknown outcome is safe to repeat, and
        a manager must not exit at start for a slow second."""
        key = self.prefix + GROUP_KEY
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.etcd.put_if_absent(key, group)
                kv = await self.etcd.get(key)
                break
            except CoordinatorUnavailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)
        got = kv.value.decode() if kv else ""
        if got != group:
            raise ConfigError(f"cluster {self.cluster!r} replicates LMS group {got!r}; this instance "
                              f"({self.name}) is of group {group!r}: give it another --cluster name")
        self.group = group

    async def publish(self, member: Member) -> None:
        """Write this member's record under its own lease (granted anew if it expired)."""
        if self._member_lease is None or await self.etcd.lease_keepalive_once(self._member_lease) <= 0:
            self._member_lease = (await self.etcd.lease_grant(self.ttl_s)).id
        await self.etcd.put(self.prefix + MEMBERS_PREFIX + member.name, json.dumps(member.__dict__),
                            lease=self._member_lease)

    async def view(self) -> View:
        """The cluster as etcd has it now; ``reachable`` False when no member answers."""
        try:
            kvs = await self.etcd.get_prefix(self.prefix)
        except CoordinatorUnavailable:
            return View(False)
        leader, members, term, handover = None, [], 0, None
        for kv in kvs:
            rest = kv.key[len(self.prefix):]
            if rest == LEADER_KEY:
                d = json.loads(kv.value)
                leader = Leader(d["name"], int(d["term"]), kv.mod_revision)
            elif rest == TERM_KEY:
                term = int(kv.value)
            elif rest == SWITCHOVER_KEY:
                handover = kv.value.decode()
            elif rest.startswith(MEMBERS_PREFIX):
                try:
                    d = json.loads(kv.value)
                    d["links"] = tuple(tuple(x) for x in d.get("links", ()))
                    members.append(Member(**d))
                except (TypeError, ValueError):
                    continue  # a record of another version: not a candidate
        return View(True, leader, tuple(sorted(members)), term, handover)

    # -- the leader key --------------------------------------------------------------------------
    async def campaign(self, term: int, ttl_s: float) -> bool:
        """Take the leader key for ``term`` if nobody holds it and ``term`` is still the next one (one
        transaction); True if taken. The term is compared too: a member that read the last term before
        another took the next one and gave it up again would otherwise lead in a term already used."""
        lease = (await self.etcd.lease_grant(ttl_s)).id
        key, term_key = self.prefix + LEADER_KEY, self.prefix + TERM_KEY
        value = json.dumps({"name": self.name, "term": term})
        last = absent(term_key) if term <= 1 else value_is(term_key, str(term - 1))
        res = await self.etcd.txn([absent(key), last], [Put(key, value, lease), Put(term_key, str(term))])
        if not res.succeeded:
            await self.etcd.lease_revoke(lease)
            return False
        self._leader_lease = lease
        return True

    async def renew(self) -> bool:
        """Keep the leader lease alive; False when it is gone (expired, revoked) or etcd is unreachable."""
        lease = self._leader_lease
        if lease is None:
            return False
        try:
            ttl = await self.etcd.lease_keepalive_once(lease)
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
            await self.etcd.lease_revoke(lease)

    async def request_switchover(self, to: str, ttl_s: float) -> None:
        """Ask the leader to hand the key to ``to`` (the request ends with its lease)."""
        lease = (await self.etcd.lease_grant(ttl_s)).id
        await self.etcd.put(self.prefix + SWITCHOVER_KEY, to, lease=lease)

    async def clear_switchover(self) -> None:
        await self.etcd.delete(self.prefix + SWITCHOVER_KEY)

    async def close(self) -> None:
        lease, self._member_lease = self._member_lease, None
        if lease is not None:
            try:
                await self.etcd.lease_revoke(lease)
            except CoordinatorUnavailable:
                pass
