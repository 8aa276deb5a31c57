"""Connection documents: parsing (with named errors) and when they fire."""

from __future__ import annotations

import calendar

import pytest

from multisite.errors import ConfigError
from multisite.multimaster.schedule import next_run, parse

BASE = {"source": "A", "destination": "B", "address": "127.0.0.1:1"}
MON = calendar.timegm((2026, 11, 23, 0, 0, 0))  # a Monday, midnight UTC


def test_a_range_with_an_interval_fires_every_interval_inside_the_range():
    c = parse("u", {**BASE, "range": "08:00-09:00", "interval_s": 600})
    assert next_run(c, None, MON) == MON + 8 * 3600
    assert next_run(c, MON + 8 * 3600, MON + 8 * 3600) == MON + 8 * 3600 + 600
    assert next_run(c, None, MON + 8 * 3600 + 1) == MON + 8 * 3600 + 600
    assert next_run(c, MON + 9 * 3600, MON + 9 * 3600) == MON + 86400 + 8 * 3600  # next day


def test_an_exact_time_on_given_days_and_missed_runs_fire_once():
    c = parse("u", {**BASE, "at": "06:30", "days": [2]})  # Wednesdays
    assert next_run(c, None, MON) == MON + 2 * 86400 + 6.5 * 3600
    last = MON + 2 * 86400 + 6.5 * 3600
    assert next_run(c, last, last + 30 * 86400) == last + 7 * 86400  # in the past: due at once, once


def test_disabled_connections_never_fire():
    assert next_run(parse("u", {**BASE, "at": "06:30", "enabled": False}), None, MON) is None


@pytest.mark.parametrize("fields,match", [
    ({"at": "25:00"}, "HH:MM"), ({"range": "10:00-09:00", "interval_s": 5}, "ends before"),
    ({"range": "08:00-09:00"}, "interval_s"), ({}, "either at"), ({"at": "01:00", "mode": "sideways"}, "mode"),
    ({"at": "01:00", "days": [7]}, "days"), ({"at": "01:00", "databases": 3}, "databases"),
])
def test_bad_connection_documents_name_the_field(fields, match):
    with pytest.raises(ConfigError, match=match):
        parse("u", {**BASE, **fields})


def test_a_connection_needs_its_servers():
    with pytest.raises(ConfigError, match="source"):
        parse("u", {"destination": "B", "address": "x:1", "at": "01:00"})
