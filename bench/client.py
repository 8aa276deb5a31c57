"""Durable commits through client connections against PostgreSQL in the same run, and end to end.

    .venv/bin/python bench/client.py                 # writes its section of bench/RESULTS.md
    .venv/bin/python bench/client.py --quick         # shorter, prints only

**Commit rate** (issue 14): single-row updates, each its own durable transaction, by 2 clients and by
16 (2 client processes x 8 connections), against

- multisite: a ``group``-durability instance served by ``multisite server start`` (its own process);
  every client process runs ``multisite.aconnect`` connections, each one commit at a time (as a
  pgbench client), a random key of 100,000; with the listener's loop on uvloop and on asyncio's own,
  and on uvloop with the server's threads on one CPU (``--cpus 0``, as issue 14's table was measured);
- PostgreSQL 15 (``testing.postgres``: initdb in a temp dir, fsync on, synchronous_commit on):
  ``pgbench -c 2 -j 2`` and ``-c 16 -j 2`` with one ``UPDATE ... WHERE id = :id`` per transaction
  over 100,000 rows.

Each round runs every configuration once, interleaved, ``--rounds`` times; the figure is the median.
**End to end** (committed on the primary and applied on a streaming secondary, each in a server of its
own): single-update transactions through client connections (2 processes x 8 connections, 16
requests pipelined on each) and through ``multisite.serve``'s handle (threads of this process
committing on ``srv.db``); the rate is the transactions over the time until the secondary applied the
last. The machine is shared with other work: the load average is recorded beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = 100_000
MULTISITE = ("multisite uvloop", "multisite asyncio", "multisite uvloop --cpus 0")
BOOSTED = False  # every session of the run (this one, each server's) at this process's nice (results.boost_session)
if importlib.util.find_spec("uvloop") is None:  # the listener would fall back to asyncio's loop: not uvloop
    MULTISITE = ("multisite asyncio", "multisite asyncio --cpus 0")
PG_SCRIPT = "\\set id random(1, 100000)\nUPDATE acct SET v = v + 1 WHERE id = :id;\n"


# -- client processes -------------------------------------------------------------------------------
def worker(addr: str, conns: int, depth: int, seconds: float, total: int) -> None:
    """A client process: ``conns`` connections with ``depth`` requests in flight each, committing for
    ``seconds`` (or ``total`` transactions); prints what it did as JSON."""
    import multisite

    async def main() -> dict:
        dbs = [await multisite.aconnect(addr) for _ in range(conns)]
        rnd = random.Random(os.getpid())
        done = 0
        stop = time.monotonic() + seconds
        lats: list[float] = []

        async def one() -> None:
            nonlocal done
            db = dbs[one.n % conns]
            one.n += 1
            while time.monotonic() < stop and (not total or done < total):
                done += 1
                t0 = time.perf_counter()
                await db.set("acct", (rnd.randrange(ROWS),), rnd.randrange(1 << 30))
                if len(lats) < 100_000:
                    lats.append(time.perf_counter() - t0)

        one.n = 0  # type: ignore[attr-defined]
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(conns * depth)))
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
        for db in dbs:
            await db.close()
        return {"commits": done, "seconds": took, "p50_ms": statistics.median(lats) * 1000 if lats else 0,
                "cpu_us": cpu / max(1, done) * 1e6}

    print(json.dumps(run_client_loop(main())))


def run_client_loop(coro):
    """The client processes' event loop: uvloop when installed (as an application after speed would
    run ``multisite.aconnect``: asyncio's own loop costs the Python client about twice the CPU per
    commit, measured in issue 14's second pass), unless ``MULTISITE_BENCH_CLIENT_LOOP=asyncio``."""
    if os.environ.get("MULTISITE_BENCH_CLIENT_LOOP", "uvloop") == "uvloop" and importlib.util.find_spec("uvloop"):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def clients(addr: str, procs: int, conns: int, depth: int, seconds: float, total: int = 0) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", addr, str(conns), str(depth), str(seconds), str(total)]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    out = [json.loads(p.communicate()[0]) for p in ps]
    if any(p.returncode for p in ps):
        raise RuntimeError("a client process failed")
    return out


