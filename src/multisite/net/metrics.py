"""Prometheus metrics of a server process: ``/metrics`` in the text format, through prometheus-client.

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
import logging
import threading
import time
from array import array
from bisect import bisect_left
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from ..errors import ConfigError
from .tls import parse_hostport

LAG_SAMPLE_INTERVAL_S = 1.0
# Buckets in seconds: commits from tens of microseconds (group/none) to a slow disk's fsync.
COMMIT_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

_log = logging.getLogger("multisite.metrics")
# No ``*_created`` series: a timestamp per counter and histogram nobody graphs, a third more samples a scrape.
disable_created_metrics()


def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    # prometheus-client adds ``_total`` to a counter family's samples: ``name`` is given without it.
    return CounterMetricFamily(name.removesuffix("_total"), doc, labels=list(labels))


def scalars(*rows: tuple[Callable[..., Metric], str, str, float]) -> Iterable[Metric]:
    """Families of one unlabelled sample each, from ``(gauge or counter, name, help, value)`` rows."""
    for kind, name, doc, value in rows:
        fam = kind(name, doc)
        fam.add_metric([], value)
        yield fam


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


class HotHistogram(Collector):
    """A histogram for a hot path. ``observe`` (any thread) is one lock, a bisect and two additions
    (prometheus-client's Histogram takes two locks and walks the buckets in Python, about three times as
    long); ``single_writer()`` gives an observe for one thread's use only, without the lock (a lock's
    acquire and release cost more than the rest here: about 0.6 µs of the 0.85 µs). The exposition is
    still prometheus-client's: ``collect`` gives a HistogramMetricFamily with the cumulative buckets,
    the same family object again while nothing was observed (a scrape then reuses its text: see
    ``ExpositionCache``)."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]):
        self.name, self.doc, self.bounds = name, doc, tuple(buckets)
        # A cell: a count per bucket (the last: above every bound, +Inf only), then the sum.
        self._shared = self._cell()  # observe's, under the lock
        self._cells: list[list] = []  # one per single writer
        self._lock = threading.Lock()
        self._les = [floatToGoString(b) for b in self.bounds + (float("inf"),)]
        self._last: tuple[list, Metric] | None = None

    def _cell(self) -> list:
        return [0] * (len(self.bounds) + 1) + [0.0]

    def observe(self, value: float) -> None:
        i = bisect_left(self.bounds, value)  # le: a value equal to a bound falls in that bound's bucket
        cell = self._shared
        with self._lock:
            cell[i] += 1
            cell[-1] += value

    def single_writer(self) -> Callable[[float], None]:
        """An observe that one thread alone may call (each thread its own). It takes no lock: its counts
        are its own, and a scrape copies them with one ``list()`` (atomic under the GIL); at worst it sees
        an observation's count before its sum."""
        cell, bounds, last = self._cell(), self.bounds, len(self.bounds) + 1
        self._cells.append(cell)

        def observe(value: float) -> None:
            cell[bisect_left(bounds, value)] += 1
            cell[last] += value
        return observe

    def _totals(self) -> list:
        with self._lock:
            tot = list(self._shared)
        for cell in list(self._cells):
            tot = [a + b for a, b in zip(tot, list(cell))]
        return tot

    def collect(self) -> Iterable[Metric]:
        tot = self._totals()
        if self._last is not None and self._last[0] == tot:
            yield self._last[1]
            return
        cum, acc = [], 0
        for le, n in zip(self._les, tot):
            acc += n
            cum.append((le, acc))
        fam = HistogramMetricFamily(self.name, self.doc, buckets=cum, sum_value=tot[-1])
        self._last = (tot, fam)
        yield fam


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
        # Called for every commit, always from the listener's event loop thread (net.clients: ``_synced``):
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


class _One:
    """One family as a collector: what ``generate_latest`` formats alone."""

    __slots__ = ("metric",)

    def __init__(self, metric: Metric):
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return (self.metric,)


