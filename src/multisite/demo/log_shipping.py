"""Act 2 (log shipping): a primary and two secondaries, A → B → C, as instance servers on 127.0.0.1.

A is the primary; B replicates from A, and C from B (a cascade: B's Update Process feeds B's own
journal pool, which B's Source Server for C reads). While a workload commits to A through the client
protocol, B's instance server is SIGKILLed, and with it its Receiver Server, its Update Process and
its Source Server for C. B stays down until A's journal pool, kept small here, has forgotten what B
needs next. Restarted, B's Receiver Server agrees the restart point with A's Source Server, which
reads the missing transactions from A's journal files and returns to the pool once caught up; C
resumes from B. At the end all three servers stop and the instances are compared key by key.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from ..errors import MultisiteError
from ..testing.cluster import Cluster, Node
from .board import LogFollower, Row, StatusBoard
from .compare import Snapshot, report
from .workload import TransferWorkload, WorkloadFailed

TRANSACTIONS = 6_000
TRANSACTIONS_PER_S = 500  # offered to A: about 12 s of workload
JOURNAL_POOL_BYTES = 256 * 1024  # about 1,400 of the workload's transactions
KILL_AT_SEQNO = 1_500
DOWN_MIN_S = 2.0  # B stays down at least this long, so that the board shows it
PHASE_TIMEOUT_S = 60.0
BOARD_TITLE = "A primary → B secondary → C cascading secondary"
SOURCE_EVENTS = ("connected to", "lost", "reading journal files", "back to the journal pool")


def act_log_shipping(console: Console, root: Path, *, transactions: int = TRANSACTIONS) -> bool:
    console.rule("[bold]Act 2: log shipping A → B → C, a SIGKILLed secondary, journal-file catch-up")
    cluster = Cluster(root / "log-shipping", journal_pool_bytes=JOURNAL_POOL_BYTES)
    workload: TransferWorkload | None = None
    try:
        a, b, c = _start_topology(console, cluster)
        workload = TransferWorkload(a, transactions, rate_per_s=TRANSACTIONS_PER_S)
        rows = [Row(a, "primary"), Row(b, "← A", upstream=a), Row(c, "← B", upstream=b)]
        follow = (LogFollower("A→B", a.root / "log" / "source-B.log", SOURCE_EVENTS),
                  LogFollower("B→C", b.root / "log" / "source-C.log", SOURCE_EVENTS),
                  LogFollower("B receiver", b.root / "log" / "receiver.log", ("receiving from",)))
        with StatusBoard(console, rows, workload, BOARD_TITLE, follow) as board:
            workload.start()
            _kill_and_restart(board, b, c)
            _catch_up(board, workload)
            via_files = board.source_status(rows[1])
    except (TimeoutError, MultisiteError, WorkloadFailed) as e:
        console.print(f"[bold red]log shipping act stopped: {e}[/]")
        return False
    finally:
        if workload is not None:
            workload.stop()
        cluster.stop_all()
    files_ok = _took_journal_file_path(console, via_files)
    console.print("servers stopped; comparing the three instances ...")
    same = report(console, Snapshot.of(a), [Snapshot.of(b), Snapshot.of(c)])
    console.print("[bold green]A, B and C hold the same data and the same journal[/]" if same
                  else "[bold red]REPLICATION CHECK FAILED: the instances differ[/]")
    return same and files_ok


def _start_topology(console: Console, cluster: Cluster) -> tuple[Node, Node, Node]:
    a, b, c = (cluster.instance(name) for name in "ABC")
    cluster.link(a, b)
    cluster.link(b, c)
    for n in (a, b, c):
        console.print(f"instance server {n.name}: pid {n.pid}, clients on 127.0.0.1:{n.client_port}"
                      + (f", receiver on 127.0.0.1:{n.receiver_port}" if n.receiver_port else "")
                      + f", journal pool {JOURNAL_POOL_BYTES // 1024} KiB")
    console.print("links: A's Source Server → B's Receiver Server; B's Source Server → C's Receiver Server")
    return a, b, c


def _kill_and_restart(board: StatusBoard, b: Node, c: Node) -> None:
    board.wait_until(lambda _: board.seqno("A") >= KILL_AT_SEQNO, PHASE_TIMEOUT_S,
                     f"the workload reaching seqno {KILL_AT_SEQNO:,} on A")
    seen, pid = board.seqno("B"), b.pid
    b.kill()
    killed_at = time.monotonic()
    board.event(f"[bold red]SIGKILL[/] B's instance server (pid {pid}) at about seqno {seen:,}: its Receiver "
                "Server, Update Process and Source Server for C die with it")
    board.wait_until(lambda st: _pool_start(st) > seen + 1 and time.monotonic() - killed_at >= DOWN_MIN_S,
                     PHASE_TIMEOUT_S, "A's journal pool moving past B")
    b.start()
    restart = b.seqno()
    board.event(f"B's instance server restarted (pid {b.pid}); recovery left it at seqno {restart:,}, and A's "
                f"journal pool now starts at {_pool_start(board.statuses):,}")
    board.wait_until(lambda st: _pool_start(st) > restart + 1, PHASE_TIMEOUT_S, "A's journal pool moving past B")
    b.start_receiver(b.receiver_port)
    b.start_source(c)
    board.event(f"B's Receiver Server listens again on port {b.receiver_port}; its Source Server for C restarted")


def _took_journal_file_path(console: Console, src: dict | None) -> bool:
    """Did A's Source Server for B read journal files after B's restart, and go back to the pool?"""
    reads, now = (src["file_reads"], src["reading_from"]) if src else (0, "?")
    ok = reads > 0 and now == "pool"
    console.print(f"A's Source Server for B: {reads} batch read(s) of journal files after B's restart, now reading "
                  f"from the {now}: " + ("[green]OK[/]" if ok else "[bold red]FAILED[/] (expected files, then pool)"))
    return ok


def _pool_start(statuses: dict) -> int:
    return statuses["A"]["pool"]["first_seqno"] if statuses["A"] else 0


def _catch_up(board: StatusBoard, workload: TransferWorkload) -> None:
    """Until the workload is done and B and C have applied, and their sources confirmed, all of it."""
    restarted = time.monotonic()

    def caught_up(_: dict) -> bool:
        sources = [board.source_status(row) for row in board.rows if row.upstream]
        return (workload.done and board.seqno("B") == board.seqno("C") == board.seqno("A") >= 0
                and all(s is not None and s["backlog"] == 0 for s in sources))

    board.wait_until(caught_up, PHASE_TIMEOUT_S, "B and C catching up with A")
    board.event(f"[bold green]B and C caught up with A[/] at seqno {board.seqno('A'):,}, "
                f"{time.monotonic() - restarted:.1f} s after B's restart; workload done")