# -- multisite ------------------------------------------------------------------------------------
def multisite_rate(work: Path, loop: str, procs: int, conns: int, seconds: float, cpus: str | None) -> dict:
    import multisite
    from multisite.net import control
    from multisite.server.process import start_server, stop_server
    from results import boost_session, process_cpu_s

    root = multisite.create(work / f"M-{time.monotonic_ns()}", name="M", durability="group")
    os.environ["MULTISITE_CLIENT_LOOP"] = loop
    info = start_server(root, "127.0.0.1:0", cpus)
    boost_session(info["pid"])
    addr = f"127.0.0.1:{info['client_port']}"
    try:
        with multisite.connect(addr) as c:
            c.create_region("acct")
        clients(addr, 1, 1, 16, 1.0)  # warm-up
        before = control.call(root, "status")["client_commits"]
        load = os.getloadavg()[0]
        cpu0 = process_cpu_s(info["pid"])
        out = clients(addr, procs, conns, 1, seconds)
        cpu1 = process_cpu_s(info["pid"])
        after = control.call(root, "status")["client_commits"]
    finally:
        stop_server(root)
        shutil.rmtree(root, ignore_errors=True)
    groups = after["groups"] - before["groups"]
    n = sum(o["commits"] for o in out)
    return {"rate": n / max(o["seconds"] for o in out), "load": load,
            "per_fsync": (after["commits"] - before["commits"]) / groups if groups else 0,
            "inline": (after.get("inline", 0) - before.get("inline", 0)) / groups if groups else 0,
            "server_cpu_us": (cpu1 - cpu0) / max(1, n) * 1e6,
            "client_cpu_us": statistics.median(o["cpu_us"] for o in out),
            "p50_ms": statistics.median(o["p50_ms"] for o in out)}


