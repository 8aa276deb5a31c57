"""A document server's ``/metrics`` (the shared endpoint and helpers are in ``net/metrics.py``)."""


from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ...net.metrics import counter, gauge, scalars


class DocServerCollector(Collector):
    """A document server's ``/metrics``: its Replicator workers, the sessions they ran, the queue of
    connections waiting for one, and each database's change number (``status`` reads the same fields)."""

    def __init__(self, server: Any):
        self.server = server

    def collect(self) -> Iterable[Metric]:
        s = self.server
        info = gauge("multisite_docserver_info", "The document server: its name; always 1", ["name"])
        info.add_metric([s.name], 1)
        yield info
        yield from scalars(
            (gauge, "multisite_docserver_replicators", "Replicator workers (sessions with that many servers at once)",
             s.replicators),
            (gauge, "multisite_docserver_sessions_active", "Replication sessions running now", len(s.active)),
            (gauge, "multisite_docserver_sessions_queued", "Replications waiting for a free Replicator",
             s.queue.qsize()),
            (counter, "multisite_docserver_sessions_total", "Replication sessions this server initiated and ended",
             s.sessions_done))
        ch = gauge("multisite_docdb_changeno", "A database's last change number (the rate of changes is its deriv())",
                   ["title", "replica_id"])
        for rid, db in sorted(s.dbs.items()):
            ch.add_metric([db.title, rid], db.changeno)
        yield ch