class ExpositionCache:
    """``generate_latest(registry)``, formatting again only the families whose samples changed.

    Why: prometheus-client writes a sample in about 10 µs (it validates and escapes every name and
    label each time), and most of a scrape's families have not changed since the previous one (an
    instance's info, capacities, idle links, the lag histogram between two samplings, a secondary's
    whole source side). A family's text depends on nothing but its name, type, help and samples, so
    each family's samples are compared (in C: tuples and dicts) with those of the family of the same
    name at the previous scrape, and its text is reused when they are equal; a changed family is
    formatted by prometheus-client (``generate_latest`` of that family alone). The output is
    byte for byte ``generate_latest(registry)`` (tests/unit/test_metrics_cache.py); values are read
    fresh at every scrape, so nothing is stale. Used from one thread (the endpoint's event loop)."""

    def __init__(self, registry: Any):
        self.registry = registry
        self._texts: dict[str, tuple[str, str, list, str]] = {}  # name -> (type, help, samples, text)
        self.formatted = self.reused = 0  # families, since the start (bench/ops.py reads them)

    def generate(self) -> bytes:
        out, texts, seen = [], self._texts, set()
        for metric in self.registry.collect():
            name = metric.name
            prev = texts.get(name)
            if (prev is not None and prev[2] == metric.samples and prev[0] == metric.type
                    and prev[1] == metric.documentation):
                out.append(prev[3])
                self.reused += 1
            else:
                text = generate_latest(_One(metric)).decode()  # type: ignore[arg-type]
                # A copy: a collector that appended to a family it yielded before must not make it look unchanged.
                texts[name] = (metric.type, metric.documentation, list(metric.samples), text)
                out.append(text)
                self.formatted += 1
            seen.add(name)
        if len(texts) > len(seen):  # families gone (a collector unregistered): forget them
            for name in texts.keys() - seen:
                del texts[name]
        return "".join(out).encode()


class MetricsEndpoint:
    """``/metrics`` of ``registry`` served on ``listen`` (HOST:PORT, port 0 for a free one) by aiohttp on
    the running event loop."""

    def __init__(self, registry: CollectorRegistry, listen: str, log: logging.Logger = _log):
        self.registry, self.listen, self.log = registry, listen, log
        self.port: int | None = None
        self._runner = None
        self._tasks: list[asyncio.Task] = []
        self.last_generate_s = self.last_generate_cpu_s = 0.0
        registry.register(_ScrapeCost(self))
        self.exposition = ExpositionCache(registry)

    async def start(self, *background: Any) -> "MetricsEndpoint":
        from aiohttp import web

        host, port = parse_hostport(self.listen)
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise ConfigError(f"cannot serve metrics on {self.listen}: {e.strerror or e}") from None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._tasks = [asyncio.get_running_loop().create_task(c) for c in background]
        self.log.info("metrics served on http://%s:%d/metrics", host, self.port)
        return self

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        t0, c0 = time.perf_counter(), time.thread_time()
        body = self.exposition.generate()
        self.last_generate_s, self.last_generate_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._runner is not None:
            await self._runner.cleanup()


class _ScrapeCost(Collector):
    """What the previous scrape cost the server (wall and CPU time to collect and format)."""

    def __init__(self, ep: MetricsEndpoint):
        self.ep = ep

    def collect(self) -> Iterable[Metric]:
        g = gauge("multisite_metrics_generate_seconds", "Time the previous /metrics took to collect and format")
        g.add_metric([], self.ep.last_generate_s)
        c = gauge("multisite_metrics_generate_cpu_seconds", "CPU time of this process's thread for the previous "
                  "/metrics (less sensitive than wall time to other processes on the machine)")
        c.add_metric([], self.ep.last_generate_cpu_s)
        yield from (g, c)


async def start_instance_metrics(server: Any, listen: str) -> tuple[InstanceMetrics, MetricsEndpoint]:
    """The hook of ``InstanceServer.run``: metrics for ``server``, its client operation wrapped (call
    before the client listener is made), served on ``listen``."""
    m = InstanceMetrics(server)
    server._client_op = m.wrap_client_op(server._client_op)
    server.client_observer = m
    ep = await MetricsEndpoint(m.registry, listen, server.log).start(m.sample_lag())
    return m, ep


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


async def start_collector_metrics(collector: Collector, listen: str, log: logging.Logger) -> MetricsEndpoint:
    """``/metrics`` of one collector on ``listen`` (a docserver's, a container's)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return await MetricsEndpoint(reg, listen, log).start()


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
