"""Commits through the instance server, its threads spread over the CPUs or on one (``--cpus``).

    .venv/bin/python bench/server.py            # writes its section of bench/RESULTS.md
    .venv/bin/python bench/server.py --quick    # shorter, prints only

A ``group``-durability instance is served by ``multisite server start`` (a process of its own);
16 client threads in this process commit single-update transactions through ``multisite.connect``
(one TCP connection each) for a few seconds. The server is started without ``--cpus``, then with
``--cpus`` naming one CPU, alternately, ``ROUNDS`` times each; the figure is commits per second
over all rounds of a configuration.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import multisite
from multisite.server.process import start_server, stop_server
from results import git_state, markers, write_section

HERE = Path(__file__).resolve().parent
CLIENTS = 16
ROUNDS = 3
console = Console()


def commit_load(addr: str, seconds: float, clients: int = CLIENTS, beside: list[threading.Thread] = (),
                stop: threading.Event | None = None, mark=lambda: None) -> tuple[int, float]:
    """(commits, seconds) of ``clients`` threads committing single-update transactions to region acct of
    the server at ``addr`` for ``seconds`` after a second of warm-up; the ``beside`` threads run over the
    same span and end when ``stop`` (given to them) is set; ``mark()`` is called as the measured window
    opens and as it closes."""
    stop, counts = stop or threading.Event(), [0] * clients

    def client(t: int) -> None:
        db, i = multisite.connect(addr), t * 10**9
        while not stop.is_set():
            db.set("acct", ("k", i), {"n": i})
            i += 1
            counts[t] += 1

    ths = [threading.Thread(target=client, args=(t,)) for t in range(clients)] + list(beside)
    for th in ths:
        th.start()
    try:
        time.sleep(1.0)
        mark()
        n0, t0 = sum(counts), time.perf_counter()
        time.sleep(seconds)
        n, dt = sum(counts) - n0, time.perf_counter() - t0
        mark()
        return n, dt
    finally:
        stop.set()
        for th in ths:
            th.join()


def one_run(work: Path, cpus: str | None, seconds: float) -> tuple[int, float]:
    """(commits, seconds) of 16 clients against a fresh server, after a second of warm-up."""
    root = multisite.create(work / f"S-{time.monotonic_ns()}", name="S", durability="group")
    info = start_server(root, "127.0.0.1:0", cpus)
    addr = f"127.0.0.1:{info['client_port']}"
    try:
        multisite.connect(addr).create_region("acct")
        return commit_load(addr, seconds)
    finally:
        stop_server(root)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short round each; prints, does not write RESULTS.md")
    a = ap.parse_args()
    seconds, rounds = (2.0, 1) if a.quick else (4.0, ROUNDS)
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    work = HERE / "out" / f"server-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    totals = {None: [0, 0.0], cpu: [0, 0.0]}
    try:
        for r in range(rounds):
            for cpus in (None, cpu) if r % 2 == 0 else (cpu, None):
                with console.status(f"round {r + 1}/{rounds}, server on {'CPU ' + cpus if cpus else 'every CPU'} ..."):
                    n, dt = one_run(work, cpus, seconds)
                totals[cpus][0] += n
                totals[cpus][1] += dt
    finally:
        shutil.rmtree(work, ignore_errors=True)
    spread = totals[None][0] / totals[None][1]
    pinned = totals[cpu][0] / totals[cpu][1]
    t = Table(title=f"{CLIENTS} client threads, group durability, through the instance server")
    t.add_column("server")
    t.add_column("commits/s", justify="right")
    t.add_column("ratio", justify="right")
    t.add_row("on every CPU", f"{spread:,.0f}", "1.00x")
    t.add_row(f"--cpus {cpu}", f"{pinned:,.0f}", f"{pinned / spread:.2f}x")
    console.print(t)
    if a.quick:
        return
    begin, end = markers("server.py")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    write_section("server.py", "\n".join([
        begin, "## Commits through the instance server (`bench/server.py`)", "",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on commit {git_state()}: {machine}; load average "
        f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after. {CLIENTS} client threads (this process, one "
        f"connection each) commit single-update transactions through `multisite.connect` to a "
        f"group-durability instance served by `multisite server start`; {rounds} rounds of {seconds:g} s per "
        f"configuration, alternating.", "",
        "| server | commits/s | ratio |", "|---|---:|---:|",
        f"| on every CPU | {spread:,.0f} | 1.00x |",
        f"| `--cpus {cpu}` | {pinned:,.0f} | {pinned / spread:.2f}x |", "",
        "No target: this measures the `--cpus` option. The figure is bound by each request's round trip "
        "(a thread per connection in the server) and by the clients sharing one process, not by the disk.", "",
        "Reproduce: `.venv/bin/python bench/server.py` (`--quick` for a short run that only prints).", end]) + "\n")
    console.print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
