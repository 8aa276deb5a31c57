"""``python -m multisite.testing.sim --seeds N [--family F] [--steps S] [--start K]``: run seeds on
every family (or one), print each failure with its shortest step list, then a summary table per
family (seeds, failures by invariant, steps, transactions, seeds/s and simulated transactions/s of
wall time). Exit status 1 when a seed failed. ``--json FILE`` writes the summary as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

from .core import run_seed
from .families import FAMILIES, STEPS_DEFAULT


def run_family(name: str, seeds: range, steps: int, out=sys.stdout) -> dict:
    fam = FAMILIES[name]
    fails: Counter = Counter()
    first: dict[str, str] = {}
    txns = nsteps = 0
    t0 = time.perf_counter()
    for seed in seeds:
        r = run_seed(fam, seed, steps)
        txns += r.stats.txns
        nsteps += r.stats.steps
        if not r.ok:
            inv = r.violation.invariant
            fails[inv] += 1
            first.setdefault(inv, r.report())
            print(r.report(), file=out, flush=True)
    wall = time.perf_counter() - t0
    return {"family": name, "seeds": len(seeds), "failed": sum(fails.values()), "by_invariant": dict(fails),
            "first_failure": first, "steps": nsteps, "txns": txns, "wall_s": round(wall, 2),
            "seeds_per_s": round(len(seeds) / wall, 1) if wall else 0.0,
            "txns_per_s": round(txns / wall) if wall else 0}


def table(rows: list[dict]) -> str:
    head = f"{'family':<14}{'seeds':>9}{'failed':>8}{'steps':>11}{'txns':>10}{'wall s':>9}{'seeds/s':>9}{'txns/s':>9}  failures"
    lines = [head, "-" * len(head)]
    for r in rows:
        why = ", ".join(f"{k}: {v}" for k, v in r["by_invariant"].items()) or "-"
        lines.append(f"{r['family']:<14}{r['seeds']:>9}{r['failed']:>8}{r['steps']:>11}{r['txns']:>10}"
                     f"{r['wall_s']:>9}{r['seeds_per_s']:>9}{r['txns_per_s']:>9}  {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multisite.testing.sim", description=__doc__)
    ap.add_argument("--seeds", type=int, default=100, help="seeds per family (default 100)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only this family (repeatable)")
    ap.add_argument("--steps", type=int, default=None, help="steps per seed (default: the family's)")
    ap.add_argument("--json", help="write the summary as JSON to this file")
    a = ap.parse_args(argv)
    rows = []
    for name in a.family or list(FAMILIES):
        steps = a.steps or STEPS_DEFAULT[name]
        rows.append(run_family(name, range(a.start, a.start + a.seeds), steps))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
