"""HotHistogram (the commit latency histogram) against prometheus-client's own Histogram: the same
observations give the same exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest

from multisite.net.metrics import HotHistogram


def test_hot_histogram_exposes_what_the_library_histogram_does():
    disable_created_metrics()
    bounds = (0.001, 0.01, 0.1, 1.0)
    mine, ref = CollectorRegistry(), CollectorRegistry()
    h = HotHistogram("x_seconds", "doc", bounds)
    mine.register(h)
    r = Histogram("x_seconds", "doc", buckets=bounds, registry=ref)
    for v in (0.0005, 0.001, 0.002, 0.01, 0.5, 1.0, 3.0, 0.0):
        h.observe(v)
        r.observe(v)
    assert generate_latest(mine) == generate_latest(ref)
