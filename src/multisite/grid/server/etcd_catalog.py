"""One catalog of a grid whose catalogs coordinate through etcd (``catalog start --etcd``, issue 24).

Any number of these run; each keeps a mirror of the grid's keys (``coordinator.Mirror``), its own
record ``catalogs/<name>`` under its lease, and campaigns for the ``leader`` key (created only when
absent, under the same lease) whenever nobody holds it. The one that holds it runs a
``coordination.Leader``: each change etcd shows (a container registered, a lease ended, a report, a
currency report) is fed to its ``Catalog``, and what changed is written as one transaction
conditioned on the leader key being its own and on the revisions it read, so a deposed or paused
leader's write fails instead of overwriting (``coordination`` rules 2 and 3). After a failed write it
reads everything again and decides anew; after its lease ended (a pause, etcd unreachable from it) it
is a follower until it wins a campaign again.

Every catalog, leader or not, answers ``grid status`` and route requests from the mirror: what the
leader last decided, and the containers' reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from ...errors import ConfigError, CoordinatorError, CoordinatorUnavailable, MultisiteError
from ...ha.etcd_client import EtcdClient
from ...ha.etcd_values import Put, absent
from ..catalog import Catalog
from ..coordination import CATALOGS, LEADER, GridKeys, Leader, check_state
from ..policy import GridPolicy
from ..routing import RouteTable
from .coordinator import LeaseKeeper, Mirror, execute

TICK_S = 0.1  # a catalog looks at its lease and the leader key at least this often


class OperationRefused(MultisiteError):
    """An operator's request this catalog cannot carry out now (``code``: NOT_LEADER, RETRY)."""

    code = "NOT_LEADER"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message
HEALTH_TIMEOUT_S = 1.0


