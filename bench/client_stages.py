"""Where a durable commit's latency goes through 2 client connections: each stage of the server's path
timed with ``perf_counter_ns`` (wall) and ``thread_time_ns`` (the CPU of the thread running it).

    .venv/bin/python bench/client_stages.py              # 2 client processes x 1 connection, 5 s
    .venv/bin/python bench/client_stages.py --seconds 10 --clients 2 --mode thread   # the sync thread always

The instance is served in this process (``multisite.serve``) so that the listener's methods can be
wrapped to stamp each stage; the clients are ``bench/client.py``'s worker processes (one
``multisite.aconnect`` connection each, one commit at a time). The wrappers add a few microseconds
per stage: compare stages within a run, and rates with ``bench/client.py``. Printed only (issue 14,
second pass: the breakdown in bench/RESULTS.md was written from its output). The machine is shared:
the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

STAGES = (  # (name, from event, to event): the time between the two, per occurrence
    ("read + parse + gather a request (_received)", "recv>", "recv<"),
    ("gathered -> batch written starts (loop pass)", "recv>", "wb>"),
    ("prepare + journal write (+ inline fdatasync)", "wb>", "wb<"),
    ("hand-off: written -> sync thread starts fdatasync", "wb<", "harden>"),
    ("fdatasync (Database.harden)", "harden>", "harden<"),
    ("hand-off: fdatasync done -> loop answers", "harden<", "synced>"),
    ("answer + send replies (_synced)", "synced>", "synced<"),
    ("client turn: replies sent -> next request read", "synced<", "recv>"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=2, help="client processes, one connection each")
    ap.add_argument("--mode", choices=("auto", "thread"), default="auto",
                    help="auto: the listener decides where each fdatasync runs; thread: always the sync thread")
    a = ap.parse_args()

    import multisite
    from multisite.engine import database
    from multisite.server import clients as listener_mod

    events: list[tuple[str, int, int]] = []  # (event, wall ns, thread CPU ns)
    wall, cpu = time.perf_counter_ns, time.thread_time_ns

    def stamp(cls, name: str, tag: str) -> None:
        f = getattr(cls, name)

        def wrapped(*args, **kw):
            events.append((tag + ">", wall(), cpu()))
            try:
                return f(*args, **kw)
            finally:
                events.append((tag + "<", wall(), cpu()))

        setattr(cls, name, wrapped)

    stamp(listener_mod.ClientListener, "_received", "recv")
    stamp(listener_mod.ClientListener, "_write_batch", "wb")
    stamp(listener_mod.ClientListener, "_synced", "synced")
    stamp(database.Database, "harden", "harden")

    work = Path(tempfile.mkdtemp(prefix="bench-stages-", dir="/var/tmp"))
    try:
        root = multisite.create(work / "M", name="M", durability="group")
        srv = multisite.serve(root, listen="127.0.0.1:0")
        try:
            srv.db.create_region("acct")
            lis = srv._server.clients
            if a.mode == "thread":
                lis.inline_sync_max_s = -1.0
            load = os.getloadavg()[0]
            code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import client; "
                    f"print(client.clients({srv.address!r}, {a.clients}, 1, 1, {a.seconds}))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            st = lis.stats()
        finally:
            srv.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = eval(out.stdout.strip().splitlines()[-1])  # the worker's own printout (a list of dicts)
    n = sum(r["commits"] for r in res)
    print(f"{n} commits in {a.seconds:.0f} s: {n / max(r['seconds'] for r in res):,.0f}/s; client p50 "
          + ", ".join(f"{r['p50_ms']:.2f}" for r in res) + " ms; client CPU "
          + ", ".join(f"{r['cpu_us']:.0f}" for r in res) + f" us/commit; listener {st}; load {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'stage':52s} {'n':>6s} {'wall p50':>9s} {'wall mean':>10s} {'CPU p50':>8s}  (us)")
    for name, frm, to in STAGES:
        walls, cpus, last = [], [], None
        for tag, t, c in events:
            if tag == frm:
                last = (t, c)
            elif tag == to and last is not None:
                walls.append((t - last[0]) / 1000)
                cpus.append((c - last[1]) / 1000 if frm[:-1] == to[:-1] else float("nan"))
                last = None
        if not walls:
            print(f"{name:52s} {0:6d}")
            continue
        walls.sort()
        cs = sorted(x for x in cpus if x == x)
        cpu_p50 = f"{cs[len(cs) // 2]:8.1f}" if cs else f"{'-':>8s}"
        print(f"{name:52s} {len(walls):6d} {walls[len(walls) // 2]:9.1f} {sum(walls) / len(walls):10.1f} {cpu_p50}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
