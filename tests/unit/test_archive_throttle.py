"""``journal archive --rate-bytes-per-s``: the rate holds for a --follow run that idled between sealed segments
(or through an outage), not only for a run that copies from its start; a store slower than the rate is not
slowed further. The throttle's clock is a fake one here (its pauses advance it): no real sleeps."""

from __future__ import annotations

import threading
import time

import pytest

from multisite.pipeline import archive as archive_mod
from multisite.pipeline.archive import Throttle


@pytest.fixture()
def clock(monkeypatch):
    """The throttle's clock and sleep, faked for the test's own thread only: ``archive_mod.time`` is the
    ``time`` module, and a thread another test left behind in this process (its sleeps of 0.05 s) must
    neither be counted among the pauses nor stopped from sleeping."""
    now, pauses = [1000.0], []
    me = threading.get_ident()
    real_sleep, real_monotonic = time.sleep, time.monotonic

    def sleep(s: float) -> None:
        if threading.get_ident() != me:
            return real_sleep(s)
        pauses.append(s)
        now[0] += s

    monkeypatch.setattr(archive_mod.time, "monotonic",
                        lambda: now[0] if threading.get_ident() == me else real_monotonic())
    monkeypatch.setattr(archive_mod.time, "sleep", sleep)
    return now, pauses


def test_an_idle_follow_earns_no_burst_beyond_the_rate(clock):
    # The throttle counted bytes from the run's start: after an hour of --follow with nothing to copy, the next
    # 3.6 GB at 1 MB/s went out at full speed (no pause at all).
    now, pauses = clock
    th = Throttle(1e6)
    th(1e6)
    now[0] += 3600  # an hour with nothing sealed
    for _ in range(8):
        th(1e6)
    assert sum(pauses) >= 6.0, pauses  # 8 MB at 1 MB/s: about 8 s (a second's credit at most)


def test_a_store_slower_than_the_rate_is_not_slowed_further(clock):
    now, pauses = clock
    th = Throttle(1e6)
    for _ in range(10):
        th(4e6)  # a 4 MB block at 1 MB/s ...
        now[0] += 8  # ... takes 8 s to upload
    assert sum(pauses) <= 4.0 + 1e-9, pauses  # only the first block's own time
