"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver through selenium) against a
running A → B → C cascade of real instance servers, the dashboard a process of its own.

The page must show three instances and two links, plot lag points, turn A→B to disconnected within a
few seconds of B's server being SIGKILLed, and link each lost-transaction file to its content. A
screenshot is saved in the test's tmp folder (``dashboard.png``, and ``dashboard-b-killed.png``) for a
person to look at. Without a browser the test is skipped, saying what to install."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from multisite.testing.checks import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver (make setup does, as root)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1400,1500", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()


def start_dashboard(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    out = open(tmp_path / "dashboard.out", "w+")
    proc = subprocess.Popen([sys.executable, "-c", "from multisite.cli.main import main; main()", "dashboard", *args],
                            stdout=subprocess.PIPE, stderr=out, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    line = proc.stdout.readline()
    assert line.startswith("dashboard on http://"), f"{line!r}; stderr: {(tmp_path / 'dashboard.out').read_text()}"
    return proc, line.split()[-1].rstrip("/")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def js(drv, expr: str):
    return drv.execute_script(f"return {expr};")


def svg(drv, kind: str) -> dict:
    """The map's nodes or links as the page has them now, read in one script (the page redraws the map
    every second, so an element found in one call may be gone in the next)."""
    return drv.execute_script(
        "const out = {}; document.querySelectorAll('#topology g." + kind + "').forEach(e => "
        "out[e.dataset.name || e.dataset.link] = Object.assign({}, e.dataset)); return out;")


def test_dashboard_shows_a_cascade_and_a_killed_secondary(cluster, browser, tmp_path):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    cluster.link(a, b)
    cluster.link(b, c)
    with a.client() as db:
        db.create_region("acct")
        for i in range(30):
            db.set("acct", ("k", i), i)
    cluster.wait_caught_up(a, b)
    cluster.wait_caught_up(b, c)
    # A lost-transaction file on C, for the page's list and link: C rolled back past its last 5.
    c.call("receiver.stop")
    c.call("rollback", resync=25)
    proc, url = start_dashboard(tmp_path, "--listen", "127.0.0.1:0", "--interval", "0.5", str(a.root), str(b.root),
                                str(c.root))
    try:
        browser.get(url + "/")
        wait_until(lambda: js(browser, "window.dashboard && window.dashboard.polls") >= 3, timeout_s=20,
                   what="the page polled /api three times")
        nodes = svg(browser, "node")
        assert {n: v["role"] for n, v in nodes.items()} == {"A": "primary", "B": "cascading", "C": "secondary"}
        links = {n: v["state"] for n, v in svg(browser, "link").items()}
        assert links == {"A→B": "streaming", "B→C": "disconnected"}  # C's receiver was stopped
        assert int(js(browser, "document.getElementById('lag-plot').dataset.points")) > 0
        assert js(browser, "window.dashboard.plots['lag-plot'].data[0].length") > 0
        assert browser.find_elements("css selector", "#lag-plot canvas"), "uPlot drew no canvas"
        # History records and lost files, each linked to its content.
        wait_until(lambda: browser.find_elements("css selector", "#lost a.lost-file"), timeout_s=10,
                   what="the lost-file link")
        href = js(browser, "document.querySelector('#lost a.lost-file').href")
        content = json.loads(urllib.request.urlopen(href, timeout=10).read())
        assert content["instance"] == "C" and len(content["transactions"]) == 5
        assert "root primary" in js(browser, "document.getElementById('history').innerText")
        browser.save_screenshot(str(tmp_path / "dashboard.png"))

        b.kill()
        t0 = time.monotonic()
        wait_until(lambda: svg(browser, "link")["A→B"]["state"] == "disconnected", timeout_s=10,
                   what="A→B disconnected")
        took = time.monotonic() - t0
        assert took < 6, f"A→B turned disconnected after {took:.1f} s"
        wait_until(lambda: svg(browser, "node")["B"]["reachable"] == "false", timeout_s=5, what="B unreachable")
        browser.save_screenshot(str(tmp_path / "dashboard-b-killed.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        print(f"screenshots: {tmp_path / 'dashboard.png'}, {tmp_path / 'dashboard-b-killed.png'}")
    finally:
        stop(proc)


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_non_local_clients_need_the_token(cluster, tmp_path):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to connect from")
    a = cluster.instance("A")
    proc, url = start_dashboard(tmp_path, "--listen", "0.0.0.0:0", "--token", "s3cret", str(a.root))
    port = url.rsplit(":", 1)[1]
    try:
        local = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=10).read())
        assert [i["name"] for i in local["instances"]] == ["A"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{ip}:{port}/api/state", timeout=10)
        assert e.value.code == 403 and b"token" in e.value.read()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{ip}:{port}/api/state?token=wrong", timeout=10)
        ok = json.loads(urllib.request.urlopen(f"http://{ip}:{port}/api/state?token=s3cret", timeout=10).read())
        assert ok["instances"][0]["name"] == "A"
        req = urllib.request.Request(f"http://{ip}:{port}/", headers={"Authorization": "Bearer s3cret"})
        assert b"multisite dashboard" in urllib.request.urlopen(req, timeout=10).read()
    finally:
        stop(proc)


def test_a_metrics_address_is_a_target(cluster, tmp_path):
    """An instance reached only through its /metrics (as one on another machine would be)."""
    a = cluster.instance("A", start=False).start(metrics=True)
    b = cluster.instance("B")
    cluster.link(a, b)
    proc, url = start_dashboard(tmp_path, "--listen", "127.0.0.1:0", f"127.0.0.1:{a.metrics_port}")
    try:
        def state():
            return json.loads(urllib.request.urlopen(url + "/api/state", timeout=10).read())
        st = wait_until(lambda: (s := state())["links"] and s["links"][0]["state"] == "streaming" and s,
                        timeout_s=15, what="A→B streaming through /metrics")
        assert [(i["name"], i["role"], i["reachable"]) for i in st["instances"]] == [("A", "primary", True),
                                                                                     ("B", "unknown", False)]
        assert st["links"][0]["id"] == "A→B"
    finally:
        stop(proc)
