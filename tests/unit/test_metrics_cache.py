"""ExpositionCache (what ``/metrics`` answers with): byte for byte prometheus-client's ``generate_latest`` of
the same registry however the families change between scrapes, formatting again only those that changed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily

from multisite.net.metrics import ExpositionCache, HotHistogram


class Links:
    """A collector like the instance's: a labelled gauge per link and an unlabelled one, from plain fields."""

    def __init__(self) -> None:
        self.links: dict[str, float] = {"B": 0.0}
        self.seqno = 0
        self.with_extra = False

    def collect(self):
        g = GaugeMetricFamily("t_seqno", "seqno")
        g.add_metric([], self.seqno)
        yield g
        b = GaugeMetricFamily("t_backlog", "backlog by link", labels=["secondary"])
        for k, v in sorted(self.links.items()):
            b.add_metric([k], v)
        yield b
        if self.with_extra:
            e = GaugeMetricFamily("t_extra", 'a "quoted" help\nand a new line', labels=["path"])
            e.add_metric(['C:\\x "y"'], float("nan"))
            yield e


def registry():
    disable_created_metrics()
    reg, links = CollectorRegistry(auto_describe=False), Links()
    reg.register(links)
    hist = HotHistogram("t_seconds", "latency", (0.001, 0.01, 0.1))
    reg.register(hist)
    errors = Counter("t_errors", "errors by code", ["code"], registry=reg)
    return reg, links, hist, errors


def test_cached_exposition_is_generate_latest_through_every_change():
    reg, links, hist, errors = registry()
    cache = ExpositionCache(reg)
    steps = [lambda: None, lambda: setattr(links, "seqno", 5), lambda: hist.observe(0.005),
             lambda: links.links.update(C=3.0), lambda: errors.labels("CONFIG").inc(),
             lambda: setattr(links, "with_extra", True), lambda: setattr(links, "with_extra", False),
             lambda: links.links.pop("B"), lambda: links.links.update(C=2.5), lambda: None]
    for step in steps:
        step()
        assert cache.generate() == generate_latest(reg)


def test_unchanged_families_are_not_formatted_again():
    reg, links, hist, errors = registry()
    cache = ExpositionCache(reg)
    first = cache.generate()
    assert cache.formatted == 4 and cache.reused == 0  # seqno, backlog, histogram, errors
    assert cache.generate() == first
    assert cache.formatted == 4 and cache.reused == 4
    links.seqno = 7
    body = cache.generate()
    assert cache.formatted == 5 and cache.reused == 7  # only the seqno family again
    assert b"t_seqno 7.0" in body


def test_a_family_gone_is_forgotten_and_formatted_when_it_comes_back():
    reg, links, _hist, _errors = registry()
    cache = ExpositionCache(reg)
    links.with_extra = True
    cache.generate()
    links.with_extra = False
    assert b"t_extra" not in cache.generate()
    links.with_extra = True
    assert cache.generate() == generate_latest(reg)
