"""Connection documents: what they say and when they fire. Pure: the time is a parameter.

A connection document (form ``Connection``, in an address-book database that replicates like any
other) has the fields:

``source``, ``destination``   server names; the source's Replicator runs the session
``address``                   HOST:PORT of the destination's docserver
``databases``                 a list of titles or replica IDs, or ``"*"`` (all in common)
``mode``                      pull-push, pull-pull, push-only or pull-only
``at``                        an exact time ``"HH:MM[:SS]"`` (UTC) ... or
``range``, ``interval_s``     ``"HH:MM[:SS]-HH:MM[:SS]"`` (UTC) repeated every ``interval_s`` seconds
``days``                      weekdays it runs on (0 = Monday; default every day)
``enabled``                   true or false

``next_run(conn, last_run, now)`` is the first time the connection is due after ``last_run`` (or at
or after ``now`` when it never ran). A time in the past means "due now": a server that was down fires
once for what it missed, not once per miss, and the next run is counted from that run.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from ..errors import ConfigError

MODES = ("pull-push", "pull-pull", "push-only", "pull-only")
DAY_S = 86400
LOOKAHEAD_DAYS = 8


@dataclass(frozen=True)
class Connection:
    unid: str
    source: str
    destination: str
    address: str
    databases: tuple[str, ...] | None  # None: all in common
    mode: str
    at_s: int | None  # seconds after midnight UTC
    range_s: tuple[int, int] | None
    interval_s: float | None
    days: frozenset[int]
    enabled: bool

    def to_dict(self) -> dict:
        return {"unid": self.unid, "source": self.source, "destination": self.destination, "address": self.address,
                "databases": list(self.databases) if self.databases is not None else "*", "mode": self.mode,
                "at": _fmt(self.at_s) if self.at_s is not None else None,
                "range": f"{_fmt(self.range_s[0])}-{_fmt(self.range_s[1])}" if self.range_s else None,
                "interval_s": self.interval_s, "days": sorted(self.days), "enabled": self.enabled}


def _fmt(s: int) -> str:
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _clock(text: object, where: str) -> int:
    if not isinstance(text, str):
        raise ConfigError(f"{where}: a time of day is HH:MM or HH:MM:SS, got {text!r:.40}")
    parts = text.strip().split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or not (0 <= nums[0] < 24 and 0 <= nums[1] < 60 and (len(nums) == 2 or 0 <= nums[2] < 60)):
        raise ConfigError(f"{where}: a time of day is HH:MM or HH:MM:SS, got {text!r}")
    return nums[0] * 3600 + nums[1] * 60 + (nums[2] if len(nums) == 3 else 0)


def parse(unid: str, fields: dict) -> Connection:
    """The connection a document's fields describe; ConfigError naming the field that is wrong."""
    where = f"connection document {unid}"
    for f in ("source", "destination", "address"):
        if not isinstance(fields.get(f), str) or not fields[f]:
            raise ConfigError(f"{where}: field {f!r} must name a server" + (" address HOST:PORT" if f == "address" else ""))
    mode = fields.get("mode", "pull-push")
    if mode not in MODES:
        raise ConfigError(f"{where}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    dbs = fields.get("databases", "*")
    if dbs == "*" or dbs is None:
        databases = None
    elif isinstance(dbs, list) and all(isinstance(d, str) for d in dbs):
        databases = tuple(dbs)
    else:
        raise ConfigError(f"{where}: databases must be \"*\" or a list of titles or replica IDs")
    at_s = range_s = interval = None
    if fields.get("at") is not None:
        at_s = _clock(fields["at"], f"{where}: at")
    elif fields.get("range") is not None:
        r = fields["range"]
        if not isinstance(r, str) or "-" not in r:
            raise ConfigError(f"{where}: range is HH:MM-HH:MM, got {r!r:.40}")
        lo, hi = r.split("-", 1)
        range_s = (_clock(lo, f"{where}: range"), _clock(hi, f"{where}: range"))
        if range_s[1] < range_s[0]:
            raise ConfigError(f"{where}: range {r!r} ends before it starts")
        interval = fields.get("interval_s")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= DAY_S:
            raise ConfigError(f"{where}: a range needs interval_s, seconds in (0, {DAY_S}], got {interval!r}")
    else:
        raise ConfigError(f"{where}: give either at (an exact time) or range with interval_s")
    days = fields.get("days", list(range(7)))
    if not isinstance(days, list) or not all(type(d) is int and 0 <= d <= 6 for d in days):
        raise ConfigError(f"{where}: days is a list of weekdays 0 (Monday) .. 6")
    enabled = fields.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: enabled is true or false")
    return Connection(unid, fields["source"], fields["destination"], fields["address"], databases, mode, at_s,
                      range_s, float(interval) if interval else None, frozenset(days), enabled)


def next_run(conn: Connection, last_run: float | None, now: float) -> float | None:
    """When ``conn`` is next due (epoch seconds, UTC): the first time after ``last_run``, or at or after
    ``now`` if it never ran; None if it is disabled or never runs."""
    if not conn.enabled or not conn.days:
        return None
    after = now if last_run is None else last_run + 1e-6
    day0 = int(after // DAY_S) * DAY_S
    for k in range(LOOKAHEAD_DAYS):
        midnight = day0 + k * DAY_S
        if _dt.datetime.fromtimestamp(midnight, _dt.timezone.utc).weekday() not in conn.days:
            continue
        if conn.at_s is not None:
            t = midnight + conn.at_s
            if t >= after:
                return float(t)
            continue
        lo, hi = midnight + conn.range_s[0], midnight + conn.range_s[1]  # type: ignore[index]
        if after > hi:
            continue
        if after <= lo:
            return float(lo)
        steps = -(-(after - lo) // conn.interval_s)  # ceil
        t = lo + steps * conn.interval_s  # type: ignore[operator]
        if t <= hi:
            return float(t)
    return None
