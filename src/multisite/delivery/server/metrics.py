"""A delivery agent's ``/metrics`` (the shared helpers are in ``net/metrics.py``)."""


from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from ...errors import ConfigError
from ...net.tls import parse_hostport
from ...net.metrics import counter, gauge, scalars


AGENT_COUNTERS = ("received", "applied_messages", "applied_transactions", "conflicts", "duplicates",
                  "sent_messages", "sent_transactions", "resend_requests", "controls", "controls_sent")


class AgentMetrics:
    """A delivery agent's ``/metrics``: its polls' counts added up since it started, and its
    SYSREMOTEUSER table (offsets sent, confirmed, received per remote user). The agent's loop is not
    asyncio: after each poll it hands ``update`` a report and the status it read in its own thread, and
    the endpoint (prometheus-client's own http server, a thread) reads only that snapshot."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(AGENT_COUNTERS + ("polls", "rejected", "link_errors"), 0)
        self.status: dict = {"instance": "", "role": "", "remote_users": []}
        self.last_poll = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.port: int | None = None
        self._server = None

    def update(self, report: Any, status: dict, now: float) -> None:
        totals = dict(self.totals)
        for k in AGENT_COUNTERS:
            totals[k] += getattr(report, k)
        totals["polls"] += 1
        totals["rejected"] += len(report.rejected)
        totals["link_errors"] += len(report.link_errors)
        self.totals, self.status, self.last_poll = totals, status, now  # each replaced whole: a scrape sees one

    def collect(self) -> Iterable[Metric]:
        totals, st = self.totals, self.status
        info = gauge("multisite_agent_info", "The delivery agent: its instance and role; always 1",
                     ["instance", "role"])
        info.add_metric([st["instance"], st["role"] or ""], 1)
        yield info
        yield from scalars(*[(counter, f"multisite_agent_{k}_total", f"{k.replace('_', ' ')} (summed over the "
                              "agent's polls since it started)", v) for k, v in totals.items()],
                           (gauge, "multisite_agent_last_poll_time_seconds", "Unix time the last poll ended",
                            self.last_poll))
        labels = ["user", "publication"]
        fams = {f: gauge(f"multisite_agent_{f}_offset", f"SYSREMOTEUSER {f}: a journal offset", labels)
                for f in ("log_sent", "confirm_sent", "log_received", "confirm_received")}
        for r in st["remote_users"]:
            for f, fam in fams.items():
                fam.add_metric([r["user"], r["publication"]], r[f])
        yield from fams.values()

    def serve(self, listen: str) -> int:
        from prometheus_client import start_http_server

        host, port = parse_hostport(listen)
        try:
            self._server, _thread = start_http_server(port, host, registry=self.registry)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {listen}: {e.strerror or e}") from None
        self.port = self._server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
