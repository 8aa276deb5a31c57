"""Automatic failover's figures (issue 25): failover time, the cost of --min-confirm 1, loss over fault rounds.

    .venv/bin/python bench/ha.py                      # every figure; writes its section of bench/RESULTS.md
    .venv/bin/python bench/ha.py --figure failover --runs 3 --quick   # prints only

Everything is real: a 3-member etcd (``testing/etcd.py``, etcd-server on loopback), three instance
servers (``group`` durability), each with its HA manager process (``ha start``, lease ``--ttl 1``, the
default), the clients in processes or threads of their own.

**failover**: the primary's host lost (its server and its manager SIGKILLed together) under a writer
that commits one transaction at a time through a multi-host client (``multisite.connect`` with every
member's address). The time from the kill to the first commit the new primary acknowledges, split as
*detection* (the leader key gone from etcd: the lease ended), *election* (the key taken by another
member), *promotion* (that member's server has the primary's role) and *client* (the writer's first
commit acknowledged there). An observer thread polls etcd and the servers every 10 ms, so each split is
known to about 10 ms (a commit acknowledged before the observer saw the role ends the promotion). Several runs on one cluster (the old primary restarted and rejoined between
two); the figure is the median.

**rate**: commits per second at 16 connections (2 client processes x 8 ``multisite.aconnect``
connections, each one commit at a time, as ``bench/client.py``) to the primary, with ``--min-confirm
1`` (a commit is answered once a secondary confirmed it hardened it) and without, on the same cluster,
switched on the primary's control socket (``min_confirm``, the operation ``ha start --min-confirm``
calls), interleaved over ``--rounds`` (the order alternates); the medians, and the ratio as the median of
the ratios within each round (the machine's load drifts between rounds more than within one).

**rounds**: the seeded fault rounds of ``tests/faults/test_ha_rounds.py`` (``testing/ha_rounds.py``):
faults injected, commits acknowledged, and those acknowledged under ``--min-confirm 1`` that were lost.

The machine is shared with other work: the load average is recorded beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from multisite.ha.coordinator import Coordinator  # noqa: E402
from multisite.net import control  # noqa: E402
from multisite.testing.etcd import EtcdCluster  # noqa: E402
from multisite.testing.ha import HACluster  # noqa: E402

MEMBERS = ["A", "B", "C"]
TTL_S = 1.0  # ha start's default lease
OBSERVE_EVERY_S = 0.01
FAILOVER_TIMEOUT_S = 30.0
SPLIT_NOTE = ("Detection is the lease: it ends 1 s after the last renewal etcd received (renewals go every third of"
              " a lease, so up to 0.33 s before the kill), give or take etcd's own expiry check; election is mostly"
              " the managers' settle wait (0.3 s) for every member's fresh seqno before the candidate campaigns.")


# -- failover ----------------------------------------------------------------------------------------
class Observer:
    """A thread polling etcd's leader key and every member's role; the first time each thing was seen."""

    def __init__(self, c: HACluster):
        self.c = c
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._watching = ""  # the old primary's name once armed
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def arm(self, old: str) -> None:
        self.seen, self._watching = {}, old

    async def _run(self) -> None:
        coord = Coordinator(self.c.cluster, self.c.etcd, name="(bench)", ttl_s=TTL_S)
        while not self._stop.is_set():
            old = self._watching
            if old:
                view = await coord.view()
                now = time.monotonic()
                if view.reachable and view.leader is None:
                    self.seen.setdefault("key gone", now)
                if view.reachable and view.leader is not None and view.leader.name != old:
                    self.seen.setdefault("key taken", now)
                    self.seen.setdefault("leader " + view.leader.name, now)
                    st = self.c.status(view.leader.name) or {}
                    if st.get("role") == "primary" and st.get("receiver") is None:
                        self.seen.setdefault("primary", time.monotonic())
            await asyncio.sleep(OBSERVE_EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def failover_runs(work: Path, runs: int) -> list[dict]:
    out = []
    with EtcdCluster(work / "failover") as etcd:
        c = HACluster(work / "failover", etcd.endpoints, MEMBERS, ttl_s=TTL_S, cluster="bench-failover")
        c.start()
        obs = Observer(c)
        try:
            for k in range(runs):
                c.wait_primary()
                c.wait_followers()
                w = c.writer(tag=f"run{k}")
                time.sleep(1.0)
                old = c.primary()
                load = os.getloadavg()[0]
                obs.arm(old)
                t0 = time.monotonic()
                c.lose_host(old)
                new = c.wait_primary(exclude=old, timeout_s=FAILOVER_TIMEOUT_S)
                first = w.wait_commit_after(t0, FAILOVER_TIMEOUT_S, on=c.address(new))
                time.sleep(0.2)
                w.stop()
                s = obs.seen
                primary = min(s.get("primary", first), first)  # the writer may hear it before the observer
                run = {"old": old, "new": new, "load": load, "detection": s["key gone"] - t0,
                       "election": s["key taken"] - s["key gone"], "promotion": primary - s["key taken"],
                       "client": first - primary, "total": first - t0}
                out.append(run)
                print(f"failover {k + 1}/{runs}: {old} -> {new} in {run['total']:.3f} s (detection "
                      f"{run['detection']:.3f}, election {run['election']:.3f}, promotion {run['promotion']:.3f}, "
                      f"client {run['client']:.3f}); load {load:.1f}", flush=True)
                obs.arm("")
                c.restart_host(old)
        finally:
            obs.stop()
            c.stop()
    return out


# -- rate ---------------------------------------------------------------------------------------------
def rate_rounds(work: Path, rounds: int, seconds: float) -> list[dict]:
    from client import clients  # bench/client.py's aconnect load: processes x connections, one commit each

    out = []
    with EtcdCluster(work / "rate") as etcd:
        c = HACluster(work / "rate", etcd.endpoints, MEMBERS, ttl_s=TTL_S, cluster="bench-rate")
        c.start()
        try:
            p = c.wait_primary()
            c.wait_followers()
            with c.client() as db:
                db.create_region("acct")
            addr = c.address(p)
            clients(addr, 1, 1, 16, 1.0)  # warm-up
            for r in range(rounds):
                for n in ((0, 1) if r % 2 == 0 else (1, 0)):
                    control.call(c.root(p), "min_confirm", n=n)
                    if c.primary() != p:
                        raise RuntimeError(f"the primary moved from {p} during the rate figure")
                    load = os.getloadavg()[0]
                    got = clients(addr, 2, 8, 1, seconds)
                    rate = sum(g["commits"] for g in got) / max(g["seconds"] for g in got)
                    p50 = statistics.median(g["p50_ms"] for g in got)
                    out.append({"min_confirm": n, "rate": rate, "p50_ms": p50, "load": load})
                    print(f"rate round {r + 1}/{rounds}, --min-confirm {n}: {rate:,.0f}/s, p50 {p50:.2f} ms; "
                          f"load {load:.1f}", flush=True)
            control.call(c.root(p), "min_confirm", n=0)
        finally:
            c.stop()
    return out


# -- rounds -------------------------------------------------------------------------------------------
def fault_rounds(work: Path, n: int, seed_base: int):
    from multisite.testing.ha_rounds import Totals, plan, run_round

    totals = Totals()
    seeds = [seed_base + k for k in range(n)]
    loads = [os.getloadavg()[0]]
    for mc in (0, 1):
        mine = [s for s in seeds if plan(s).min_confirm == mc]
        with EtcdCluster(work / f"rounds{mc}") as etcd:
            c = HACluster(work / f"rounds{mc}", etcd.endpoints, MEMBERS, ttl_s=TTL_S, min_confirm=mc,
                          cluster=f"bench-rounds-{mc}")
            c.start()
            try:
                for s in mine:
                    run_round(c, etcd, plan(s), totals, log=lambda m: print(m, flush=True))
            finally:
                c.stop()
        loads.append(os.getloadavg()[0])
    print(totals.summary(), flush=True)
    return totals, seeds, loads


# -- report -------------------------------------------------------------------------------------------
def report(fo: list[dict], rates: list[dict], totals, seeds: list[int], round_loads: list[float],
           args, loads: list[tuple]) -> str:
    from results import git_state, markers

    begin, end = markers("ha.py")
    lines = [begin, "## Automatic failover (bench/ha.py, issue 25)", "",
             f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores shared with other "
             f"work, git {git_state()}; load average (1 min) {loads[0][0]:.1f} at the start, {loads[-1][0]:.1f} at "
             f"the end. Three instance servers (group durability) with their HA managers (lease --ttl 1, the "
             f"default), a 3-member etcd, all on this machine.", ""]
    if fo:
        med = {k: statistics.median(r[k] for r in fo) for k in ("detection", "election", "promotion", "client", "total")}
        lines += [f"**Primary's host lost (server and manager SIGKILLed) -> first commit on the new primary through "
                  f"a multi-host client**, {len(fo)} runs, median: **{med['total']:.2f} s** (target <= 2 s with the "
                  f"default lease; Patroni's defaults take about 30 s).", "",
                  "| split | median s | min s | max s |", "|---|---:|---:|---:|"]
        for k, what in (("detection", "detection: the leader key gone from etcd (its lease ended)"),
                        ("election", "election: the key taken by the most advanced secondary"),
                        ("promotion", "promotion: its server has the primary's role"),
                        ("client", "client: the writer's first commit acknowledged there"),
                        ("total", "kill -> first commit")):
            vals = [r[k] for r in fo]
            lines.append(f"| {what} | {med[k]:.3f} | {min(vals):.3f} | {max(vals):.3f} |")
        lines += ["", "Runs: " + "; ".join(f"{r['old']}->{r['new']} {r['total']:.2f} s (load {r['load']:.1f})"
                                         for r in fo) + ". " + SPLIT_NOTE, ""]
    if rates:
        a = [r["rate"] for r in rates if r["min_confirm"] == 0]
        m = [r["rate"] for r in rates if r["min_confirm"] == 1]
        pa = statistics.median(r["p50_ms"] for r in rates if r["min_confirm"] == 0)
        pm = statistics.median(r["p50_ms"] for r in rates if r["min_confirm"] == 1)
        pairs = [b["rate"] / a_["rate"] for a_, b in zip(rates[0::2], rates[1::2])]
        pairs = [x if rates[2 * i]["min_confirm"] == 0 else 1 / x for i, x in enumerate(pairs)]
        ratio = statistics.median(pairs)  # within a round both ran under about the same load
        lines += [f"**Commit rate at 16 connections** (2 processes x 8 `aconnect` connections, one commit at a time "
                  f"each, {args.seconds:g} s per measurement, {len(a)} rounds interleaved; the same primary switched "
                  f"between `min_confirm 1` and `0`): asynchronous **{statistics.median(a):,.0f}/s** (p50 {pa:.2f} ms), "
                  f"`--min-confirm 1` **{statistics.median(m):,.0f}/s** (p50 {pm:.2f} ms), medians: ratio **{ratio:.2f}** "
                  f"(the median of the ratios within each round, {', '.join(f'{x:.2f}' for x in pairs)}; of the "
                  f"medians {statistics.median(m) / statistics.median(a):.2f}; target >= 0.8; PostgreSQL with one "
                  f"synchronous standby reaches about 0.6 on this machine class). Load "
                  f"{min(r['load'] for r in rates):.1f} to {max(r['load'] for r in rates):.1f}.", ""]
    if totals is not None:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(totals.faults.items()))
        lines += [f"**Seeded fault rounds** (`testing/ha_rounds.py`, as `tests/faults/test_ha_rounds.py`; seeds "
                  f"{seeds[0]}..{seeds[-1]}, half with `--min-confirm 1`): {totals.rounds} rounds, "
                  f"{sum(totals.faults.values())} faults injected ({kinds}), {totals.acknowledged:,} commits "
                  f"acknowledged, {totals.acknowledged_min_confirm:,} of them under `--min-confirm 1`, of which "
                  f"**{totals.lost_min_confirm} lost**; without it {totals.in_lost_files:,} acknowledged commits went "
                  f"to lost files, {totals.silently_lost} silently lost; never two primaries taking commits at once "
                  f"(smallest gap between two primaries' commits "
                  + (f"{totals.smallest_gap_s:.3f} s" if totals.smallest_gap_s is not None else "n/a")
                  + f"); {totals.seconds:.0f} s of rounds, load {min(round_loads):.1f} to {max(round_loads):.1f}.", ""]
    lines.append(end)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--figure", choices=["all", "failover", "rate", "rounds"], default="all")
    ap.add_argument("--runs", type=int, default=7, help="failovers measured")
    ap.add_argument("--rounds", type=int, default=8, help="rate: measurements of each setting, interleaved")
    ap.add_argument("--seconds", type=float, default=3.0, help="rate: seconds of one measurement")
    ap.add_argument("--fault-rounds", type=int, default=20)
    ap.add_argument("--seed-base", type=int, default=2500)
    ap.add_argument("--quick", action="store_true", help="print only; do not write RESULTS.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ha-"))
    loads = [os.getloadavg()]
    try:
        fo = failover_runs(work, args.runs) if args.figure in ("all", "failover") else []
        rates = rate_rounds(work, args.rounds, args.seconds) if args.figure in ("all", "rate") else []
        totals, seeds, round_loads = (fault_rounds(work, args.fault_rounds, args.seed_base)
                                      if args.figure in ("all", "rounds") else (None, [], []))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loads.append(os.getloadavg())
    text = report(fo, rates, totals, seeds, round_loads, args, loads)
    print(text)
    if not args.quick and args.figure == "all":
        from results import write_section

        write_section("ha.py", text)


if __name__ == "__main__":
    main()
