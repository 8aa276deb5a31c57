"""What the dashboard shows, computed from instance statuses (sans-IO: no sockets, no clock).

- ``instance_view`` / ``link_state`` / ``topology``: the topology map from the ``status`` of every
  instance the dashboard reaches (and the last status of those it no longer reaches): each instance's
  role (primary, secondary, supplementary, cascading: a secondary that feeds others) and each link's
  state (streaming, xoff, disconnected, refused, passive) with its backlog and lag.
- ``Series``: lag and backlog over time per link, and the commit rate per primary, in memory for
  ``HISTORY_S`` (a ring of fixed length: the poller's interval sets how many points that is).
- ``status_from_metrics``: a remote instance reached through its ``/metrics`` (Prometheus text) turned
  into the same status shape, so that a dashboard can map instances on other machines.
- ``connection_rows``: the multi-master connection documents on the schedule map, from what the document
  servers answer (``connections``), one row a document.
- ``access_allowed``: who may read the dashboard (loopback, or a client that shows the token).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections import deque
from typing import Any, Iterable

from ..protocol.messages import RefusalCode

HISTORY_S = 3600.0
LINK_STATES = ("streaming", "xoff", "disconnected", "refused", "passive")
REFUSAL_CODES = frozenset(c.value for c in RefusalCode)
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # a connection document's days: 0 is Monday


def link_state(src: dict[str, Any], source_reachable: bool = True) -> str:
    """The map's state of a link from its Source Server's status (``sources`` of ``status``)."""
    if not source_reachable:
        return "disconnected"  # the Source Server's process is gone: nothing is sent
    st = src.get("state")
    if st == "streaming":
        return "streaming"
    if st == "xoff":
        return "xoff"
    if st == "passive" or src.get("mode") == "passive":
        return "passive"
    err = src.get("last_error") or ""
    # A refusal is the peer's Error message ("WRONG_NAME: ..."); a TCP "connection refused" is no peer.
    if st == "error" or err.split(":", 1)[0] in REFUSAL_CODES:
        return "refused"
    return "disconnected"


def instance_view(key: str, status: dict[str, Any] | None, reachable: bool, error: str | None = None) -> dict:
    """One node of the map. ``key`` is how the dashboard reaches it (a directory or an address)."""
    st = status or {}
    role = st.get("role", "unknown")
    if st.get("supplementary"):
        role = "supplementary"
    elif role == "secondary" and st.get("sources"):
        role = "cascading"
    return {"key": key, "name": st.get("name", key), "role": role, "seqno": st.get("seqno"),
            "reachable": reachable, "error": error, "pid": st.get("pid"), "metrics": st.get("metrics"),
            "durability": st.get("durability")}


def topology(targets: Iterable[tuple[str, dict[str, Any] | None, bool, str | None]]) -> dict[str, Any]:
    """The map from ``(key, last status or None, reachable now, error)`` per target: instances and links.
    A link is drawn from each Source Server (``A -> B`` named ``A→B``); its far end need not be a
    target (it is then an instance the dashboard only knows by name)."""
    instances, links, names = [], [], set()
    for key, status, reachable, error in targets:
        v = instance_view(key, status, reachable, error)
        instances.append(v)
        names.add(v["name"])
        for sec, src in sorted(((status or {}).get("sources") or {}).items()):
            links.append({"id": f"{v['name']}→{sec}", "from": v["name"], "to": sec,
                          "state": link_state(src, reachable), "backlog": src.get("backlog", 0),
                          "lag_s": src.get("lag_s", 0.0), "last_error": src.get("last_error"),
                          "connect": src.get("connect")})
    for ln in links:
        if ln["to"] not in names:
            names.add(ln["to"])
            instances.append(instance_view(ln["to"], {"name": ln["to"]}, False, "not one of the dashboard's targets"))
    return {"instances": instances, "links": links}


class Series:
    """Points over the last ``HISTORY_S`` seconds: per link ``lag_s`` and ``backlog``, per primary the
    commit rate (transactions per second between two polls)."""

    def __init__(self, interval_s: float, history_s: float = HISTORY_S):
        self.points = max(2, int(history_s / interval_s) + 1)
        self.links: dict[str, dict[str, deque]] = {}
        self.commits: dict[str, dict[str, deque]] = {}
        self._last_seqno: dict[str, tuple[float, int]] = {}

    def _ring(self, table: dict[str, dict[str, deque]], name: str, fields: tuple[str, ...]) -> dict[str, deque]:
        if name not in table:
            table[name] = {f: deque(maxlen=self.points) for f in ("t",) + fields}
        return table[name]

    def add(self, now: float, topo: dict[str, Any], statuses: dict[str, dict[str, Any]]) -> None:
        """One poll at ``now`` (Unix seconds): the topology built from it and the statuses by name."""
        for ln in topo["links"]:
            r = self._ring(self.links, ln["id"], ("lag_s", "backlog"))
            r["t"].append(now)
            r["lag_s"].append(ln["lag_s"])
            r["backlog"].append(ln["backlog"])
        for v in topo["instances"]:
            st = statuses.get(v["name"])
            if not v["reachable"] or st is None or st.get("role") != "primary" or st.get("seqno") is None:
                continue
            seqno = int(st["seqno"])
            prev = self._last_seqno.get(v["name"])
            self._last_seqno[v["name"]] = (now, seqno)
            if prev is None or now <= prev[0]:
                continue
            r = self._ring(self.commits, v["name"], ("rate",))
            r["t"].append(now)
            r["rate"].append(max(0, seqno - prev[1]) / (now - prev[0]))

    def to_json(self) -> dict[str, Any]:
        return {"links": {k: {f: list(d) for f, d in r.items()} for k, r in self.links.items()},
                "commits": {k: {f: list(d) for f, d in r.items()} for k, r in self.commits.items()}}


def connection_rows(answers: Iterable[tuple[str, list[dict[str, Any]], str | None]]) -> list[dict[str, Any]]:
    """Schedule-map rows from ``(target, rows of its ``connections``, error)`` per document server. The
    address book replicates, so every server lists every document; a document's row is taken from the
    server that fires it (its ``source``: ``mine``, with the next run), else from the first that lists it."""
    out: list[dict[str, Any]] = []
    by_unid: dict[str, int] = {}
    for key, rows, error in answers:
        if error is not None:
            out.append({"instance": key, "kind": "connection document", "error": error})
            continue
        for r in rows:
            unid = r.get("unid")
            if "error" in r:
                row = {"instance": key, "name": unid, "unid": unid, "kind": "connection document", "error": r["error"],
                       "mine": False}
            else:
                when = f"at {r['at']}" if r.get("at") else f"{r.get('range')} every {r.get('interval_s'):g} s"
                days = r.get("days") or []
                if len(days) < 7:
                    when += " on " + ",".join(WEEKDAYS[d] for d in days)
                row = {"instance": r["source"], "name": f"{r['source']} → {r['destination']}", "unid": unid,
                       "kind": "connection document", "mode": r.get("mode"), "databases": r.get("databases"),
                       "schedule": when, "enabled": r.get("enabled"), "mine": bool(r.get("mine")),
                       "next_run": r.get("next_run"), "updated": r.get("last_run"),
                       "last_result": r.get("last_result"), "runs": r.get("runs", 0)}
            i = by_unid.get(unid) if unid is not None else None
            if i is None:
                if unid is not None:
                    by_unid[unid] = len(out)
                out.append(row)
            elif row["mine"] and not out[i]["mine"]:
                out[i] = row
    return out


def access_allowed(remote: str | None, given_token: str | None, token: str | None) -> bool:
    """Loopback clients need no login; any other client must show the dashboard's token (and there is
    none to show unless the dashboard was started with one)."""
    try:
        ip = ipaddress.ip_address(remote.split("%")[0]) if remote is not None else None
        if ip is not None and (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:  # ::ffff:127.0.0.1 too
            return True
    except ValueError:
        pass
    return bool(token) and given_token is not None and hmac.compare_digest(given_token.encode(), token.encode())


def status_from_metrics(samples: Iterable[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """An instance's status, as much as its ``/metrics`` tells, from ``(name, labels, value)`` samples
    (prometheus-client's parser gives them)."""
    st: dict[str, Any] = {"sources": {}}
    sources: dict[str, dict[str, Any]] = st["sources"]
    for name, labels, value in samples:
        if name == "multisite_instance_info":
            st.update(name=labels.get("name"), role=labels.get("role"), durability=labels.get("durability"))
        elif name == "multisite_instance_seqno":
            st["seqno"] = int(value)
        elif name.startswith("multisite_source_") and "secondary" in labels:
            s = sources.setdefault(labels["secondary"], {"state": "connecting", "mode": "active"})
            if name == "multisite_source_info":
                s["state"], s["mode"] = labels.get("state", "connecting"), labels.get("mode", "active")
            elif name == "multisite_source_backlog_transactions":
                s["backlog"] = int(value)
            elif name == "multisite_source_lag_seconds":
                s["lag_s"] = value
            elif name == "multisite_source_last_confirmed_seqno":
                s["last_confirmed"] = int(value)
    return st
