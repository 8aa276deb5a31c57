"""Prometheus ``/metrics`` for every family's processes: the endpoint, its exposition cache, helpers.

Each process has its own ``CollectorRegistry`` (never the global one: tests run several servers in
one interpreter). The endpoint is an aiohttp site on the process's own event loop, so a scrape reads
the components' fields on the loop that changes them (as ``ctl_status`` does), never from a thread.
The collectors are the families': ``server/metrics.py`` (the instance server), ``grid/server/metrics.py``,
``multimaster/server/metrics.py`` and ``delivery/server/metrics.py``.

Names follow Prometheus conventions: ``multisite_`` prefix, base units (seconds, bytes), ``_total``
for counters.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from bisect import bisect_left
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..errors import ConfigError
from .tls import parse_hostport


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


async def start_collector_metrics(collector: Collector, listen: str, log: logging.Logger) -> MetricsEndpoint:
    """``/metrics`` of one collector on ``listen`` (a docserver's, a container's)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return await MetricsEndpoint(reg, listen, log).start()