class CoordinatedCatalog:
    def __init__(self, policy: GridPolicy, name: str, urls: list[str], ttl_s: float, log: logging.Logger) -> None:
        self.policy, self.name, self.log = policy, name, log
        self.etcd = EtcdClient(urls)
        self.urls = self.etcd.urls
        self.keys = GridKeys(policy.name)
        self.mirror = Mirror(self.etcd, self.keys)
        self.keeper = LeaseKeeper(self.urls, ttl_s, f"catalog {name}")
        self.address = ""
        self.leader: Leader | None = None
        self.leading_since: float | None = None
        self.writes = 0  # state transactions that succeeded while this catalog led
        self.failed_writes = 0
        self.terms = 0  # times this catalog took the lead
        self._cache: tuple[int, Catalog] | None = None  # the view, and the mirror's ``changes`` it was built at
        self._pass = asyncio.Lock()  # one pass (decide, write) at a time: the loop's and an operation's

    # -- start and run ------------------------------------------------------------------------------
    async def start(self, address: str) -> None:
        """Read the grid's keys (a clear error naming the URLs when no etcd member answers), check the
        state is this grid's, and publish this catalog."""
        self.address = address
        try:
            await self.mirror.refresh()
        except CoordinatorUnavailable as e:
            raise ConfigError(f"the catalog cannot reach etcd: {e.message}") from None
        state, _ = self.keys.state()
        if state is not None:
            check_state(state, self.policy)
        other = self.keys.catalogs().get(self.name)
        if other is not None and other.get("address") != address:
            raise ConfigError(f"a catalog named {self.name!r} at {other.get('address')} is running for grid "
                              f"{self.policy.name!r}: give this one another --name")
        await self._publish()

    async def _publish(self) -> None:
        lease = await self.keeper.grant(self.etcd)
        await self.etcd.put(self.keys.key(CATALOGS + self.name), json.dumps({"address": self.address}), lease=lease)

    async def run(self) -> None:
        mirror = asyncio.create_task(self.mirror.run())
        try:
            while True:
                try:
                    await asyncio.wait_for(self.mirror.changed.wait(), TICK_S)
                except TimeoutError:
                    pass
                self.mirror.changed.clear()
                try:
                    await self.step()
                except (CoordinatorUnavailable, CoordinatorError) as e:
                    self.log.warning("etcd: %s", e.message)
                    await asyncio.sleep(TICK_S)
                except MultisiteError as e:  # a decision refused (a foreign state): logged, the next pass tries again
                    self.log.error("%s: %s", e.code, e)
                    await asyncio.sleep(TICK_S)
                except Exception:  # noqa: BLE001 - a catalog whose loop ended would look alive and decide nothing
                    self.log.exception("a pass of catalog %s failed", self.name)
                    self.leader = None
                    await asyncio.sleep(TICK_S)
        finally:
            mirror.cancel()

    async def close(self) -> None:
        """A planned stop: give the lease up, so that another catalog leads at once."""
        self.keeper.close()
        await self.keeper.revoke(self.etcd)

    # -- one pass -----------------------------------------------------------------------------------
    async def step(self) -> None:
        async with self._pass:
            await self._step()

    async def operate(self, apply) -> str:
        """An operator's change (``apply(catalog, now)``), made by the leader and written to etcd before
        it returns; OperationRefused when this catalog does not lead or the write met another change."""
        async with self._pass:
            if self.leader is None:
                held = self.keys.leader()
                where = f"{held['name']} at {held['address']}" if held else "none yet (an election is due)"
                raise OperationRefused("NOT_LEADER", f"catalog {self.name} does not lead grid {self.policy.name}; "
                                                     f"the leader is {where}")
            msg = apply(self.leader.cat, time.monotonic())
            failed = self.failed_writes
            await self._step()
            if self.failed_writes != failed or self.leader is None:
                raise OperationRefused("RETRY", "the grid changed while the operation was written: ask again")
            return msg

    async def _step(self) -> None:
        now = time.monotonic()
        if self.keeper.ended.is_set() or not self.keeper.lease:
            self._follow("its lease in etcd ended (paused, or cut off from etcd)")
            await self._publish()
        held = self.keys.leader()
        if self.leader is not None and (held is None or held["create_revision"] != self.leader.leader_revision):
            self._follow(f"the leader key is {'gone' if held is None else held['name'] + chr(39) + 's'}")
        if held is None and self.leader is None:
            await self._campaign(now)
        if self.leader is None:
            return
        w = self.leader.step(now)
        for line in self.leader.drain_log():
            self.log.info("%s", line)
        if w is None:
            return
        res = await execute(self.etcd, w)
        if res.succeeded:
            self.writes += 1
            for key, value in w.puts:  # seen now, not only once its watch event comes
                old = self.keys.kvs.get(key[len(self.keys.prefix):])
                self.keys.put(key, value.encode(), old.create_revision if old else res.revision, res.revision, 0, now)
            self.log.info("wrote %s at revision %d", w.why, res.revision)
            return
        self.failed_writes += 1
        self.log.warning("the write of %s failed its conditions (another catalog leads, or a container or currency "
                         "report changed since it was read): reading etcd again", w.why)
        await self.mirror.refresh()
        held = self.keys.leader()
        if held is not None and held["create_revision"] == self.leader.leader_revision:
            self.leader = Leader(self.policy, self.keys, self.leader.leader_revision, time.monotonic())
        else:
            self._follow("another catalog leads")

    async def _campaign(self, now: float) -> None:
        key = self.keys.key(LEADER)
        res = await self.etcd.txn([absent(key)], [Put(key, json.dumps({"name": self.name, "address": self.address}),
                                                      self.keeper.lease)])
        if not res.succeeded:
            return
        await self.mirror.refresh()  # decide on everything as of now, not on a mirror that may lag
        held = self.keys.leader()
        if held is None or held["create_revision"] != res.revision:
            return  # our lease ended at once: the next pass sees it
        self.leader = Leader(self.policy, self.keys, res.revision, time.monotonic())
        self.leading_since = time.monotonic()
        self.terms += 1
        self.log.info("catalog %s leads grid %s (leader key at revision %d)", self.name, self.policy.name, res.revision)

    def _follow(self, why: str) -> None:
        if self.leader is not None:
            self.log.warning("catalog %s no longer leads: %s", self.name, why)
        self.leader, self.leading_since = None, None

    # -- what it answers ----------------------------------------------------------------------------
    def view(self, now: float) -> Catalog:
        """What the leader decided, with the containers' reports (an empty grid before the first state)."""
        if self._cache is not None and self._cache[0] == self.keys.changes:
            return self._cache[1]
        cat = self.keys.mirror(now) or Catalog(self.policy, now=now, mirror=True)
        self._cache = (self.keys.changes, cat)
        return cat

    def routes(self) -> RouteTable:
        return self.view(time.monotonic()).route_table()

    async def status(self) -> dict:
        now = time.monotonic()
        st = self.view(now).status(now)
        st["coordination"] = self.coordination()
        health = await asyncio.wait_for(self.etcd.health(), HEALTH_TIMEOUT_S * 3)
        st["etcd"] = [{"url": h.url, "healthy": h.healthy, "member_id": f"{h.member_id:x}" if h.member_id else None,
                       "leader_id": f"{h.leader_id:x}" if h.leader_id else None, "error": h.error or None}
                      for h in health]
        return st

    def coordination(self) -> dict:
        held = self.keys.leader()
        return {"mode": "etcd", "etcd": self.urls, "this": self.name, "leading": self.leader is not None,
                "leader": held["name"] if held else None, "leader_address": held["address"] if held else None,
                "catalogs": [{"name": n, "address": d.get("address"), "leader": bool(held and held["name"] == n)}
                             for n, d in sorted(self.keys.catalogs().items())],
                "lease_left_s": round(self.keeper.left_s(time.monotonic()), 3), "writes": self.writes,
                "failed_writes": self.failed_writes, "terms": self.terms, "mirror_error": self.mirror.error}
