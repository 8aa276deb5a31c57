"""The instance server's ``/metrics``: what its components count for ``status``, read at a scrape.

Why a custom Collector: nearly everything an operator wants (seqnos, backlogs, pool fill, connects,
fsyncs) is already counted by the components for ``status --json``. ``InstanceCollector`` reads those
same fields when Prometheus scrapes, so the commit path pays nothing for them and ``/metrics`` can
never disagree with ``status --json``. Only what status does not keep is observed as it happens:

- the commit latency histogram and client errors by code, by wrapping the instance server's client
  operation (one ``perf_counter`` pair and one histogram observe per request);
- the lag histogram, sampled once per ``LAG_SAMPLE_INTERVAL_S`` per link by a task of the server's
  event loop (a histogram of sampled lags: Prometheus' ``histogram_quantile`` over it gives the lag
  the links had most of the time).

Each process has its own ``CollectorRegistry`` (never the global one: tests run several servers in
one interpreter). The endpoint is an aiohttp site on the process's own event loop, so a scrape reads
the components' fields on the loop that changes them (as ``ctl_status`` does), never from a thread.

Names follow Prometheus conventions: ``multisite_`` prefix, base units (seconds, bytes), ``_total``
for counters; a link is labelled by ``secondary`` on the source side and ``source`` on the receiver.
"""


from __future__ import annotations

import asyncio
import time
from array import array
from bisect import bisect_left
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from ..net.metrics import HotHistogram, MetricsEndpoint, counter, gauge, scalars


LAG_SAMPLE_INTERVAL_S = 1.0
# Buckets in seconds: commits from tens of microseconds (group/none) to a slow disk's fsync.
COMMIT_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class JournalBytes:
    """Cumulative bytes of the journal frames committed since the server started, per commit batch:
    a commit listener appends (last seqno, bytes so far) for each batch, so the bytes between two seqnos
    is two bisects, however many links ask. Exact at batch boundaries, interpolated inside a batch (a
    group commit's batch is a few frames); older than the server (or than the ``MAX_BATCHES`` kept), the
    mean frame size of what is kept times the count (an estimate, said so in the metric's help)."""

    MAX_BATCHES = 1 << 20

    def __init__(self, seqno: int):
        self.reset(seqno)

    # Writers (commits, rollbacks) come one at a time: the engine calls its listeners under its commit lock.
    # A scrape reads without a lock: ``cum`` is appended before ``ends``, so the first len(ends) entries of
    # both are always whole, and a reset or a trim swaps in new arrays (``_arrays``) instead of changing them.
    def reset(self, seqno: int) -> None:
        """Start over after ``seqno`` (server start, a rollback: listeners are called with the seqno)."""
        self._arrays = (array("q", [seqno]), array("q", [0]))

    def on_commit(self, first_seqno: int, frames: list[bytes]) -> None:
        ends, cum = self._arrays
        if first_seqno != ends[-1] + 1:
            self.reset(first_seqno - 1)
            ends, cum = self._arrays
        cum.append(cum[-1] + sum(map(len, frames)))
        ends.append(first_seqno + len(frames) - 1)
        if len(ends) > 2 * self.MAX_BATCHES:
            self._arrays = (ends[self.MAX_BATCHES:], cum[self.MAX_BATCHES:])

    @staticmethod
    def _at(ends: array, cum: array, n: int, seqno: int) -> float:
        """Bytes committed up to and including ``seqno`` (>= ends[0]), from the first ``n`` entries."""
        i = bisect_left(ends, seqno, 0, n)
        if i >= n:
            return cum[n - 1]
        if ends[i] == seqno or i == 0:
            return cum[i]
        lo, hi = ends[i - 1], ends[i]  # seqno inside batch i: interpolate
        return cum[i - 1] + (cum[i] - cum[i - 1]) * (seqno - lo) / (hi - lo)

    def between(self, after: int, last: int) -> int:
        """Bytes of seqnos ``after+1 .. last``."""
        if last <= after:
            return 0
        ends, cum = self._arrays
        n = len(ends)
        first_kept = ends[0]
        known = self._at(ends, cum, n, last) - self._at(ends, cum, n, max(after, first_kept))
        older = max(0, min(last, first_kept) - after)
        if older:
            span = ends[n - 1] - first_kept
            known += older * ((cum[n - 1] - cum[0]) / span if span else 0)
        return int(known)


