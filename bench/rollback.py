"""Failover benchmark (issue 4): rollback throughput and failover time.

    .venv/bin/python bench/rollback.py            # full run (about a minute); updates bench/RESULTS.md
    .venv/bin/python bench/rollback.py --quick    # fewer, smaller runs; prints only

Measures, in a scratch folder under bench/out/ (on the repository's disk):

- **rollback**: an instance holds 50,000 transactions, then 100,000 more (single-update, a third of
  them on new keys, the rest overwriting); ``db.rollback(50000)`` takes the 100,000 off with their
  before-images and writes them to a lost-transaction file (fsynced). Timed in-process around the
  call (journal read, lost file, store undo, journal cut, instance file), on a fresh copy of the
  instance each run; median of several runs. Also timed: the same through the CLI
  (``multisite rollback DIR --resync 50000``), a new process that opens the instance first.
  A second shape: 100,000 transactions of 3 updates each (set, set, zkill; and a kill every 50th).
- **failover**: a primary A and a secondary B, each an instance server, B receiving from A while a
  writer commits to A. A's server is SIGKILLed; the clock starts; then, as a script would:
  ``multisite receiver stop B``, ``multisite instance role B primary``, and a commit to B through
  ``multisite.connect``; the clock stops when that commit returns. Noticing that A is gone is not
  part of the figure (that is the heartbeat timeout, or the operator). Median of several runs,
  each with a new pair.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

import multisite
from results import git_state, markers, write_section
from multisite.journal.lostfile import LostFile, list_lost_files
from multisite.testing.cluster import Cluster

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
BEGIN, END = markers("rollback.py")
MULTISITE = str(Path(sys.executable).with_name("multisite"))
ROLLBACK_TARGET_TPS = 50_000
FAILOVER_TARGET_S = 2.0
BASE_TXNS = 50_000

console = Console()
if not console.is_terminal:
    console = Console(width=200)


# -- rollback ---------------------------------------------------------------------------------------
def build(root: Path, txns: int, shape: str) -> Path:
    multisite.create(root, name="bench", durability="none")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(BASE_TXNS):
            db.set("acct", ("k", i), {"n": i, "pad": "x" * 32})
        for i in range(txns):
            k = BASE_TXNS + i // 2 if i % 3 == 0 else i % BASE_TXNS  # a third new keys, the rest overwrites
            if shape == "single":
                db.set("acct", ("k", k), {"n": i, "pad": "y" * 32})
            else:
                with db.transaction() as tx:
                    tx.set("acct", ("k", k), {"n": i, "pad": "y" * 32})
                    tx.set("acct", ("k", k, "sub"), i)
                    tx.zkill("acct", ("k", (k + 7) % BASE_TXNS))
                    if i % 50 == 0:
                        tx.kill("acct", ("k", (k + 13) % BASE_TXNS))
    return root


def rollback_runs(work: Path, txns: int, runs: int, shape: str) -> tuple[list[float], list[float], dict]:
    """(in-process seconds per run, CLI wall seconds per run, facts from one run)."""
    master = build(work / f"master-{shape}", txns, shape)
    api, cli, facts = [], [], {}
    for r in range(runs):
        for how in ("api", "cli"):
            copy = work / f"run-{shape}-{how}-{r}"
            shutil.copytree(master, copy)
            if how == "api":
                with multisite.open(copy) as db:
                    t0 = time.perf_counter()
                    rep = db.rollback(BASE_TXNS)
                    api.append(time.perf_counter() - t0)
                    assert rep.rolled_back == txns and db.seqno == BASE_TXNS
                lf = list_lost_files(copy / "lost")[0]
                facts = {"lost_bytes": lf.stat().st_size, "updates": sum(len(t["updates"]) for t in
                                                                          LostFile.read(lf).transactions)}
            else:
                t0 = time.perf_counter()
                subprocess.run([MULTISITE, "rollback", str(copy), "--resync", str(BASE_TXNS), "--json"], check=True,
                               capture_output=True, timeout=600)
                cli.append(time.perf_counter() - t0)
            shutil.rmtree(copy)
    shutil.rmtree(master)
    return api, cli, facts


# -- failover ---------------------------------------------------------------------------------------
def failover_once(work: Path, i: int) -> tuple[float, dict]:
    c = Cluster(work / f"failover-{i}", durability="group")
    try:
        a = c.instance("A", group="bank")
        b = c.instance("B", group="bank")
        c.link(a, b)
        stop = threading.Event()
        committed = [0]

        def writer() -> None:
            try:
                with a.client() as db:
                    db.create_region("acct")
                    while not stop.is_set():
                        db.set("acct", ("w", committed[0]), committed[0])
                        committed[0] += 1
            except multisite.MultisiteError:
                pass

        th = threading.Thread(target=writer, daemon=True)
        th.start()
        while committed[0] < 200:
            time.sleep(0.01)
        c.wait_caught_up(a, b)
        t0 = time.perf_counter()
        os.kill(a.pid, signal.SIGKILL)
        steps = {}
        for name, args in (("receiver stop", ["receiver", "stop", str(b.root)]),
                           ("instance role", ["instance", "role", str(b.root), "primary"])):
            s = time.perf_counter()
            subprocess.run([MULTISITE, *args], check=True, capture_output=True, timeout=60)
            steps[name] = time.perf_counter() - s
        s = time.perf_counter()
        with multisite.connect(f"127.0.0.1:{b.client_port}") as db:
            seqno = db.set("acct", ("after-failover",), 1)
        steps["commit"] = time.perf_counter() - s
        total = time.perf_counter() - t0
        stop.set()
        a.pid = None
        th.join(10)
        assert seqno > 200
        return total, steps
    finally:
        c.stop_all()


# -- report -----------------------------------------------------------------------------------------
def spread(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(min(xs))}–{fmt.format(max(xs))}" if len(xs) > 1 else fmt.format(xs[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller runs; does not write RESULTS.md")
    ap.add_argument("--txns", type=int, default=None, help="transactions to roll back (default 100,000)")
    ap.add_argument("--runs", type=int, default=None, help="runs per measure (default 5, quick 2)")
    ap.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    a = ap.parse_args()
    txns = a.txns or (20_000 if a.quick else 100_000)
    runs = a.runs or (2 if a.quick else 5)
    work = HERE / "out" / f"rollback-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[:2]
    rows = []
    try:
        for shape, label in (("single", "single-update"), ("multi", "3-update (set, set, zkill; a kill every 50th)")):
            with console.status(f"rollback of {txns:,} {label} transactions, {runs} runs ..."):
                api, cli, facts = rollback_runs(work, txns, runs, shape)
            rate = txns / statistics.median(api)
            ok = rate >= ROLLBACK_TARGET_TPS
            console.print(f"  rollback, {label}: median {statistics.median(api):.2f} s = {rate:,.0f} tx/s "
                          f"({'PASS' if ok else 'MISS'}); CLI {statistics.median(cli):.2f} s")
            rows.append((f"rollback of {txns:,} {label} transactions, with the lost file (in-process)",
                         f"{rate:,.0f} tx/s ({statistics.median(api):.2f} s; runs {spread(api, '{:.2f}')} s)",
                         f"≥ {ROLLBACK_TARGET_TPS:,} tx/s", "PASS" if ok else "MISS",
                         f"{facts['updates']:,} updates, lost file {facts['lost_bytes'] / 2**20:.0f} MiB"))
            rows.append((f"same, `multisite rollback DIR --resync {BASE_TXNS}` (new process: import, open, roll back)",
                         f"{txns / statistics.median(cli):,.0f} tx/s ({statistics.median(cli):.2f} s wall)", "", "",
                         f"runs {spread(cli, '{:.2f}')} s"))
        times, steps = [], []
        with console.status(f"failover, {runs + 2} runs ..."):
            for i in range(runs + 2):
                t, s = failover_once(work, i)
                times.append(t)
                steps.append(s)
        med = statistics.median(times)
        ok = med < FAILOVER_TARGET_S
        parts = ", ".join(f"{k} {statistics.median([s[k] for s in steps]):.2f} s" for k in steps[0])
        console.print(f"  failover: median {med:.2f} s ({'PASS' if ok else 'MISS'}); {parts}")
        rows.append(("failover: primary SIGKILLed → promoted secondary accepts a commit (CLI script)",
                     f"{med:.2f} s (runs {spread(times, '{:.2f}')} s)", f"< {FAILOVER_TARGET_S:g} s",
                     "PASS" if ok else "MISS", f"medians: {parts}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[:2]
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
               f"{platform.system()} {platform.release()}")
    lines = [BEGIN, "## Failover (issue 4)", "",
             f"Run {time.strftime('%Y-%m-%d %H:%M')} on commit {git_state()}: {machine}; on the repository's "
             f"disk (bench/out/). Load average {load0[0]:.1f} before, {load1[0]:.1f} after, on "
             f"{os.cpu_count()} CPUs. Medians of {runs} runs ({runs + 2} for failover).", "",
             "| measure | figure | target | verdict | note |", "|---|---:|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    lines += ["", "The rollback: the journal after the target is read and checked, the records go to the lost file "
              "(JSON lines with every before- and after-image, fsynced), every touched key is put back from the "
              "first before-image that touched it in one pass, the journal is cut and the instance file trimmed. "
              "The failover figure is mostly two CLI processes starting (about 0.25 s each to import); noticing "
              "that the primary is gone is not in it.", "",
              "Reproduce: `.venv/bin/python bench/rollback.py` (`--quick` for a short run that only prints).", END]
    text = "\n".join(lines) + "\n"
    print(text)
    if not (a.quick or a.no_write):
        write_section("rollback.py", text)
        console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
