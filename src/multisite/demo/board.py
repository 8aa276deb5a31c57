"""The live status board: one row per instance server, refreshed a few times a second.

A secondary's backlog, reading position and connection state come from the Source Server that
feeds it, which runs in its upstream instance (A's for B, B's for C in a cascade); its lag is the
workload's view (see ``workload``). A server that is down shows as such, and so do the numbers that
only it could give. Events print above the table as the act goes, stamped with the act's clock:
the act's own, and the servers' in their own words (lines of their logs that match a pattern).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ..errors import MultisiteError
from ..testing.cluster import Node
from .workload import TransferWorkload, WorkloadFailed

REFRESH_INTERVAL_S = 0.25
Statuses = dict[str, dict | None]


@dataclass
class Row:
    node: Node
    role: str
    upstream: Node | None = None  # the instance whose Source Server feeds this one


def read_complete_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines of ``path`` after byte ``offset`` (a line still being written waits for the
    next call), and the offset after them; none if the file does not exist yet."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    return complete.decode(errors="replace").splitlines(), offset + len(complete)


@dataclass
class LogFollower:
    """New lines of a server's log that contain one of ``patterns``, as ``label: message``."""

    label: str
    path: Path
    patterns: tuple[str, ...]
    _offset: int = field(default=0, init=False)

    def new_lines(self) -> list[str]:
        lines, self._offset = read_complete_lines(self.path, self._offset)
        out = []
        for line in lines:
            message = line.split(": ", 1)[-1]  # drop "time LEVEL logger: "
            if not message.startswith("stats:") and any(p in message for p in self.patterns):
                out.append(f"[cyan]{self.label}[/]: {escape(message)}")
        return out


class StatusBoard:
    def __init__(self, console: Console, rows: list[Row], workload: TransferWorkload, title: str,
                 follow: tuple[LogFollower, ...] = ()):
        self.console, self.rows, self.workload, self.title = console, rows, workload, title
        self.follow = list(follow)
        self.t0 = time.monotonic()
        self.statuses: Statuses = {}
        self._live = Live(console=console, auto_refresh=False, redirect_stdout=False)

    def __enter__(self) -> "StatusBoard":
        self._live.start()
        self.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        self._live.stop()
        if not self.console.is_terminal:  # rich ends a terminal's live display with a newline, not a file's
            self.console.line()

    def event(self, message: str) -> None:
        self._live.console.print(f"[dim]{time.monotonic() - self.t0:5.1f} s[/] {message}")

    def refresh(self) -> Statuses:
        self.statuses = {r.node.name: _status(r.node) for r in self.rows}
        for f in self.follow:
            for line in f.new_lines():
                self.event(line)
        self._live.update(self.render(), refresh=True)
        return self.statuses

    def wait_until(self, done: Callable[[Statuses], bool], timeout_s: float, what: str) -> Statuses:
        """Refresh until ``done(statuses)``; raise TimeoutError naming ``what`` after ``timeout_s``, and
        WorkloadFailed as soon as the workload has."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.refresh()
            self._check_workload()
            if done(st):
                self._check_workload()  # it may have failed while done() looked
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done within {timeout_s:.0f} s")
            time.sleep(REFRESH_INTERVAL_S)

    def _check_workload(self) -> None:
        if self.workload.error is not None:
            raise WorkloadFailed(f"the workload failed: {self.workload.error!r}")

    def seqno(self, name: str) -> int:
        """The last polled seqno of ``name``; -1 while its server is down."""
        st = self.statuses.get(name)
        return st["seqno"] if st else -1

    def source_status(self, row: Row) -> dict | None:
        """The status of the Source Server that feeds ``row`` (None if its server is down)."""
        up = self.statuses.get(row.upstream.name) if row.upstream else None
        return up["sources"].get(row.node.name) if up else None

    def render(self) -> Table:
        w = self.workload
        table = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                      collapse_padding=True, caption_justify="left",
                      caption=f"workload: {w.committed:,}/{w.transactions:,} transactions committed to {w.node.name}")
        for col in ("instance", "pid", "seqno", "backlog", "lag", "link", "reading", "file reads"):
            table.add_column(col, justify="left" if col in ("instance", "link", "reading") else "right", no_wrap=True)
        for row in self.rows:
            table.add_row(*self._cells(row))
        return table

    def _cells(self, row: Row) -> tuple[str, ...]:
        st = self.statuses.get(row.node.name)
        name = f"{row.node.name} {row.role}"
        pid = str(st["pid"]) if st else "[bold red]down[/]"
        seqno = f"{st['seqno']:,}" if st else "—"
        if row.upstream is None:
            return name, pid, seqno, "", "", "", "", ""
        lag = f"{self.workload.lag_s(st['seqno']):.2f} s" if st else "—"
        src = self.source_status(row)
        if src is None:
            return name, pid, seqno, "—", lag, f"[red]{row.upstream.name} down[/]", "—", "—"
        link = src["state"] if src["state"] == "streaming" else f"[yellow]{src['state']}[/]"
        reading = "[bold magenta]files[/]" if src["reading_from"] == "files" else src["reading_from"]
        return name, pid, seqno, f"{src['backlog']:,}", lag, link, reading, str(src["file_reads"])


def _status(node: Node) -> dict | None:
    if node.pid is None:
        return None
    try:
        return node.status()
    except MultisiteError:
        return None
