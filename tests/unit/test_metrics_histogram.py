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


def test_single_writers_and_observe_add_up_as_one_histogram():
    disable_created_metrics()
    # Powers of two: their sum is exact in any order (each writer keeps its own sum; a scrape adds them).
    bounds = (2**-10, 2**-7, 2**-3, 1.0)
    mine, ref = CollectorRegistry(), CollectorRegistry()
    h = HotHistogram("x_seconds", "doc", bounds)
    mine.register(h)
    r = Histogram("x_seconds", "doc", buckets=bounds, registry=ref)
    w1, w2 = h.single_writer(), h.single_writer()
    for i, v in enumerate((2**-11, 2**-10, 2**-9, 2**-7, 0.5, 1.0, 3.0, 0.0, 2**-5)):
        (h.observe, w1, w2)[i % 3](v)
        r.observe(v)
    assert generate_latest(mine) == generate_latest(ref)


def test_an_unchanged_histogram_gives_the_same_family_again():
    h = HotHistogram("x_seconds", "doc", (0.1, 1.0))
    w = h.single_writer()
    w(0.5)
    first = next(iter(h.collect()))
    assert next(iter(h.collect())) is first  # a scrape reuses its text (ExpositionCache)
    w(0.5)
    again = next(iter(h.collect()))
    assert again is not first and again.samples[-1].value == 1.0  # the sum of two observations
