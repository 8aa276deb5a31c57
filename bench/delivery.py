"""Guaranteed message delivery through the file transport: throughput, and a remote's catch-up.

    .venv/bin/python bench/delivery.py             # N = 200,000 for throughput, 1,000,000 for the catch-up
    .venv/bin/python bench/delivery.py --quick     # small N, prints only

Setup (``multisite.testing.delivery.make_topology``): a consolidated instance HQ publishing region
``orders`` (no subscribe-by: every row goes) to one remote P, both on the repository's disk, the file
transport (P's inbox folder), HQ with durability ``none`` (it only has to hold the load), P with the
default ``fsync`` (every applied message is one fsynced commit with its ``log_received``). The load is
N single-update transactions committed on HQ (key ``(i,)``, value ``{"n": i, "pad": 32 x}``).

1. **Throughput**, send + apply + confirm end to end: the clock starts with HQ's first poll and stops
   when HQ has received P's confirmation of the last transaction (``confirm_sent == log_sent`` at the
   journal's end); the agents poll in turn in this process (HQ sends, P applies and confirms, HQ takes
   the confirmation). Measured with multisite's message size (1 MiB) and, in the same run, with the
   baseline: SQL Anywhere's model of one message per batch of one transaction (a message size limit
   that fits one single-update transaction, so each transaction travels, is applied and confirmed
   as a message of its own), on a smaller N (it is the slow case). The ratio is the figure.
2. **Catch-up**: P is away (its agent not running) while HQ commits 1,000,000 transactions and HQ's
   agent keeps sending them into P's inbox; the clock starts when P's agent comes back and stops when
   HQ holds P's confirmation of the last one. Also measured: the whole way when HQ had not sent
   anything yet either (HQ scans and sends after P is back).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import multisite.engine as engine  # noqa: E402
from multisite.delivery.server import api
from multisite.delivery.server.agent import Agent  # noqa: E402
from multisite.journal.offsets import end_offset  # noqa: E402
from multisite.testing.delivery import REGION, make_topology  # noqa: E402
from multisite.values import encode_value  # noqa: E402

OUT = HERE / "out" / "delivery"
PAD = "x" * 32


def load(path: Path, first: int, n: int) -> None:
    from multisite.journal.records import SET

    with engine.open(path) as db:
        for i in range(first, first + n):
            db.commit_updates([(SET, REGION, (i,), encode_value({"n": i, "pad": PAD}))])


def exchange(hq: Path, p: Path, message_bytes: int, last_data: int, *, p_first: bool = False,
             max_polls: int = 1_000_000) -> tuple[float, int, int]:
    """Agents poll in turn until HQ holds P's confirmation of the last transaction: (seconds, polls,
    messages). Both instances stay open for the whole exchange, as two agents would keep them."""
    with engine.open(hq) as hq_db, engine.open(p) as p_db:
        a_hq = Agent(hq_db, message_bytes=message_bytes)
        a_p = Agent(p_db, message_bytes=message_bytes)
        t0 = time.perf_counter()
        polls = messages = 0
        order = (a_p, a_hq) if p_first else (a_hq, a_p)
        while polls < max_polls:
            for a in order:
                rep = a.poll()
                messages += rep.sent_messages
            polls += 1
            st = a_hq.senders["P"].state
            if st.confirm_sent == st.log_sent and st.log_sent >= last_data:
                break
        dt = time.perf_counter() - t0
        a_hq.close()
        a_p.close()
    return dt, polls, messages


def fresh(root: Path, n: int) -> tuple[Path, Path, int]:
    """HQ holding ``n`` transactions for P, and the offset of the last of them."""
    if root.exists():
        shutil.rmtree(root)
    top = make_topology(root, {"P": ""}, subscribe_by=None, hq_durability="none")  # HQ only holds the load
    load(top.hq, 0, n)
    return top.hq, top.remotes["P"], end_offset(top.hq / "journal")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--baseline-n", type=int, default=3_000)
    ap.add_argument("--catchup-n", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="throughput runs (the median is the figure)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.baseline_n, args.catchup_n = 20_000, 2_000, 50_000
    OUT.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    results = {}

    runs = []
    for k in range(args.runs):  # the machine may be shared: the median of a few runs
        hq, p, last = fresh(OUT / "tput", args.n)
        dt, polls, msgs = exchange(hq, p, 1 << 20, last)
        runs.append(dt)
        print(f"throughput, 1 MiB messages, run {k + 1}: {args.n:,} tx in {dt:.2f} s = {args.n / dt:,.0f} tx/s "
              f"({msgs} messages, {polls} rounds)", flush=True)
    dt = sorted(runs)[len(runs) // 2]
    results["ours"] = (args.n, dt, polls, msgs)
    results["ours_runs"] = runs

    hq, p, last = fresh(OUT / "base", args.baseline_n)
    dt, polls, msgs = exchange(hq, p, 1, last)
    results["base"] = (args.baseline_n, dt, polls, msgs)
    print(f"baseline, one message per transaction: {args.baseline_n:,} tx in {dt:.2f} s = "
          f"{args.baseline_n / dt:,.0f} tx/s ({msgs} messages, {polls} rounds)", flush=True)

    # catch-up: HQ sends while P is away, then P comes back
    hq, p, last = fresh(OUT / "catchup", args.catchup_n)
    with engine.open(hq) as db:
        a = Agent(db)
        t0 = time.perf_counter()
        while a.poll().sent_messages:
            pass
        send_s = time.perf_counter() - t0
        a.close()
    inbox_bytes = sum(f.stat().st_size for f in (OUT / "catchup" / "inbox" / "P").glob("*.msg"))
    dt, polls, msgs = exchange(hq, p, 1 << 20, last, p_first=True)
    results["catchup"] = (args.catchup_n, dt, polls, send_s, inbox_bytes)
    print(f"catch-up of {args.catchup_n:,} tx waiting in the inbox ({inbox_bytes / 2**20:.1f} MiB): {dt:.2f} s "
          f"({args.catchup_n / dt:,.0f} tx/s); HQ had sent them in {send_s:.2f} s while P was away", flush=True)
    # the whole way: nothing sent yet when P comes back
    hq, p, last = fresh(OUT / "catchup2", args.catchup_n)
    dt2, polls2, msgs2 = exchange(hq, p, 1 << 20, last)
    results["catchup_whole"] = (args.catchup_n, dt2)
    print(f"catch-up of {args.catchup_n:,} tx not yet sent: {dt2:.2f} s ({args.catchup_n / dt2:,.0f} tx/s)", flush=True)
    for d in ("tput", "base", "catchup", "catchup2"):
        shutil.rmtree(OUT / d, ignore_errors=True)
    if not args.quick:
        write_results(results, load_before)


def write_results(r: dict, load_before: float) -> None:
    """Replace (or append) this benchmark's section of bench/RESULTS.md."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    n, dt, polls, msgs = r["ours"]
    bn, bdt, bpolls, bmsgs = r["base"]
    cn, cdt, cpolls, send_s, inbox_bytes = r["catchup"]
    wn, wdt = r["catchup_whole"]
    ours, base = n / dt, bn / bdt
    lines = [
        "<!-- bench/delivery.py: begin -->",
        "## Guaranteed message delivery (issue 13)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on commit {commit}: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; on the repository's disk (bench/out/). Load "
        f"average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other work shared the machine).",
        "",
        "HQ (durability none: it only holds the load) publishes region `orders` to one remote P (durability fsync: "
        "each applied message is one fsynced commit with its `log_received`), file transport (P's inbox folder, "
        "atomic fsynced writes). Single-update transactions (key `(i,)`, value `{n: i, pad: 32 x}`). The agents "
        "poll in turn in one process; the clock stops when HQ holds P's confirmation of the last transaction "
        "(send + apply + confirm).",
        "",
        "| measure | figure | target | verdict | note |",
        "|---|---:|---|---|---|",
        f"| throughput, 1 MiB messages (median of {len(r['ours_runs'])} runs) | {ours:,.0f} tx/s ({n:,} tx in {dt:.2f} s) "
        f"| ≥ 50,000 tx/s | {'PASS' if ours >= 50_000 else 'MISS'} | {msgs} messages; runs "
        f"{', '.join(f'{n / x:,.0f}' for x in r['ours_runs'])} tx/s |",
        f"| baseline in the same run: SQL Anywhere's one message per batch, a batch of one transaction | "
        f"{base:,.0f} tx/s ({bn:,} tx in {bdt:.2f} s) | | | {bmsgs:,} messages of one transaction each |",
        f"| ratio | {ours / base:,.0f}x | | | |",
        f"| catch-up of a remote offline for {cn:,} transactions (waiting in its inbox, {inbox_bytes / 2**20:.1f} MiB "
        f"of messages) | {cdt:.1f} s ({cn / cdt:,.0f} tx/s) | < 60 s | {'PASS' if cdt < 60 else 'MISS'} | "
        f"HQ had sent them in {send_s:.1f} s while P was away |",
        f"| same, nothing sent yet when P comes back (HQ scans, sends; P applies; HQ takes the confirmation) | "
        f"{wdt:.1f} s ({wn / wdt:,.0f} tx/s) | < 60 s | {'PASS' if wdt < 60 else 'MISS'} | |",
        "",
        "The baseline is bound by a message's fixed costs: an atomic file write (two fsyncs) and one fsynced "
        "commit on the remote per transaction; multisite's messages carry up to 1 MiB of transactions each, "
        "so those costs are shared by thousands of transactions and the scan, the msgpack/zstd encoding and "
        "the apply's store writes dominate.",
        "",
        "Reproduce: `.venv/bin/python bench/delivery.py` (`--quick` for a short run that only prints).",
        "<!-- bench/delivery.py: end -->",
    ]
    path = HERE / "RESULTS.md"
    text = path.read_text()
    begin, end = "<!-- bench/delivery.py: begin -->", "<!-- bench/delivery.py: end -->"
    section = "\n".join(lines)
    if begin in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
