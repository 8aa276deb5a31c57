"""Which CPU the client listener's loop and sync threads share (issue 27: ``sockets.listener_cpu``)."""

import os
import threading

import pytest

from multisite.errors import ConfigError
from multisite.server import sockets


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(sockets.os, "sched_getaffinity", lambda pid: {0, 1})


def test_auto_spreads_servers_over_the_cpus_the_process_may_use(two_cpus, monkeypatch):
    monkeypatch.delenv("MULTISITE_LISTENER_CPU", raising=False)
    picked = set()
    for pid in (4100, 4101, 4102):
        monkeypatch.setattr(sockets.os, "getpid", lambda pid=pid: pid)
        picked.add(sockets.listener_cpu())
        monkeypatch.setenv("MULTISITE_LISTENER_CPU", "auto")
        assert sockets.listener_cpu() in (0, 1)
        monkeypatch.delenv("MULTISITE_LISTENER_CPU")
    assert picked == {0, 1}  # not every server's listener on one CPU


def test_a_named_cpu_none_and_a_wrong_one(two_cpus, monkeypatch):
    monkeypatch.setenv("MULTISITE_LISTENER_CPU", "0")
    assert sockets.listener_cpu() == 0
    monkeypatch.setenv("MULTISITE_LISTENER_CPU", "none")
    assert sockets.listener_cpu() is None
    for bad in ("7", "fast"):
        monkeypatch.setenv("MULTISITE_LISTENER_CPU", bad)
        with pytest.raises(ConfigError, match="MULTISITE_LISTENER_CPU"):
            sockets.listener_cpu()


def test_one_cpu_leaves_the_threads_to_the_scheduler(monkeypatch):
    monkeypatch.setattr(sockets.os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setenv("MULTISITE_LISTENER_CPU", "auto")
    assert sockets.listener_cpu() is None


def test_pin_thread_pins_the_calling_thread_only():
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    seen: list = []

    def run() -> None:
        sockets.pin_thread({cpu})
        seen.append(os.sched_getaffinity(0))

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert seen == [{cpu}] and os.sched_getaffinity(0) == allowed
    sockets.pin_thread(None)  # nothing to do
    assert os.sched_getaffinity(0) == allowed