# -- the floors: what the disk and the network take, with no database around them ---------------------
def fsync_floor(work: Path, n: int = 2000) -> dict:
    """The fdatasync floor on the file system the instances live on: a loop of a 100-byte ``pwrite``
    and an ``fdatasync`` into a preallocated file, as the journal does per group. Its Python overhead
    (two calls, about 1 us) is noise beside the syscalls, so this is the C loop's speed: no commit
    through any server waits less, and 2 clients that alternate commit at most at 1 / p50. ``cpu_us``:
    the CPU (nearly all kernel time) of one write and fdatasync, which any commit's server pays."""
    path = work / "fsync-floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, bytes(n * 100), 0)
        os.fsync(fd)
        ts = []
        c0 = time.process_time()
        for i in range(n):
            t0 = time.perf_counter_ns()
            os.pwrite(fd, b"x" * 100, i * 100)
            os.fdatasync(fd)
            ts.append(time.perf_counter_ns() - t0)
        cpu = time.process_time() - c0
    finally:
        os.close(fd)
        path.unlink()
    ts.sort()
    return {"p50_us": ts[n // 2] / 1000, "mean_us": sum(ts) / n / 1000, "load": os.getloadavg()[0],
            "cpu_us": cpu / n * 1e6}


def tcp_floor(n: int = 5000) -> dict:
    """Round trip of a 60-byte message between two processes over loopback TCP (TCP_NODELAY, blocking
    sockets): the network's share of a commit's latency. ``cpu_us``: this side's CPU per round trip (a
    send and a receive, nearly all of it kernel time), what a server's reply and next request cost it
    at least."""
    import socket

    lsock = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:  # the echoing process
        try:
            conn, _ = lsock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(4096):
                conn.sendall(data)
        finally:
            os._exit(0)
    s = socket.create_connection(lsock.getsockname())
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ts = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        s.sendall(b"x" * 60)
        got = 0
        while got < 60:
            got += len(s.recv(4096))
        ts.append(time.perf_counter_ns() - t0)
    cpu = time.process_time() - c0
    s.close()
    lsock.close()
    os.waitpid(pid, 0)
    ts.sort()
    return {"p50_us": ts[n // 2] / 1000, "mean_us": sum(ts) / n / 1000, "cpu_us": cpu / n * 1e6}


# -- PostgreSQL -----------------------------------------------------------------------------------
class Postgres:
    def __init__(self, work: Path):
        from multisite.testing.postgres import PostgresServer

        from results import boost_session

        self.pg = PostgresServer(work / "pg").start()
        boost_session(int((self.pg.data / "postmaster.pid").read_text().split()[0]))  # its backends are its children
        with self.pg.connect() as c:
            c.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
            c.execute(f"INSERT INTO acct SELECT g, 0 FROM generate_series(0, {ROWS - 1}) g")
            c.execute("VACUUM ANALYZE acct")
            self.settings = {k: c.execute(f"SHOW {k}").fetchone()[0]
                             for k in ("fsync", "synchronous_commit", "wal_sync_method", "commit_delay")}
        self.script = work / "update.sql"
        self.script.write_text(PG_SCRIPT)

    def rate(self, clients_n: int, seconds: float) -> dict:
        load = os.getloadavg()[0]
        res = subprocess.run([str(self.pg.bin / "pgbench"), "-n", "-c", str(clients_n), "-j", "2",
                              "-T", str(int(seconds)), "-f", str(self.script), "-h", "127.0.0.1",
                              "-p", str(self.pg.port), "-U", "postgres", "postgres"],
                             capture_output=True, text=True, check=True)
        m = re.search(r"tps = ([\d.]+)", res.stdout)
        lat = re.search(r"latency average = ([\d.]+) ms", res.stdout)
        return {"rate": float(m[1]), "load": load, "p50_ms": float(lat[1]) if lat else 0}

    def close(self) -> None:
        self.pg.stop()


# -- end to end -----------------------------------------------------------------------------------
def end_to_end(work: Path, how: str, n: int) -> dict:
    """``n`` single-update transactions committed on A (through clients, or ``serve``'s handle) and
    applied on B; the rate over the time until B applied the last."""
    import multisite
    from multisite.net import control
    from multisite.server.process import start_server, stop_server

    stamp = time.monotonic_ns()
    a = multisite.create(work / f"A-{stamp}", name="A", durability="group")
    b = multisite.create(work / f"B-{stamp}", name="B", durability="group")
    from results import boost_session

    boost_session(start_server(b, None)["pid"])
    srv = None
    try:
        port = control.call(b, "receiver.start", listen="127.0.0.1:0")["listen"].rsplit(":", 1)[1]
        if how == "serve":
            srv = multisite.serve(a, listen="127.0.0.1:0")
            addr = srv.address
        else:
            info = start_server(a, '127.0.0.1:0')
            boost_session(info["pid"])
            addr = f"127.0.0.1:{info['client_port']}"
        control.call(a, "source.start", secondary="B", connect=f"127.0.0.1:{port}")
        with multisite.connect(addr) as c:
            c.create_region("acct")
        base = control.call(a, "status")["seqno"]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        if how == "serve":
            threads, each = 32, n // 32
            db = srv.db

            def commit(t: int) -> None:
                rnd = random.Random(t)
                for _ in range(each):
                    db.set("acct", (rnd.randrange(ROWS),), rnd.randrange(1 << 30))

            ths = [threading.Thread(target=commit, args=(t,)) for t in range(threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            n = threads * each
        else:
            out = clients(addr, 2, 8, 16, 3600, n // 2)
            n = sum(o["commits"] for o in out)
        committed = time.perf_counter() - t0
        last = control.call(a, "status")["seqno"]
        deadline = time.monotonic() + 300
        while control.call(b, "status")["seqno"] < last and time.monotonic() < deadline:
            time.sleep(0.005)
        applied = time.perf_counter() - t0
        assert last - base == n, (last, base, n)
    finally:
        if srv is not None:
            srv.close()
        elif (a / "run" / "server.json").exists():
            stop_server(a)
        stop_server(b)
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)
    return {"rate": n / applied, "committed_rate": n / committed, "load": load, "n": n}


# -- the report ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs, print only")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--e2e", type=int, default=100_000, help="transactions of each end-to-end run (0: none)")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        addr, conns, depth, seconds, total = a.worker
        worker(addr, int(conns), int(depth), float(seconds), int(total))
        return
    seconds, rounds, e2e = (4.0, 1, min(a.e2e, 20_000)) if a.quick else (a.seconds, a.rounds, a.e2e)
    from results import boost_session

    global BOOSTED
    BOOSTED = boost_session(os.getpid())  # this session: the client processes and pgbench
    work = Path(tempfile.mkdtemp(prefix="bench-client-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    configs = [(name, n) for n in (2, 16) for name in MULTISITE + ("PostgreSQL",)]
    runs: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
    e2e_runs: dict[str, list[dict]] = {"clients": [], "serve": []}
    pg = Postgres(work)
    loads = [os.getloadavg()]
    floors: list[dict] = []
    try:
        for r in range(rounds):
            floors.append({"fsync": fsync_floor(work), "tcp": tcp_floor()})
            f = floors[-1]
            print(f"round {r + 1}: floors: write+fdatasync p50 {f['fsync']['p50_us']:.0f} us (mean "
                  f"{f['fsync']['mean_us']:.0f}, CPU {f['fsync']['cpu_us']:.0f}), TCP round trip p50 "
                  f"{f['tcp']['p50_us']:.0f} us (CPU {f['tcp']['cpu_us']:.0f}) (load {f['fsync']['load']:.2f})", flush=True)
            order = configs if r % 2 == 0 else configs[::-1]
            for name, n in order:
                if name == "PostgreSQL":
                    res = pg.rate(n, seconds)
                else:
                    res = multisite_rate(work, name.split()[1], 2, n // 2, seconds, "0" if "cpus" in name else None)
                runs[(name, n)].append(res)
                extra = (f", server CPU {res['server_cpu_us']:.0f} us/commit, client {res['client_cpu_us']:.0f}, "
                         f"{res['per_fsync']:.2f} commits/fdatasync, {res['inline']:.0%} on the loop"
                         if "server_cpu_us" in res else "")
                print(f"round {r + 1}: {name} {n} clients: {res['rate']:,.0f} commits/s, p50 {res['p50_ms']:.2f} ms"
                      f"{extra} (load {res['load']:.2f})", flush=True)
        pg.close()
        for r in range(rounds if e2e else 0):  # --e2e 0: the commit rates only
            for how in ("clients", "serve"):
                res = end_to_end(work, how, e2e)
                e2e_runs[how].append(res)
                print(f"round {r + 1}: end to end through {how}: {res['rate']:,.0f} tx/s applied "
                      f"({res['committed_rate']:,.0f} committed; load {res['load']:.2f})", flush=True)
    finally:
        pg.close()
        shutil.rmtree(work, ignore_errors=True)
    loads.append(os.getloadavg())
    text = report(runs, e2e_runs, pg.settings, seconds, rounds, e2e, loads, floors)
    print(text)
    if not a.quick:
        from results import write_section
        write_section("client.py", text)


def med(rs: list[dict], k: str = "rate") -> float:
    return statistics.median(r[k] for r in rs)


def report(runs, e2e_runs, pg_settings, seconds, rounds, e2e, loads, floors) -> str:
    from results import git_state, markers

    begin, end = markers("client.py")
    lines = [begin, "## Client commit path (bench/client.py, issue 14)", "",
             f"git {git_state()}, {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. **Shared machine**: other engineers' work ran "
             f"beside it; load average (1 min) at start {loads[0][0]:.2f}, at end {loads[1][0]:.2f}, and per "
             f"run below. {rounds} rounds of {seconds:.0f} s per configuration, interleaved; medians."
             + (f" Every process of the run at nice {os.getpriority(os.PRIO_PROCESS, 0)}, each server's session too "
                f"(`results.boost_session`)." if BOOSTED else ""),
             f"PostgreSQL 15: {', '.join(f'{k}={v}' for k, v in pg_settings.items())}.", "",
             "| durable commits/s | " + " | ".join(MULTISITE) + " | PostgreSQL (pgbench) | "
             + " | ".join(f"ratio {m.split(' ', 1)[1]} / PG" for m in MULTISITE)
             + f" | commits per fdatasync ({MULTISITE[0].split(' ', 1)[1]}) | load avg |",
             "|---|" + "---:|" * (2 * len(MULTISITE) + 2) + "---|"]
    for n in (2, 16):
        p = runs[("PostgreSQL", n)]
        ms = [runs[(m, n)] for m in MULTISITE]
        who = "2 client connections (2 processes x 1)" if n == 2 else "16 connections (2 processes x 8)"
        ld = "/".join(f"{r['load']:.1f}" for rs in ms + [p] for r in rs)
        lines.append(f"| {who} | " + " | ".join(f"{med(rs):,.0f}" for rs in ms) + f" | {med(p):,.0f} | "
                     + " | ".join(f"{med(rs) / med(p):.2f}" for rs in ms)
                     + f" | {med(ms[0], 'per_fsync'):.1f} | {ld} |")
    fs, tcp = [f["fsync"] for f in floors], [f["tcp"] for f in floors]
    lines += ["", "Latency (median of the client processes' medians, ms): "
              + "; ".join(f"{name} {n}: {med(runs[(name, n)], 'p50_ms'):.2f}" for name, n in runs), "",
              "CPU per commit (us; server: the server process's every thread from /proc, client: one client "
              "process), commits per fdatasync, share of groups hardened on the loop: "
              + "; ".join(f"{name} {n}: server {med(runs[(name, n)], 'server_cpu_us'):.0f}, client "
                          f"{med(runs[(name, n)], 'client_cpu_us'):.0f}, {med(runs[(name, n)], 'per_fsync'):.2f}/fdatasync, "
                          f"{med(runs[(name, n)], 'inline'):.0%} on the loop" for name, n in runs if name != "PostgreSQL"),
              "",
              f"Floors (same run, medians of {len(floors)}): write+fdatasync on this file system p50 "
              f"{med(fs, 'p50_us'):.0f} us (mean {med(fs, 'mean_us'):.0f} us): one fdatasync per commit, back to "
              f"back, allows {1e6 / med(fs, 'p50_us'):,.0f} commits/s; loopback TCP round trip p50 "
              f"{med(tcp, 'p50_us'):.0f} us. CPU of the same syscalls, no database around them: write+fdatasync "
              f"{med(fs, 'cpu_us'):.0f} us, a TCP round trip's send and receive {med(tcp, 'cpu_us'):.0f} us: a server "
              f"doing one of each per commit spends at least {med(fs, 'cpu_us') + med(tcp, 'cpu_us'):.0f} us of CPU "
              f"on it.", "",
              f"| end to end, committed on A and applied on B ({e2e:,} single-update tx) | tx/s applied "
              f"| tx/s committed | target | load avg |", "|---|---:|---:|---:|---|"]
    for how, what in (("clients", "through clients (2 processes x 8 connections, 16 pipelined each)"),
                      ("serve", "through `multisite.serve`'s handle (32 threads on `srv.db`)")):
        rs = e2e_runs[how]
        if not rs:
            lines.append(f"| {what} | not run (--e2e 0) | | 20,000 | |")
            continue
        lines.append(f"| {what} | {med(rs):,.0f} | {med(rs, 'committed_rate'):,.0f} | 20,000 | "
                     + "/".join(f"{r['load']:.1f}" for r in rs) + " |")
    lines += ["", end]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
