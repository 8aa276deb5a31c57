"""Act 5's live table: placement and backlog from the catalog's status, refreshed a few times a second,
with the act's events and the catalog's own (a container lost, one registered) printed above it.

It is apart from ``grid.py`` (the act's processes, writer and story) because it only reads: the
catalog's status and log, the processes' pids, the writer's counts. It also holds what both sides
share: how long a phase may take (``PHASE_TIMEOUT_S``), how often the status is read
(``REFRESH_S``) and ``ActFailed``, which a phase that did not happen in time raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from .board import read_complete_lines

PHASE_TIMEOUT_S = 30.0
REFRESH_S = 0.25
BOARD_TITLE = "placement and backlog (✓: a current sync replica)"
CATALOG_EVENTS = ("lost: no heartbeat", " registered (")  # the single catalog's log lines shown as events


class ActFailed(Exception):
    """A phase of the act did not happen as told (the act reports it and fails)."""


class Processes(Protocol):
    """What the board reads of the act's ``grid.GridProcesses``."""

    pids: dict[str, int | None]

    def dir(self, name: str) -> Path: ...

    def status(self) -> dict | None: ...


class Writer(Protocol):
    """What the board reads of the act's ``grid.GridWriter``."""

    committed: int
    refusals: int
    unknowns: int
    error: BaseException | None