class InstanceCollector(Collector):
    """Reads an ``InstanceServer``'s components when Prometheus scrapes (see the module doc)."""

    def __init__(self, server: Any, journal_bytes: JournalBytes):
        self.server, self.journal_bytes = server, journal_bytes

    def collect(self) -> Iterable[Metric]:
        s = self.server
        db = s.db
        # No ``instance`` label: Prometheus gives every sample its target's ``instance`` label (host:port); the
        # instance's name is a label of multisite_instance_info only (join on it with ``* on(instance)``).
        info = gauge("multisite_instance_info", "The instance this server owns: name, role, group, durability",
                     ["name", "role", "group", "durability"])
        info.add_metric([db.name, db.info.role, str(db.info.group or ""), db.durability.value], 1)
        yield info
        pool, fsyncs = s.pool, db.journal.fsyncs
        yield from scalars(
            (gauge, "multisite_instance_seqno", "Last committed (or applied) seqno of the instance", db.seqno),
            (gauge, "multisite_server_start_time_seconds", "Unix time the instance server started", s.started_at),
            (gauge, "multisite_clients", "Client connections open now", s.clients.connections if s.clients else 0),
            (gauge, "multisite_journal_pool_bytes", "Bytes of journal frames held in the journal pool", pool.bytes),
            (gauge, "multisite_journal_pool_capacity_bytes", "Capacity of the journal pool", pool.capacity_bytes),
            (gauge, "multisite_journal_pool_first_seqno", "Oldest seqno the journal pool holds", pool.first_seqno),
            (counter, "multisite_journal_transactions_total", "Transactions journaled (committed here or applied "
             "from a source) since the server started", pool.appended),
            (counter, "multisite_journal_pool_evicted_total", "Frames evicted from the journal pool (secondaries "
             "behind them read the journal files)", pool.evicted),
            (counter, "multisite_journal_fsyncs_total", "fsyncs of the journal since the instance was opened", fsyncs),
            (gauge, "multisite_journal_commits_per_fsync", "Transactions journaled per fsync since the server "
             "started (group commit's batching; 0 with durability none)", pool.appended / fsyncs if fsyncs else 0.0))
        yield from self._sources(db.name)
        yield from self._receiver(db.name)
        if s.client_auth is not None:
            yield from self._logins(s.client_auth.status())

    @staticmethod
    def _logins(st: dict) -> Iterable[Metric]:
        """The client port's connection slots (``protocol.admission``) and refused logins, as ``status``
        shows them in ``client_auth``."""
        adm = st["admission"]
        refused = counter("multisite_client_logins_refused_total", "Client connections refused before they logged "
                          "in, by reason: at accept (connections, unauthenticated_total, per_address: the "
                          "limits of status' client_auth.admission), evicted (closed to make room for a client "
                          "from an address holding fewer waiting connections), authentication (a TLS handshake "
                          "or a hello refused)", ["reason"])
        for reason, n in adm["refused"].items():
            refused.add_metric([reason], n)
        refused.add_metric(["evicted"], adm["evicted"])
        refused.add_metric(["authentication"], st["refused"])
        yield refused
        yield from scalars(
            (counter, "multisite_client_login_timeouts_total", "Client connections closed because they had not "
             f"logged in within the login deadline ({adm['limits']['login_deadline_s']:g} s)", adm["timeouts"]),
            (gauge, "multisite_client_unauthenticated", "Client connections open now that have not logged in",
             adm["waiting"]))

    def _sources(self, name: str) -> Iterable[Metric]:
        """Eight samples a link (a link is up when its ``state`` label is streaming or xoff): a scrape's cost is
        prometheus-client formatting the samples of changed families (``ExpositionCache``) and collecting
        them, and 100 links must scrape in under 10 ms (bench/ops.py)."""
        labels = ["secondary"]
        info = gauge("multisite_source_info", "A Source Server: its state (passive, connecting, handshake, "
                     "streaming, xoff, lost, error, ...) and mode, as labels; always 1", labels + ["state", "mode"])
        conf = gauge("multisite_source_last_confirmed_seqno", "Last seqno the secondary confirmed applied", labels)
        bl = gauge("multisite_source_backlog_transactions", "Transactions the secondary has not confirmed", labels)
        blb = gauge("multisite_source_backlog_bytes", "Bytes of journal frames the secondary has not confirmed "
                    "(frames older than the server estimated at the mean frame size)", labels)
        lag = gauge("multisite_source_lag_seconds", "Age of the oldest transaction the secondary has not applied "
                    "(0 when caught up)", labels)
        rec = counter("multisite_source_sent_transactions_total", "Transactions sent to the secondary (the send "
                      "rate is its rate())", labels)
        conn = counter("multisite_source_connects_total", "Connections made to the secondary (each one after the "
                       "first is a reconnect)", labels)
        xoff = counter("multisite_source_xoff_seconds_total", "Seconds the Source Server was held by XOFF", labels)
        now, seqno = time.monotonic(), self.server.db.seqno
        lags: dict[int, float] = {}  # links at the same confirmed seqno share the decode of its next frame
        # The samples are appended as ``add_metric`` makes them (a Sample of the family's sample name, a labels
        # dict, the value), without its per-sample zip into a new dict: one labels dict serves a link's seven
        # one-label samples (nothing changes a sample's labels), which halves collecting 100 links.
        per_link = (conf, bl, blb, lag, rec, conn, xoff)
        names = [f.name + "_total" if f.type == "counter" else f.name for f in per_link]
        for sec, src in list(self.server.sources.items()):
            state, confirmed = src.state, src.last_confirmed
            info.samples.append(Sample(info.name, {"secondary": sec, "state": state,
                                                   "mode": "active" if src.active else "passive"}, 1))
            if confirmed not in lags:
                lags[confirmed] = src.lag_s()
            since = getattr(src, "xoff_since", None)  # left set by a session that ended in XOFF: state tells
            values = (confirmed, max(0, seqno - confirmed), self.journal_bytes.between(confirmed, seqno),
                      lags[confirmed], src.sent_records, src.connects,
                      getattr(src, "xoff_s", 0.0) + (now - since if since is not None and state == "xoff" else 0.0))
            lv = {"secondary": sec}
            for fam, n, v in zip(per_link, names, values):
                fam.samples.append(Sample(n, lv, v))
        yield from (info, conf, bl, blb, lag, rec, conn, xoff)

    def _receiver(self, name: str) -> Iterable[Metric]:
        s = self.server
        rp = s.receive_pool
        upd = s.update
        yield from scalars(
            (gauge, "multisite_receive_pool_bytes", "Bytes of received transactions waiting for the Update Process",
             rp.bytes),
            (gauge, "multisite_receive_pool_high_bytes", "Receive pool fill at which the receiver sends XOFF",
             rp.high_bytes),
            (gauge, "multisite_receive_pool_transactions", "Received transactions waiting for the Update Process",
             len(rp)),
            (counter, "multisite_update_applied_transactions_total", "Transactions the Update Process applied (the "
             "apply rate is its rate())", upd.applied),
            (gauge, "multisite_update_running", "1 while the Update Process runs", 1 if upd.running else 0))
        r = s.receiver
        if r is None:
            return
        lv = [r.peer or ""]
        labels = ["source"]
        up = gauge("multisite_receiver_connected", "1 while a Source Server is connected", labels)
        up.add_metric(lv, 1 if r.state in ("handshake", "receiving") else 0)
        rs = gauge("multisite_receiver_received_seqno", "Last seqno received", labels)
        rs.add_metric(lv, r.pool.received_seqno)
        rr = counter("multisite_receiver_received_transactions_total", "Transactions received", labels)
        rr.add_metric(lv, r.received_records)
        rc = counter("multisite_receiver_connections_total", "Connections from sources", labels)
        rc.add_metric(lv, r.connections)
        rf = counter("multisite_receiver_refusals_total", "Connections refused (wrong name, history)", labels)
        rf.add_metric(lv, r.refusals)
        rx = counter("multisite_receiver_xoffs_total", "XOFFs sent to the source (receive pool full)", labels)
        rx.add_metric(lv, r.xoffs)
        yield from (up, rs, rr, rc, rf, rx)


