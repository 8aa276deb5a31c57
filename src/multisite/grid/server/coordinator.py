"""What the grid's catalogs and containers share to coordinate through etcd (``--etcd``, issue 24).

- ``LeaseKeeper``: one lease kept alive from a **thread of its own** (with its own event loop and etcd
  client): a container's event loop busy with a batch, a checkpoint or a slow disk must not let its
  lease lapse, and a keepalive must not wait behind the loop's executor threads. It publishes the
  deadline until which its owner may act on the lease (``coordination.commit_deadline``) and whether
  etcd said the lease ended.
- ``Mirror``: a ``coordination.GridKeys`` kept up to date: a read of the prefix, then a watch from the
  next revision; any end of the watch reads again. A full read also runs every ``resync_s``: a watch on
  a paused etcd member says nothing (``ha/etcd_client.py``), and a mirror that silently stopped would
  keep a leader from seeing a lost container.
- ``execute``: a ``coordination.Write`` carried out as one etcd transaction.

etcd itself is reached through the shared ``ha.etcd_client.EtcdClient``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from ...errors import CoordinatorError, CoordinatorUnavailable
from ...ha.etcd_client import EtcdClient
from ...ha.etcd_values import Compare, Put, TxnResult
from ..coordination import GridKeys, Write, commit_deadline, renew_every_s

KEEPALIVE_TIMEOUT_S = 0.4  # one keepalive call to one member: a paused member is passed over within the margin
RESYNC_S_DEFAULT = 1.0
RETRY_S = 0.2  # after etcd did not answer: try again this soon

log = logging.getLogger("multisite.grid.etcd")


async def execute(etcd: EtcdClient, w: Write) -> TxnResult:
    """``w`` as one transaction (CoordinatorUnavailable when its outcome is unknown)."""
    return await etcd.txn([Compare(c.key, c.target, c.value) for c in w.conds], [Put(k, v) for k, v in w.puts])


class LeaseKeeper:
    """Keeps one lease alive from a thread (see the module docstring). ``grant`` (in the owner's loop)
    makes a new lease; then ``deadline`` moves with every renewal etcd accepted, and ``ended`` is set
    once etcd says the lease is gone (expired or revoked): a new one must be granted."""

    def __init__(self, urls: list[str], ttl_s: float, what: str) -> None:
        self.urls, self.ttl_s, self.what = urls, ttl_s, what
        self.lease = 0
        self.granted_ttl_s = 0.0
        self.deadline = 0.0  # monotonic: the owner acts on the lease until then
        self.ended = threading.Event()
        self.renewals = 0
        self.failures = 0  # renewals etcd did not answer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def grant(self, etcd: EtcdClient) -> int:
        sent = time.monotonic()
        lease = await etcd.lease_grant(self.ttl_s)
        self.lease, self.granted_ttl_s = lease.id, float(lease.ttl_s)
        self.deadline = commit_deadline(sent, self.granted_ttl_s)
        self.ended.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"etcd lease {self.what}", daemon=True)
            self._thread.start()
        return lease.id

    def holds(self, now: float) -> bool:
        return self.lease != 0 and not self.ended.is_set() and now < self.deadline

    def left_s(self, now: float) -> float:
        return max(0.0, self.deadline - now) if self.lease and not self.ended.is_set() else 0.0

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        client = EtcdClient(self.urls, timeout_s=KEEPALIVE_TIMEOUT_S)
        try:
            while not self._stop.is_set():
                lease = self.lease
                if lease and not self.ended.is_set():
                    sent = time.monotonic()
                    try:
                        ttl = loop.run_until_complete(client.lease_keepalive_once(lease))
                    except (CoordinatorUnavailable, CoordinatorError) as e:
                        self.failures += 1
                        log.debug("%s: lease renewal failed: %s", self.what, e)
                        ttl = None
                    except Exception:  # noqa: BLE001 - a dead keeper lets the lease lapse with nobody told
                        self.failures += 1
                        log.exception("%s: lease renewal failed", self.what)
                        ttl = None
                    if lease == self.lease and ttl is not None:
                        if ttl <= 0:
                            self.ended.set()
                            log.warning("%s: etcd says its lease %x ended", self.what, lease)
                        else:
                            self.renewals += 1
                            self.deadline = max(self.deadline, commit_deadline(sent, min(ttl, self.granted_ttl_s)))
                self._stop.wait(renew_every_s(self.granted_ttl_s or self.ttl_s))
        finally:
            loop.close()

    async def revoke(self, etcd: EtcdClient) -> None:
        """End the lease now (a planned stop: its keys go at once, nobody waits for the TTL)."""
        lease, self.lease = self.lease, 0
        self.deadline = 0.0
        if lease:
            try:
                await etcd.lease_revoke(lease)
            except (CoordinatorUnavailable, CoordinatorError) as e:
                log.warning("%s: could not revoke its lease (it ends within its TTL): %s", self.what, e)

    def close(self) -> None:
        self._stop.set()


class Mirror:
    """``keys`` kept up to date from etcd (see the module docstring); ``sub`` narrows it to the keys
    under ``keys.prefix + sub`` (a container mirrors only ``state``). ``changed`` is set after every
    change; ``refresh()`` reads again now (after it, ``keys.revision`` is at least etcd's revision at
    the call)."""

    def __init__(self, etcd: EtcdClient, keys: GridKeys, sub: str = "", resync_s: float = RESYNC_S_DEFAULT) -> None:
        self.etcd, self.keys, self.sub, self.resync_s = etcd, keys, sub, resync_s
        self.changed = asyncio.Event()
        self.loaded = asyncio.Event()
        self.error: str | None = None
        self._lock = asyncio.Lock()

    async def refresh(self) -> int:
        async with self._lock:
            read = await self.etcd.read_prefix(self.keys.prefix + self.sub)
            self.keys.load([(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease) for kv in read.kvs],
                           read.revision, time.monotonic())
            self.error = None
            self.loaded.set()
            self.changed.set()
            return read.revision

    async def run(self) -> None:
        resync = asyncio.create_task(self._resync())
        try:
            while True:
                try:
                    revision = await self.refresh()
                    async with self.etcd.watch_prefix(self.keys.prefix + self.sub, revision + 1) as events:
                        async for ev in events:
                            kv = ev.kv
                            if ev.kind == "put":
                                self.keys.put(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease,
                                              time.monotonic())
                            else:
                                self.keys.delete(kv.key, kv.mod_revision)
                            self.changed.set()
                except (CoordinatorUnavailable, CoordinatorError) as e:
                    if self.error != e.message:
                        log.warning("etcd: %s", e.message)
                    self.error = e.message
                    await asyncio.sleep(RETRY_S)
                except Exception as e:  # noqa: BLE001 - never end silently: its owner would follow a frozen copy
                    self._failed(e)
                    await asyncio.sleep(RETRY_S)
        finally:
            resync.cancel()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            try:
                await self.refresh()
            except (CoordinatorUnavailable, CoordinatorError) as e:
                self.error = e.message
            except Exception as e:  # noqa: BLE001 - as in run(): the read every second must go on
                self._failed(e)

    def _failed(self, e: Exception) -> None:
        self.error = f"{type(e).__name__}: {e}"
        log.error("the mirror of %s failed (%s); reading again", self.keys.prefix + self.sub, self.error,
                  exc_info=e)
