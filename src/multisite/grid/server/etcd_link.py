"""A container's coordination through etcd (``container start --etcd URLS --grid G``, issue 24).

Without ``--etcd`` a container lives on one catalog's answers: its primaries take commits only while
the catalog answers its heartbeats, so a lost catalog stops every commit. With it, nothing on the
commit path waits for a catalog:

1. **Lease.** The container grants its own lease in etcd (``coordinator.LeaseKeeper``, renewed from a
   thread of its own) and puts its registration ``containers/<name>`` under it
   (``coordination.registration_write``: refused when another live container holds the name).
   Its primaries take commits while ``coordination.may_commit``: the lease was renewed in time (the
   deadline falls a quarter of the TTL before the lease can end) and the state it applied was read
   after this registration.
2. **Assignments.** It mirrors the ``state`` key (a read after registering, then a watch) and applies
   its own part of what the leader decided (``Catalog`` in mirror mode, ``assignments_for``), in
   order; no catalog sends it anything.
3. **Reports.** ``reports/<name>`` (applied placement version, seqnos, Loaders) under its lease, when
   they changed: a new applied version at once, seqnos at most every ``SEQNO_REPORT_INTERVAL_S``; for
   ``grid status``, never for a decision.
4. **Currency.** A primary's report of its current synchronous replicas is a transaction on
   ``epochs/<p>`` (``coordination.currency_write``), awaited where the catalog's ``HeartbeatAck`` was;
   a failed condition that ``epochs/<p>`` explains means deposed.

When etcd says the lease ended (the container was paused or cut off longer than the lease), its
primaries have been refusing commits since the deadline; it registers again under a new lease and
takes commits again only after it applied a state read after that registration, which tells it
whether it was replaced meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec

from ...errors import ConfigError, CoordinatorError, CoordinatorUnavailable, MultisiteError
from ...ha.etcd_client import EtcdClient
from ...ha.etcd_values import Compare, Put
from ..catalog import Catalog
from ..coordination import (CATALOGS, CONTAINERS, CURRENCY, EPOCHS, REPORT_INTERVAL_S, REPORTS,
                            SEQNO_REPORT_INTERVAL_S, STATE, ContainerRecord, Entry, GridKeys, Write, currency_write,
                            deposed, may_commit, registration_write, report_value)
from ..policy import policy_from_dict
from ..wire import Refused, RefusedCode
from .coordinator import RETRY_S, LeaseKeeper, Mirror, execute
from .security import probe_catalog

log = logging.getLogger("multisite.container")
CURRENCY_ATTEMPTS = 3  # a report whose revision moved (its own earlier one applied late) is tried again
CERTIFICATE_CHECK_S = 20.0  # with TLS, how long a starting container asks the catalogs to take its certificate


class EtcdLink:
    """The container's side of etcd (see the module docstring); ``host`` is the ``ContainerServer``."""

    def __init__(self, host, urls: list[str], ttl_s: float) -> None:
        self.host = host
        self.etcd = EtcdClient(urls)
        self.urls = self.etcd.urls
        self.keys = GridKeys(host.grid)
        self.mirror = Mirror(self.etcd, self.keys, sub=STATE)
        self.keeper = LeaseKeeper(self.urls, ttl_s, f"container {host.name}")
        self.registered_revision = 0
        self.applied_revision = 0
        self.registrations = 0
        self.currency_revisions: dict[int, int] = {}  # partition -> the currency key's revision as last known
        self.currency_writes = 0
        self._locks: dict[int, asyncio.Lock] = {}
        self._next_report = 1
        self._applied: bytes | None = None
        self._report: str | None = None
        self._report_at = 0.0
        self._report_version = -2
        self._report_task: asyncio.Task | None = None
        self._again = False

    # -- what the primaries ask ---------------------------------------------------------------------
    def lease_ok(self) -> bool:
        return (not self.keeper.ended.is_set()
                and may_commit(time.monotonic(), self.keeper.deadline, self.registered_revision, self.applied_revision))

    async def report_currency(self) -> set[int]:
        """Write each primary's current set where it changed (awaited by a batch that left a replica
        out, and before a new epoch's first answer); the partitions found deposed."""
        jobs = {}
        for p, sh in list(self.host.shards.items()):
            pr = sh.primary
            if pr is None:
                continue
            current = frozenset(pr.sync.current)
            if pr.lease.reported != current or pr.lease.in_flight_reports:
                jobs[p] = self._currency(p, pr, current)
        results = await asyncio.gather(*jobs.values())
        return {p for p, ok in zip(jobs, results) if ok is False}

    def report_currency_soon(self) -> None:
        """Report without waiting (a replica counts current again: wider is safe later); a report asked
        for while one runs is made after it (the running one read the current sets at its start)."""
        self._again = True
        if self._report_task is None or self._report_task.done():
            self._report_task = asyncio.create_task(self._report_while_asked())

    async def _report_while_asked(self) -> None:
        while self._again:
            self._again = False
            await self.report_currency()

    def _unreported(self) -> bool:
        return any(sh.primary is not None and (frozenset(sh.primary.sync.current) != sh.primary.lease.reported)
                   for sh in list(self.host.shards.values()))

    async def _currency(self, p: int, pr, current: frozenset[str]) -> bool | None:
        """One partition's report: True written, False deposed, None not known (etcd did not answer;
        it stays in flight: the primary counts it as possibly recorded)."""
        async with self._locks.setdefault(p, asyncio.Lock()):
            epoch, name = pr.epoch, self.host.name
            rid, self._next_report = self._next_report, self._next_report + 1
            pr.lease.sent(rid, current)
            try:
                for _ in range(CURRENCY_ATTEMPTS):
                    known = self.currency_revisions.get(p, 0)
                    res = await execute(self.etcd, currency_write(self.keys.prefix, p, epoch, name, current, known))
                    if res.succeeded:
                        self.currency_revisions[p] = res.revision
                        self.currency_writes += 1
                        self._answer(p, pr, epoch, rid, current, False)
                        return True
                    ek = await self.etcd.get(self.keys.key(f"{EPOCHS}{p}"))
                    ck = await self.etcd.get(self.keys.key(f"{CURRENCY}{p}"))
                    self.currency_revisions[p] = ck.mod_revision if ck is not None else 0
                    if deposed(ek.value if ek is not None else None, epoch, name):
                        log.warning("partition %d: etcd names another primary than %s at epoch %d: deposed", p, name,
                                    epoch)
                        self._answer(p, pr, epoch, rid, current, True)
                        return False
            except (CoordinatorUnavailable, CoordinatorError) as e:
                self.currency_revisions.pop(p, None)  # a write may have landed: read it back next time
                log.warning("partition %d: the currency report did not reach etcd: %s", p, e.message)
                await asyncio.sleep(RETRY_S)
            return None

    def _answer(self, p: int, pr, epoch: int, rid: int, current: frozenset[str], stale: bool) -> None:
        sh = self.host.shards.get(p)
        if sh is not None and sh.primary is pr and pr.epoch == epoch:
            pr.lease.answered(rid, current, stale)

    # -- the link -----------------------------------------------------------------------------------
    async def check(self) -> None:
        """At start: etcd answers (a clear error naming its URLs otherwise; later losses are waited out)."""
        try:
            await self.mirror.refresh()
            catalogs = await self.etcd.get_prefix(self.keys.key(CATALOGS))
        except CoordinatorUnavailable as e:
            raise ConfigError(f"the container cannot reach etcd: {e.message}") from None
        if self.host.security.tls is not None:
            await self._check_certificate(catalogs)

    async def _check_certificate(self, catalogs) -> None:
        """With TLS, before registering: a catalog of the grid must take this container's certificate (one
        of another CA, or naming another grid, is refused here, not by every peer later). Catalogs that do
        not answer are asked again for up to ``CERTIFICATE_CHECK_S``; none answering is an error, as is
        none running (a grid with TLS starts its catalogs first)."""
        addresses = [json.loads(kv.value).get("address", "") for kv in catalogs]
        if not addresses:
            raise ConfigError(f"no catalog of grid {self.host.grid!r} runs to check this container's certificate: "
                              f"start a catalog first (with TLS, a container registers once one took it)")
        deadline = time.monotonic() + CERTIFICATE_CHECK_S
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            for address in addresses:
                try:
                    why = await probe_catalog(address, self.host.security)
                except (OSError, TimeoutError, MultisiteError) as e:
                    seen[address] = str(e) or type(e).__name__
                    continue
                if why is not None:
                    raise ConfigError(f"the grid's catalog at {address} refused this container: {why}")
                return
            await asyncio.sleep(RETRY_S)
        raise ConfigError(f"no catalog of grid {self.host.grid!r} answered to check this container's certificate "
                          f"within {CERTIFICATE_CHECK_S:g} s ({'; '.join(f'{a}: {w}' for a, w in seen.items())})")

    async def run(self) -> None:
        """Register, apply the leader's state, report; register again whenever the lease ended."""
        mirror = asyncio.create_task(self.mirror.run())
        try:
            while True:
                if not await self._register():
                    return  # refused for good
                while not self.keeper.ended.is_set():
                    try:
                        await self._apply_state()
                        await self._write_report()
                        if self._unreported():  # a safety net: every change of a current set reaches etcd
                            self.report_currency_soon()
                    except (CoordinatorUnavailable, CoordinatorError) as e:
                        log.warning("etcd: %s", e.message)
                    except Exception:  # noqa: BLE001 - never end silently: a dead link leaves this container
                        # registered (its lease kept by its own thread) on a state it no longer follows
                        log.exception("container %s: applying the grid's state or reporting failed; trying "
                                      "again", self.host.name)
                        await asyncio.sleep(RETRY_S)
                    try:
                        await asyncio.wait_for(self.mirror.changed.wait(), REPORT_INTERVAL_S)
                    except TimeoutError:
                        pass
                    self.mirror.changed.clear()
                log.warning("container %s: its lease in etcd ended (paused or cut off longer than %g s): its "
                            "primaries stopped taking commits at the deadline; registering again",
                            self.host.name, self.keeper.granted_ttl_s)
                self.registered_revision = 0
                self.host.registered = False
        finally:
            mirror.cancel()

    async def _register(self) -> bool:
        record = ContainerRecord(self.host.name, self.host.zone, self.host.address, self.host.capacity,
                                 self.host.grid, self.host.dir_id)
        while True:
            try:
                lease = await self.keeper.grant(self.etcd)
                kv = await self.etcd.get(self.keys.key(CONTAINERS + record.name))
                entry = None if kv is None else Entry(kv.value, kv.create_revision, kv.mod_revision, kv.lease)
                w = registration_write(self.keys.prefix, record, entry, lease)
                if isinstance(w, str):
                    self.host.refuse(Refused(RefusedCode.NAME_IN_USE, w))
                    await self.keeper.revoke(self.etcd)
                    return False
                res = await self.etcd.txn(*_ops(w, lease))
                if not res.succeeded:
                    await self.keeper.revoke(self.etcd)
                    continue  # it changed between the read and the write: look again
                self._report = None
                self.registered_revision = res.revision
                self.registrations += 1
                await self.mirror.refresh()  # rule 1: a state read after the registration
                log.info("container %s registered in etcd (lease %x, %g s, revision %d)", record.name, lease,
                         self.keeper.granted_ttl_s, res.revision)
                return True
            except (CoordinatorUnavailable, CoordinatorError) as e:
                log.warning("container %s cannot register in etcd: %s", record.name, e.message)
                await asyncio.sleep(RETRY_S)

    async def _apply_state(self) -> None:
        """Apply this container's part of the newest state, then count it applied at the revision read."""
        state, _ = self.keys.state()
        seen = self.keys.revision
        if state is None:
            return
        cat = Catalog(policy_from_dict(state["policy"], "etcd"), now=time.monotonic(), state=state, mirror=True)
        a = cat.assignments_for(self.host.name)
        encoded = msgspec.msgpack.encode(a)
        if encoded != self._applied:
            await self.host.apply(a)
            self._applied = encoded
        self.applied_revision = max(self.applied_revision, seen)
        m = cat.members.get(self.host.name)
        up = m is not None and m.up
        if up and not self.host.registered:
            log.info("container %s is a member of grid %s (placement version %d)", self.host.name, a.grid, a.epoch)
        self.host.registered = up

    async def _write_report(self) -> None:
        """The report key, when it changed: a new applied version at once (the harness and status wait
        for it), seqnos alone at most every ``SEQNO_REPORT_INTERVAL_S``."""
        now = time.monotonic()
        if not self.keeper.lease:
            return
        value = report_value(self.host.applied_version, self.host.seqnos(), self.host.loader_report())
        if value == self._report:
            return
        if self._report_version == self.host.applied_version and now - self._report_at < SEQNO_REPORT_INTERVAL_S:
            return
        await self.etcd.put(self.keys.key(REPORTS + self.host.name), value, lease=self.keeper.lease)
        self._report, self._report_at, self._report_version = value, now, self.host.applied_version

    async def close(self) -> None:
        """After the shards closed: end the lease, so that the leader replaces this container at once."""
        self.keeper.close()
        await self.keeper.revoke(self.etcd)

    def status(self) -> dict:
        now = time.monotonic()
        return {"mode": "etcd", "etcd": self.urls, "lease_left_s": round(self.keeper.left_s(now), 3),
                "registered_revision": self.registered_revision, "applied_revision": self.applied_revision,
                "registrations": self.registrations, "renewals": self.keeper.renewals,
                "renewal_failures": self.keeper.failures, "currency_writes": self.currency_writes,
                "mirror_error": self.mirror.error}


def _ops(w: Write, lease: int) -> tuple[list[Compare], list[Put]]:
    """A registration: its puts under the container's lease."""
    return ([Compare(c.key, c.target, c.value) for c in w.conds], [Put(k, v, lease) for k, v in w.puts])