class InstanceMetrics:
    """The metrics of one instance server: its registry, the observed histograms, and the wrap of the
    client operation that feeds them."""

    def __init__(self, server: Any):
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.journal_bytes = JournalBytes(server.db.seqno)
        server.db.commit_listeners.append(self.journal_bytes.on_commit)
        server.db.rollback_listeners.append(self.journal_bytes.reset)
        self.registry.register(InstanceCollector(server, self.journal_bytes))
        self.commit_seconds = HotHistogram("multisite_commit_seconds", "Latency of a client commit in the server "
                                           "(from request to durable per the durability mode)", COMMIT_BUCKETS_S)
        self.registry.register(self.commit_seconds)
        # One histogram for all the instance's links (per link it would be 12 samples a link a scrape; the
        # current lag per link is multisite_source_lag_seconds).
        self.lag_seconds = HotHistogram("multisite_source_lag_sampled_seconds", "The lag of every link of the "
                                        f"instance, sampled every {LAG_SAMPLE_INTERVAL_S:g} s", LAG_BUCKETS_S)
        self.registry.register(self.lag_seconds)
        self.errors = Counter("multisite_client_errors", "Client requests answered with an error, by code",
                              ["code"], registry=self.registry)
        self._commit = self.commit_seconds
        # A commit the client listener gathered into a group commit was answered durable, in ``seconds``.
        # Called for every commit, always from the listener's event loop thread (server.clients: ``_synced``):
        # the histogram's lock-free observe for that one thread, bound here (no call in between).
        self.commit_done: Callable[[float], None] = self.commit_seconds.single_writer()

    def error(self, code: str) -> None:
        """The client listener answered a request with the error ``code``."""
        self.errors.labels(code).inc()

    def wrap_client_op(self, op: Callable[[str, dict], Any]) -> Callable[[str, dict], Any]:
        """``op`` timed (the commits the listener does not gather: on a secondary, or without a
        listener); its errors are counted where the listener answers them (``error``)."""
        commit, clock = self._commit, time.perf_counter

        def timed(kind: str, a: dict) -> Any:
            t0 = clock()
            r = op(kind, a)
            if kind == "commit":
                commit.observe(clock() - t0)
            return r
        return timed

    async def sample_lag(self) -> None:
        lag = self.lag_seconds
        while True:
            for src in list(self.server.sources.values()):
                lag.observe(src.lag_s())
            await asyncio.sleep(LAG_SAMPLE_INTERVAL_S)


async def start_instance_metrics(server: Any, listen: str) -> tuple[InstanceMetrics, MetricsEndpoint]:
    """The hook of ``InstanceServer.run``: metrics for ``server``, its client operation wrapped (call
    before the client listener is made), served on ``listen``."""
    m = InstanceMetrics(server)
    server._client_op = m.wrap_client_op(server._client_op)
    server.client_observer = m
    ep = await MetricsEndpoint(m.registry, listen, server.log).start(m.sample_lag())
    return m, ep