class GridBoard:
    """Placement and backlog from the catalog's status, a few times a second; events above it.

    A replica's backlog is its primary's seqno minus its own, as the containers last reported them in
    their heartbeats (a quarter of the heartbeat timeout apart, hence never below 0 here)."""

    def __init__(self, console: Console, procs: Processes, writer: Writer | None,
                 logs: dict[str, Path] | None = None, patterns: tuple[str, ...] = CATALOG_EVENTS) -> None:
        """``logs``: the catalogs' logs by label (default the single catalog's), whose lines holding one
        of ``patterns`` are shown as events."""
        self.console, self.procs, self.writer = console, procs, writer
        self.t0 = time.monotonic()
        self.status: dict | None = None
        self.mark = (0, 0.0)  # the writer's count and the time at a moment the act waits from
        logs = logs or {"catalog": procs.dir("catalog") / "log" / "catalog.log"}
        self._logs = {label: LogTail(path) for label, path in logs.items()}
        self._patterns = patterns
        self._live = Live(console=console, auto_refresh=False, redirect_stdout=False)

    def __enter__(self) -> GridBoard:
        self._live.start()
        for tail in self._logs.values():
            tail.skip()
        self.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        self._live.stop()
        if not self.console.is_terminal:
            self.console.line()

    def event(self, message: str) -> None:
        self._live.console.print(f"[dim]{time.monotonic() - self.t0:5.1f} s[/] {message}")

    def refresh(self) -> dict | None:
        st = self.procs.status()
        if st is not None:
            self._changes(self.status, st)
            self.status = st
        for label, tail in self._logs.items():
            for line in tail.new_lines():
                if any(p in line for p in self._patterns):
                    self.event(f"[cyan]{label}[/]: {escape(line)}")
        self._live.update(self.render(), refresh=True)
        return self.status

    def wait_until(self, done: Callable[[dict], bool], what: str, timeout_s: float = PHASE_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.refresh()
            if self.writer is not None and self.writer.error is not None:
                raise ActFailed(f"the writer failed: {self.writer.error!r}")
            if st is not None and done(st):
                return st
            if time.monotonic() > deadline:
                raise ActFailed(f"{what}: not done within {timeout_s:.0f} s")
            time.sleep(REFRESH_S)

    def _changes(self, old: dict | None, new: dict) -> None:
        """Promotions and replicas placed or taken over, grouped, as events."""
        if old is None:
            return
        was, now = (old.get("coordination") or {}).get("leader"), (new.get("coordination") or {}).get("leader")
        if was != now:
            self.event(f"[bold]leading catalog: {now or 'none'}[/] (was {was or 'none'}; status from "
                       f"{(new.get('coordination') or {}).get('this')})")
        moves: dict[str, list[str]] = {}
        up = {c["name"] for c in new["containers"] if c["up"]}
        for a, b in zip(old["partitions"], new["partitions"]):
            p = b["partition"]
            if a["primary"] != b["primary"]:
                if a["primary"] not in up:
                    how = f"{b['primary']} promoted to primary ({a['primary']} lost)"
                else:
                    how = f"{b['primary']} primary by a planned swap with {a['primary']} (primaries evened out)"
                moves.setdefault(how, []).append(
                    f"p{p} epoch {a['epoch']}→{b['epoch']}")
            for role in ("sync", "async"):
                for c in sorted(set(b[role]) - set(a[role]) - {a["primary"]}):
                    took = " (taking over its asynchronous replica)" if role == "sync" and c in a["async"] else ""
                    moves.setdefault(f"{role} replica placed on {c}{took}", []).append(f"p{p}")
        for what, parts in moves.items():
            self.event(f"[bold]{what}[/]: {', '.join(parts)}")

    def render(self) -> Group:
        st = self.status
        table = Table(title=BOARD_TITLE, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                      collapse_padding=True, caption_justify="left", caption=self._caption())
        for col in ("partition", "epoch", "primary", "seqno", "sync", "backlog", "async", "backlog "):
            table.add_column(col, justify="right" if col in ("epoch", "seqno") or col.startswith("backlog")
                             else "left", no_wrap=True)
        if st is None:
            return Group(table)
        up = {c["name"] for c in st["containers"] if c["up"]}
        for p in st["partitions"]:
            top = p["seqnos"].get(p["primary"])
            prim = p["primary"] if p["primary"] in up else f"[bold red]{p['primary']} down[/]"
            sync = [_replica(p, c, up, " ✓" if c in p["current"] else " [yellow]catching up[/]") for c in p["sync"]]
            asyn = [_replica(p, c, up) for c in p["async"]]
            table.add_row(f"p{p['partition']}", str(p["epoch"]), prim, "—" if top is None else f"{top:,}",
                          " ".join(s for s, _ in sync) or "[red]none[/]", " ".join(b for _, b in sync),
                          " ".join(s for s, _ in asyn) or "[yellow]none[/]", " ".join(b for _, b in asyn))
        return Group(table, self._containers(st))

    def _caption(self) -> str:
        w, co = self.writer, (self.status or {}).get("coordination")
        lines = [] if w is None else [f"writer: {w.committed:,} acked, {w.refusals:,} refused by the vote, "
                                      f"{w.unknowns:,} unknown"]
        if co:
            cats = ", ".join(c["name"] + (" (leader)" if c["leader"] else "") for c in co["catalogs"])
            etcd = (self.status or {}).get("etcd") or []
            lines.append(f"catalogs in etcd: {cats}; status from {co['this']}; etcd members healthy: "
                         f"{sum(1 for m in etcd if m['healthy'])}/{len(etcd)}")
        return "\n".join(lines)

    def _containers(self, st: dict) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        for col in ("container", "pid", "state", "shards", "primaries", "heartbeat age"):
            t.add_column(col, justify="left" if col in ("container", "state") else "right", no_wrap=True)
        for c in st["containers"]:
            pid = self.procs.pids.get(c["name"])
            state = "up" if c["up"] else "[bold red]down[/]"
            t.add_row(c["name"], str(pid) if pid else "—", state, str(c["shards"]), str(c["primaries"]),
                      f"{c['last_heartbeat_age_s']:.2f} s")
        return t


def _replica(p: dict, c: str, up: set[str], mark: str = "") -> tuple[str, str]:
    """A replica's cell and its backlog's: its primary's seqno minus its own."""
    if c not in up:
        return f"[red]{c} down[/]", "—"
    top, s = p["seqnos"].get(p["primary"]), p["seqnos"].get(c)
    return c + mark, "—" if s is None or top is None else f"{max(0, top - s):,}"


@dataclass
class LogTail:
    """New complete lines of a log file, without their "time logger LEVEL" prefix."""

    path: Path
    _offset: int = field(default=0)

    def skip(self) -> None:
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def new_lines(self) -> list[str]:
        lines, self._offset = read_complete_lines(self.path, self._offset)
        return [ln.split(" ", 4)[-1] for ln in lines]
