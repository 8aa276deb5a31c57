"""The grid catalog's and containers' ``/metrics``, read from the status ``grid status --json`` shows
(the shared endpoint and helpers are in ``net/metrics.py``)."""


from __future__ import annotations

from typing import Any, Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ...net.metrics import gauge, scalars


class ContainerCollector(Collector):
    """A grid container's ``/metrics``, read from its ``status()`` (the dict `grid status` shows): the
    container's registration and lease, and per shard (``partition``) its role, seqno and epoch; on a
    primary, its committed seqno, queued transactions and each replica link's backlog."""

    def __init__(self, container: Any):
        self.container = container

    def collect(self) -> Iterable[Metric]:
        st = self.container.status()
        info = gauge("multisite_container_info", "The grid container: name, grid, zone; always 1",
                     ["name", "grid", "zone"])
        info.add_metric([str(st["name"]), str(st["grid"] or ""), str(st["zone"] or "")], 1)
        yield info
        yield from scalars(
            (gauge, "multisite_container_registered", "1 once the catalog has accepted the container",
             1 if st["registered"] else 0),
            (gauge, "multisite_container_lease_ok", "1 while the catalog's lease holds", 1 if st["lease_ok"] else 0),
            (gauge, "multisite_container_placement_version", "The placement version the container applied",
             st["applied_version"] or 0))
        role = gauge("multisite_shard_info", "A shard hosted here: its role; always 1", ["partition", "role"])
        seq = gauge("multisite_shard_seqno", "The shard's last seqno", ["partition"])
        epoch = gauge("multisite_shard_epoch", "The shard's placement epoch", ["partition"])
        queued = gauge("multisite_shard_queued_transactions", "A primary's transactions waiting for their vote",
                       ["partition"])
        backlog = gauge("multisite_shard_replica_backlog_transactions", "A primary's replica link: transactions "
                        "committed and not acknowledged", ["partition", "replica", "role"])
        live = gauge("multisite_shard_replica_live", "A primary's replica link: 1 while connected",
                     ["partition", "replica", "role"])
        for p, sh in st["shards"].items():
            role.add_metric([p, sh["role"] or "none"], 1)
            seq.add_metric([p], sh["seqno"])
            epoch.add_metric([p], sh["epoch"])
            if "queued" in sh:
                queued.add_metric([p], sh["queued"])
            for n, lk in (sh.get("links") or {}).items():
                backlog.add_metric([p, n, lk["role"]], lk["backlog"])
                live.add_metric([p, n, lk["role"]], 1 if lk["live"] else 0)
        yield from (role, seq, epoch, queued, backlog, live)


class CatalogCollector(Collector):
    """A grid catalog's ``/metrics``, read from the status ``grid status --json`` shows: the placement
    version, partitions with no primary or fewer replicas than the policy asks, and per container
    whether it is up, its heartbeat age, shards and primaries; per partition each replica's backlog as
    the primaries and replicas report their seqnos."""

    def __init__(self, status: Callable[[], dict]):
        self.status = status

    def collect(self) -> Iterable[Metric]:
        st = self.status()
        info = gauge("multisite_catalog_info", "The grid's catalog: the grid's name; always 1", ["grid"])
        info.add_metric([st["grid"]], 1)
        yield info
        yield from scalars(
            (gauge, "multisite_catalog_placement_version", "The placement's version", st["version"]),
            (gauge, "multisite_catalog_partitions_without_primary", "Partitions with no primary placed",
             sum(1 for p in st["partitions"] if not p.get("primary"))),
            (gauge, "multisite_catalog_under_replicated", "Shortfalls of the last plan (a partition with fewer "
             "replicas than the policy asks)", len(st["under_replicated"])))
        up = gauge("multisite_catalog_container_up", "1 while the container's heartbeats arrive", ["container", "zone"])
        age = gauge("multisite_catalog_container_heartbeat_age_seconds", "Seconds since the container's last "
                    "heartbeat", ["container"])
        shards = gauge("multisite_catalog_container_shards", "Shards placed on the container", ["container"])
        prims = gauge("multisite_catalog_container_primaries", "Primaries placed on the container", ["container"])
        for c in st["containers"]:
            up.add_metric([c["name"], c["zone"] or ""], 1 if c["up"] else 0)
            age.add_metric([c["name"]], c["last_heartbeat_age_s"])
            shards.add_metric([c["name"]], c["shards"])
            prims.add_metric([c["name"]], c["primaries"])
        backlog = gauge("multisite_catalog_replica_backlog_transactions", "A replica's distance behind its "
                        "partition's primary, by the seqnos they report", ["partition", "container"])
        for p in st["partitions"]:
            for c, n in sorted(p["backlog"].items()):
                backlog.add_metric([str(p["partition"]), c], n)
        yield from (up, age, shards, prims, backlog)
