"""What lets a primary shard take commits: the catalog's lease and its word on currency, per epoch.

A container's primaries take commits only while the catalog answered one of its heartbeats within
3/4 of the heartbeat timeout (``ContainerServer.lease_ok``): past the timeout the catalog may
promote another shard. And the catalog must never count current a synchronous replica that the
primary does not, or a promotion could lose an acknowledged commit: before a primary answers a batch
whose vote left a replica out, it reports its current set with the next heartbeat and waits for
the catalog's answer (``report_if_narrower``). The catalog may also answer that another shard leads
the partition now (``deposed``). This state belongs to an epoch: a new one starts it again.

It is its own object so that the heartbeat bookkeeping the container does (``sent``, ``answered``)
is an operation on it, not a reach into the primary's fields, and so that the batch pipeline
(``primary.py``) reads as one question: may I answer?
"""

from __future__ import annotations

import asyncio

from ..voting import SyncReplicas

LEASE_POLL_S = 0.05  # how often a primary waiting for the catalog's (or etcd's) word looks at its lease


class Lease:
    """A primary's lease and the catalog's acknowledged view of its current replicas, this epoch."""

    def __init__(self, host, sync: SyncReplicas, epoch: int) -> None:
        self.host, self.sync, self.epoch = host, sync, epoch
        self.ok = host.lease_ok  # the container's lease: whether the catalog answered recently enough
        self.reported: frozenset[str] | None = None  # the current set the catalog acknowledged, this epoch
        self.in_flight_reports: dict[int, frozenset[str]] = {}  # heartbeat ack id -> current set sent, unanswered
        self.deposed = False  # the catalog said another shard leads this partition now
        self.stopped = asyncio.Event()  # set by stop(): a batch waiting on the catalog gives up

    def update(self, epoch: int) -> None:
        """The partition's placement changed; a new epoch starts the catalog's word over."""
        if epoch != self.epoch:
            self.reported = None
            self.in_flight_reports.clear()
            self.deposed = False
        self.epoch = epoch

    def stop(self) -> None:
        self.stopped.set()

    # -- what the container's heartbeats tell ------------------------------------------------------
    def sent(self, ack: int, current: frozenset[str]) -> None:
        """Heartbeat ``ack`` carries ``current``: the catalog may count it from now on."""
        self.in_flight_reports[ack] = current

    def answered(self, ack: int, current: frozenset[str], stale: bool) -> None:
        """The catalog recorded heartbeat ``ack`` (and every earlier one), which reported ``current``;
        ``stale``: it moved the partition on (possibly because of this report)."""
        for a in [a for a in self.in_flight_reports if a <= ack]:
            del self.in_flight_reports[a]
        if stale:
            self.deposed = True
        else:
            self.reported = current

    # -- what the primary asks ---------------------------------------------------------------------
    async def report_if_narrower(self) -> bool:
        """Before answering: the catalog must not count current a replica this primary does not.
        False if the catalog says this primary was deposed meanwhile."""
        report: asyncio.Future | None = None
        try:
            while not self.deposed and not self.catalog_within(frozenset(self.sync.current)):
                # Handing over or shutting down without the catalog's word, or the lease lost while waiting
                # for it (another may be promoted now, holding the batch or not): neither "rolled back" nor
                # "committed" is certain; the caller aborts, OUTCOME_UNKNOWN. A cut-off primary answers so
                # within its lease instead of holding its clients until the cut heals.
                if self.stopped.is_set() or not self.ok():
                    return False
                if report is None or report.done():
                    report = asyncio.ensure_future(self.host.report_currency())
                stop = asyncio.ensure_future(self.stopped.wait())
                try:
                    await asyncio.wait({report, stop}, timeout=LEASE_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
        finally:
            if report is not None:
                report.cancel()
        return not self.deposed

    def catalog_within(self, current: frozenset[str]) -> bool:
        """Whether whatever the catalog may count current now (the last acknowledged report, or any
        report still on its way) is within ``current``."""
        if self.reported is None:
            return False
        may = self.reported.union(*self.in_flight_reports.values())
        return may <= current
