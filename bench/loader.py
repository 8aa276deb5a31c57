"""The grid's Loader (issue 16): write-through commit rate with PostgreSQL, and replay after failover.

    .venv/bin/python bench/loader.py [--clients 16] [--seconds 8] [--replay 20000]

One throwaway PostgreSQL server (``multisite.testing.postgres``), in one run:

- baseline: ``--clients`` threads, each with its own psycopg connection, doing the loader's insert (an
  upsert of a JSONB value by key) with one commit each, for ``--seconds``;
- the grid: 2 partitions, ``min_sync = 1`` (3 containers), ``loader = "postgresql"``; the same number of
  client threads, each with its own grid client, putting single-update transactions for ``--seconds``:
  each commit is voted by a sync replica and committed in PostgreSQL (with its applied id) before the
  grid commits it. The ratio grid / baseline is the issue's figure (target ≥ 0.7);
- replay: ``--replay`` transactions committed through the grid, then the database's tables emptied and
  the primaries' containers SIGKILLed: the promoted replicas hand their whole journals to the Loader
  before they serve (the worst case of a failover's replay: the database lacks everything); the rate is
  the new primaries' logged "N applied in S s".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

from multisite.errors import MultisiteError
from multisite.testing.grid import GridCluster
from multisite.testing.postgres import PostgresServer


def run_threads(n: int, seconds: float, body) -> int:
    counts = [0] * n
    stop = threading.Event()
    barrier = threading.Barrier(n + 1)

    def worker(i: int) -> None:
        step = body(i)
        barrier.wait()
        while not stop.is_set():
            step()
            counts[i] += 1

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    barrier.wait()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join(30)
    return sum(counts)


def baseline(pg: PostgresServer, clients: int, seconds: float) -> float:
    import psycopg
    with pg.connect() as c:
        c.execute("DROP TABLE IF EXISTS base")
        c.execute("CREATE TABLE base (key TEXT PRIMARY KEY, value JSONB NOT NULL)")

    def body(i: int):
        conn = psycopg.connect(pg.dsn)
        n = [0]

        def step():
            n[0] += 1
            conn.execute("INSERT INTO base (key, value) VALUES (%s, %s::jsonb) ON CONFLICT (key) DO UPDATE SET "
                         "value = excluded.value", (json.dumps([i, n[0] % 1000]), json.dumps({"n": n[0]})))
            conn.commit()
        return step
    return run_threads(clients, seconds, body) / seconds


def grid(pg: PostgresServer, root: Path, clients: int, seconds: float, replay: int, loader: bool = True,
         partitions: int = 2) -> dict:
    g = GridCluster(root, partitions=partitions, min_sync=1, max_sync=1, max_async=0, heartbeat_timeout_s=1.0,
                    map_settings=f'loader = "postgresql"\ndsn = "{pg.dsn}"\n' if loader else "")
    out: dict = {}
    try:
        g.start_catalog()
        for c in ("a", "b", "c"):
            g.start_container(c)
        g.wait_settled()

        def body(i: int):
            cl = g.client(timeout_s=10)
            n = [0]

            def step():
                n[0] += 1
                try:
                    cl.put("m", i * 1000 + n[0] % 1000, {"n": n[0]})
                except MultisiteError:
                    pass
            return step
        out["grid_tps"] = run_threads(clients, seconds, body) / seconds
        if loader:
            from multisite.net import control
            st0 = g.status()
            ls = [control.call(root / p["primary"], "status")["shards"][str(p["partition"])].get("loader", {})
                  for p in st0["partitions"]]
            out["batches"] = sum(x.get("batches", 0) for x in ls)
            out["batch_ms"] = sum(x.get("batch_ms", 0) for x in ls) / max(1, len(ls))
        if not loader:
            return out
        # replay: a journal the database lacks
        cl = g.client(timeout_s=10)
        t = g.client(timeout_s=10)
        del t
        body_n = [0]

        def fill(i: int):
            c2 = g.client(timeout_s=10)

            def step():
                body_n[0] += 1
                c2.put("m", 10_000_000 + i * 100_000 + body_n[0], {"n": body_n[0]})
            return step
        while body_n[0] < replay:
            run_threads(clients, 1.0, fill)
        cl.close()
        st = g.wait("replicas caught up", g.caught_up, 60)
        with pg.connect() as c:
            c.execute("TRUNCATE m, multisite_applied")
        victim = st["partitions"][0]["primary"]  # one container: the others keep a sync replica of each
        sizes = {c: (root / c / "log" / "container.log").stat().st_size for c in ("a", "b", "c")}
        moved = sum(1 for p in st["partitions"] if p["primary"] == victim)
        g.kill(victim)
        t0 = time.monotonic()
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(lines) < moved:
            lines = []
            for c in ("a", "b", "c"):
                if c == victim:
                    continue
                with open(root / c / "log" / "container.log", errors="replace") as f:
                    f.seek(sizes[c])
                    lines += re.findall(r"loader replay: .*?; (\d+) applied in ([\d.]+) s", f.read())
            time.sleep(0.05)
        applied = sum(int(n) for n, _ in lines)
        secs = max(float(s) for _, s in lines) if lines else float("nan")
        out.update(replayed=applied, replay_s=secs, replay_tps=applied / secs if secs else 0.0,
                   failover_to_ready_s=time.monotonic() - t0, partitions=len(lines))
        with pg.connect() as c:
            out["db_rows_after_replay"] = c.execute("SELECT count(*) FROM m").fetchone()[0]
    finally:
        g.stop_all()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--replay", type=int, default=20000)
    ap.add_argument("--partitions", type=int, default=2)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ms-loader-bench-"))
    os.chmod(tmp, 0o755)
    pg = PostgresServer(tmp / "pg").start()
    try:
        base = baseline(pg, a.clients, a.seconds)
        r = grid(pg, tmp / "grid", a.clients, a.seconds, a.replay, partitions=a.partitions)
        bare = grid(pg, tmp / "bare", a.clients, a.seconds, 0, loader=False, partitions=a.partitions)["grid_tps"]
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = r["grid_tps"] / base
    print(f"PostgreSQL: {pg.bin}")
    print(f"baseline, psycopg, {a.clients} clients, one commit each: {base:,.0f} commits/s")
    print(f"grid write-through (min_sync 1, {a.partitions} partitions), {a.clients} clients: {r['grid_tps']:,.0f} commits/s "
          f"= {ratio:.2f} x the baseline (target >= 0.7); {r['batches']:,} database transactions "
          f"({r['grid_tps'] * a.seconds / max(1, r['batches']):.1f} commits each), {r['batch_ms']:.2f} ms each")
    print(f"the same grid without a loader, same clients: {bare:,.0f} commits/s (write-through costs "
          f"{1 - r['grid_tps'] / bare:.0%})")
    print(f"replay after failover: {r['replayed']:,} transactions in {r['replay_s']:.2f} s = "
          f"{r['replay_tps']:,.0f} transactions/s ({r['partitions']} partitions in parallel; SIGKILL to every "
          f"new primary ready: {r['failover_to_ready_s']:.1f} s); rows in the database after: "
          f"{r['db_rows_after_replay']:,}")


if __name__ == "__main__":
    main()
