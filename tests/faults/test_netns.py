"""The network-namespace hosts of the partition tests (testing/netns.py): hosts reach each other and the
test process, a cut drops both ways until healed, isolate leaves the test process, nothing outlives
close, and what a killed run left is removed by the next one (root only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multisite.testing.netns import ROOT, Hosts, cleanup, netns_unavailable

pytestmark = pytest.mark.skipif(bool(netns_unavailable()), reason=netns_unavailable() or "")

PREFIX = "mstnet"
LISTEN = "import socket,sys; s=socket.create_server((sys.argv[1], 7000))\nwhile True: s.accept()[0].close()"


def _reaches(hosts: Hosts, src: str, dst: str) -> bool:
    code = f"import socket; socket.create_connection(('{hosts.address(dst)}', 7000), timeout=0.5)"
    if src == ROOT:
        return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    return hosts.call(src, [sys.executable, "-c", code]).returncode == 0


def _listening(hosts: Hosts, name: str) -> None:
    hosts.run(name, [sys.executable, "-c", LISTEN, hosts.address(name)])
    for _ in range(100):
        if _reaches(hosts, ROOT, name):
            return
    raise AssertionError(f"nothing listens in {name}")


def test_cut_heal_isolate_and_nothing_left_after_close():
    with Hosts(PREFIX, ["a", "b", "c"]) as hosts:
        for n in hosts.names:
            _listening(hosts, n)
        assert _reaches(hosts, "a", "b") and _reaches(hosts, "c", "b")
        hosts.cut("a", "b")
        assert not _reaches(hosts, "a", "b") and not _reaches(hosts, "b", "a")
        assert _reaches(hosts, "c", "b") and _reaches(hosts, ROOT, "b")
        hosts.heal("a", "b")
        assert _reaches(hosts, "a", "b")
        hosts.isolate("a", except_=["c"])
        assert not _reaches(hosts, "b", "a") and _reaches(hosts, "c", "a") and _reaches(hosts, ROOT, "a")
        hosts.cut("a", ROOT)
        assert not _reaches(hosts, ROOT, "a")
        hosts.heal_all()
        assert _reaches(hosts, "b", "a") and _reaches(hosts, ROOT, "a")
    assert PREFIX not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert PREFIX not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_what_a_killed_run_left_is_removed_by_the_next():
    left = Hosts(PREFIX, 2).start()  # never closed, with a process inside: as after a SIGKILLed test run
    proc = left.run("h1", [sys.executable, "-c", "import time; time.sleep(600)"])
    with Hosts(PREFIX, 2) as again:
        assert proc.wait(timeout=10) != 0  # killed by the stale cleanup
        assert again.names == ["h1", "h2"]
    assert cleanup(PREFIX) == []
