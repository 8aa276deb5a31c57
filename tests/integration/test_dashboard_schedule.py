"""The schedule map's multi-master part: a document server's HOME given to the dashboard puts its connection
documents (seed 003's scheduled replication) beside the Spark work, in ``/api/schedule`` and on the page,
with their schedule, last and next run; the document server is not drawn on the instance map."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from multisite.multimaster.server import docdb
from multisite.testing.checks import wait_until
from multisite.testing.docservers import DocCluster

from .test_dashboard import browser, start_dashboard, stop  # noqa: F401 - browser: the fixture, used by name


@pytest.fixture
def dc(tmp_path):
    c = DocCluster(tmp_path / "docs", durability="none")
    yield c
    c.stop_all()


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def servers_with_connections(dc):
    """B, and A whose address book holds two connection documents A → B: one every second (it fires), one
    at 03:00 on Mondays and disabled."""
    b = dc.server("B", ["P"])
    a = dc.server("A", ["P", "Names"], replica_of=b, start=False)
    with docdb.open(a.path("Names")) as book:
        book.create("Connection", {"source": "A", "destination": "B", "address": b.address, "databases": ["P"],
                                   "mode": "pull-only", "range": "00:00-23:59:59", "interval_s": 1})
        book.create("Connection", {"source": "A", "destination": "B", "address": b.address, "databases": "*",
                                   "mode": "push-only", "at": "03:00", "days": [0], "enabled": False})
    a.options["start"] = {"address_book": str(a.path("Names"))}
    dc.start(a)
    return a, b


def test_api_schedule_lists_the_connection_documents_with_their_runs(dc, tmp_path):
    a, _b = servers_with_connections(dc)
    proc, url = start_dashboard(tmp_path, "--listen", "127.0.0.1:0", "--interval", "0.5", str(a.home))
    try:
        def rows():
            return {r["mode"]: r for r in get(url + "/api/schedule") if r.get("kind") == "connection document"}
        wait_until(lambda: (rows().get("pull-only") or {}).get("runs", 0) >= 1, timeout_s=15,
                   what="the every-second connection's first run on the schedule map")
        r = rows()
        fired, off = r["pull-only"], r["push-only"]
        assert fired["instance"] == "A" and fired["name"] == "A → B" and fired["mine"] is True
        assert fired["schedule"] == "00:00:00-23:59:59 every 1 s" and fired["databases"] == ["P"]
        assert fired["last_result"].startswith("ok") and fired["updated"] <= time.time()
        assert fired["next_run"] > fired["updated"]  # counted from the last run
        assert off["schedule"] == "at 03:00:00 on Mon" and off["enabled"] is False and off["next_run"] is None
        assert get(url + "/api/state")["instances"] == []  # a document server is not an instance on the map
    finally:
        stop(proc)


def test_the_page_shows_the_connection_documents_on_the_schedule_map(dc, browser, tmp_path):  # noqa: F811
    a, _b = servers_with_connections(dc)
    proc, url = start_dashboard(tmp_path, "--listen", "127.0.0.1:0", str(a.home))
    try:
        browser.get(url + "/")

        def table():
            return browser.execute_script(
                "return [...document.querySelectorAll('#schedule tbody tr.connection')].map(tr => "
                "[...tr.children].map(td => td.textContent));")
        wait_until(lambda: len(table()) == 2, timeout_s=20, what="two connection documents on the schedule map")
        text = {row[3]: row for row in table()}
        assert text["00:00:00-23:59:59 every 1 s, pull-only"][:3] == ["A", "A → B", "connection document"]
        assert "at 03:00:00 on Mon, push-only (disabled)" in text
        browser.save_screenshot(str(tmp_path / "dashboard-schedule.png"))
    finally:
        stop(proc)
