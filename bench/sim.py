"""Issue 28's simulation speed: simulated transactions per second of wall time, one process (one core).

Figure 1, the issue's: log shipping A→B→C with failovers (``testing.sim.shipping``) on a commit-heavy
step mix: commits of 1-4 transactions, hardening, batches pumped and delivered down the chain, a
heartbeat tick now and then, and a failover every ``--failover-every`` steps (the old primary
demoted, the new one promoted, the chain rebuilt, the old primary rolled back to the common point
when it reconnects), group durability. Every invariant is checked after every step, as in a seed run. A transaction
counts once it is acknowledged (hardened on the primary).

Figure 2: each family's own seed runs (``make sim``'s step mix, faults included): seeds per second
and acknowledged transactions per second of wall time.

    PYTHONPATH=src .venv/bin/python bench/sim.py [--steps 200000] [--seeds 200]
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time

from multisite.testing.sim import FAMILIES, run_seed
from multisite.testing.sim.core import drive
from multisite.testing.sim.families import STEPS_DEFAULT
from multisite.testing.sim.shipping import ShippingWorld


def shipping_workload(seed: int, n: int, failover_every: int) -> list[tuple]:
    """The commit-heavy mix of figure 1 (see the module's docstring)."""
    r = random.Random(seed)
    steps: list[tuple] = [("connect", 0), ("connect", 1)]
    nxt = 1
    for i in range(n):
        if i and i % failover_every == 0:
            steps += [("failover", nxt), ("connect", 0), ("connect", 1)]
            nxt = (nxt + 1) % 3
            continue
        k = r.random()
        if k < 0.30:
            steps.append(("commit", -1, r.randint(1, 4)))
        elif k < 0.45:
            steps.append(("sync", -1))
        elif k < 0.60:
            steps.append(("pump", r.randrange(2)))
        elif k < 0.95:
            steps.append(("deliver", r.randrange(2), r.random() < 0.6, 1000))
        elif k < 0.98:
            steps.append(("connect", r.randrange(2)))
        else:
            steps.append(("tick", 100))
    return steps


def figure_shipping(steps: int, failover_every: int) -> dict:
    plan = shipping_workload(28, steps, failover_every)
    world = ShippingWorld(28)
    world.compress_level, world.batch_txns, world.durability = 0, 16, "group"  # the harness default
    t0, c0 = time.perf_counter(), time.process_time()
    stats = drive(world, plan)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"steps": len(plan), "txns": stats.txns, "wall_s": wall, "txns_per_s": stats.txns / wall,
            "txns_per_cpu_s": stats.txns / cpu,
            "failovers": stats.notes.get("failovers", 0), "rollbacks": stats.notes.get("rollbacks", 0),
            "rolled_back_txns": stats.notes.get("rolled-back-txns", 0)}


def figure_families(seeds: int) -> list[dict]:
    rows = []
    for name, fam in FAMILIES.items():
        n = max(5, seeds // 20) if name == "multimaster" else seeds
        t0 = time.perf_counter()
        txns = fails = 0
        for seed in range(n):
            r = run_seed(fam, seed, STEPS_DEFAULT[name], shrink_failures=False)
            txns += r.stats.txns
            fails += not r.ok
        wall = time.perf_counter() - t0
        rows.append({"family": name, "seeds": n, "failed": fails, "wall_s": wall, "seeds_per_s": n / wall,
                     "txns_per_s": txns / wall})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000, help="steps of figure 1 (default 200,000)")
    ap.add_argument("--failover-every", type=int, default=2000, help="a failover every N steps (default 2000)")
    ap.add_argument("--seeds", type=int, default=200, help="seeds per family in figure 2 (multimaster: 1/20th)")
    a = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()} Python {platform.python_version()}")
    f1 = figure_shipping(a.steps, a.failover_every)
    print(f"log shipping A->B->C with failovers: {f1['txns']:,} acknowledged transactions in {f1['wall_s']:.2f} s "
          f"= {f1['txns_per_s']:,.0f} simulated tx/s of wall time (one core; {f1['txns_per_cpu_s']:,.0f} per CPU "
          f"second); {f1['steps']:,} steps, "
          f"{f1['failovers']} failovers, {f1['rollbacks']} rollbacks ({f1['rolled_back_txns']} txns to lost files); "
          f"target >= 1,000: {'met' if f1['txns_per_s'] >= 1000 else 'MISSED'}")
    print("| family | seeds | failed | seeds/s | simulated tx/s |\n|---|---:|---:|---:|---:|")
    for r in figure_families(a.seeds):
        print(f"| {r['family']} | {r['seeds']} | {r['failed']} | {r['seeds_per_s']:.1f} | {r['txns_per_s']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
