"""Log shipping under load, every row of issue 14's table, beside PostgreSQL in the same run.

    .venv/bin/python bench/replication.py                  # 3 runs of 20 s, medians; writes RESULTS.md
    .venv/bin/python bench/replication.py --quick          # 1 run of 5 s, prints only
    .venv/bin/python bench/replication.py --runs 2 --seconds 10 --rows commit2,lag

Every multisite instance is a ``group``-durability instance served by its own ``multisite server``
process: the primary P with ``--cpus`` on the first CPU this script may use, the secondary S on the
second (as the issue measured). S runs ``receiver start``, P ``source start --secondary S`` (with
``--compress`` where a row says so). Clients commit single-update transactions
(``set("acct", ("k", i), {"n": i})``, a new key each) through ``multisite.connect``, one TCP
connection per thread, after a second of warm-up. Rows (``--rows``, comma-separated names):

- ``commit2``: 2 client threads (this process), without / with S attached: commits/s.
- ``commit16``: 2 client processes x 8 threads, without / with S; with S also **end to end**: the
  transactions S applied per second over the same window (committed on P *and* applied on S).
- ``lag``: 5,000 tx/s offered by 16 paced threads (each its share, on a fixed schedule) with S
  attached, ``--compress 0`` and ``--compress 3``. A probe thread takes the seqno a client just got
  back from its commit and polls S's client port (``seqno``, every 0.1 ms) until S shows it: commit
  → visible on S, p50/p99. The source's ``backlog`` is sampled every 0.5 s; *bounded* means it ended
  the run below one second of offered load and below the run's first sample plus that. Bytes per
  transaction: the source's ``bytes_sent`` (every byte it wrote to S: batches and heartbeats) over
  its ``sent_records`` in the window.
- ``serve``: the same 5,000 tx/s from 16 threads inside the server process, through
  ``multisite.serve(DIR, listen=...).db`` (a worker process pinned to P's CPU), and end to end
  through it at full speed (16 threads, unpaced). If this tree has no ``multisite.serve`` the row
  says so (not measured).
- ``postgres``: PostgreSQL 15 (``pgbench -c 2 -j 2``, a script inserting one new row per transaction
  with ``INSERT ... ON CONFLICT DO UPDATE``; ``fsync`` and ``synchronous_commit`` on, the defaults)
  alone, with a physical streaming standby (``pg_basebackup -R``, asynchronous), and with a logical
  subscriber (a publication of the table, a subscription without copy); the primary pinned to the
  first CPU (``taskset``), the standby or subscriber to the second. Throwaway clusters under
  bench/out/; the binaries from /usr/lib/postgresql/*/bin, installed from Debian's ``postgresql``
  package when missing (as root).

Configurations alternate within each run; the table gives medians over the runs. The machine may be
shared: the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

import multisite
from multisite.net import control
from multisite.server.process import start_server, stop_server
from multisite.testing.postgres import free_port, pg_bindir
from results import boost_session, git_state, markers, process_cpu_s, write_section

HERE = Path(__file__).resolve().parent
CPUS = [str(c) for c in sorted(os.sched_getaffinity(0))]
P_CPU, S_CPU = CPUS[0], CPUS[1 % len(CPUS)]
OFFERED_TX_S = 5000
LAG_THREADS = 16
PROBE_POLL_S = 0.0001
BACKLOG_SAMPLE_S = 0.5
WARMUP_S = 1.0
ROWS = ("commit2", "commit16", "lag", "serve", "postgres")
console = Console()


def note(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


# -- multisite: a primary and (optionally) a secondary ----------------------------------------------
class Pair:
    """P (served on P_CPU) and, if ``secondary``, S (on S_CPU) linked with ``compress``."""

    def __init__(self, work: Path, secondary: bool, compress: int = 0, serve_primary: bool = False,
                 s_tree: Path | None = None):
        self.work = work / f"pair-{time.monotonic_ns()}"
        self.p = multisite.create(self.work / "P", name="P", durability="group")
        self.s = multisite.create(self.work / "S", name="S", durability="group") if secondary else None
        self.compress = compress
        self.p_addr = self.s_addr = None
        self.started: list[Path] = []
        if self.s is not None:
            old = os.environ.get("PYTHONPATH")
            if s_tree is not None:  # S from another code tree (a baseline in the same run)
                os.environ["PYTHONPATH"] = str(s_tree)
            try:
                info = start_server(self.s, "127.0.0.1:0", S_CPU)
            finally:
                if old is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = old
            self.s_pid = info["pid"]
            boost_session(self.s_pid)
            self.started.append(self.s)
            self.s_addr = f"127.0.0.1:{info['client_port']}"
            res = control.call(self.s, "receiver.start", listen="127.0.0.1:0")
            self.receiver = res["listen"]
        if not serve_primary:
            info = start_server(self.p, "127.0.0.1:0", P_CPU)
            boost_session(info["pid"])
            self.started.append(self.p)
            self.p_addr = f"127.0.0.1:{info['client_port']}"
            with multisite.connect(self.p_addr) as db:
                db.create_region("acct")
            self.link()

    def link(self) -> None:
        if self.s is None:
            return
        control.call(self.p, "source.start", secondary="S", connect=self.receiver, compress=self.compress)
        deadline = time.monotonic() + 30
        while self.source()["state"] != "streaming":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the source never connected: {self.source()}")
            time.sleep(0.05)

    def source(self) -> dict:
        return control.call(self.p, "source.status", secondary="S")

    def s_cpu_s(self) -> float:
        """CPU seconds (user + system) S's server process has used so far."""
        return process_cpu_s(self.s_pid)

    def s_seqno(self) -> int:
        return control.call(self.s, "status")["seqno"]

    def close(self) -> None:
        for root in reversed(self.started):
            try:
                stop_server(root, 10)
            except Exception as e:  # a server that will not stop must not keep the bench from the next run
                note(f"[red]stopping {root}: {e}[/red]")
        shutil.rmtree(self.work, ignore_errors=True)


def committer(set_fn, t: int, stop: threading.Event, counts: list[int], pace_s: float | None = None,
              last: list | None = None) -> None:
    """Commit new keys until ``stop``; with ``pace_s``, one every ``pace_s`` on a fixed schedule
    (catching up without sleeping when behind). ``last`` gets (seqno, time) of each commit."""
    i = t * 10**9
    nxt = time.perf_counter()
    while not stop.is_set():
        if pace_s is not None:
            nxt += pace_s
            d = nxt - time.perf_counter()
            if d > 0:
                time.sleep(d)
        seqno = set_fn("acct", ("k", i), {"n": i})
        if last is not None:
            last[0] = (seqno, time.perf_counter())
        i += 1
        counts[t] += 1


def threads_commit(open_db, n: int, seconds: float, pace_s: float | None = None, last: list | None = None,
                   during=None):
    """``n`` threads committing for WARMUP_S + ``seconds``; ``during(t0)`` runs at the window's start
    and its result is returned with (commits, seconds of the window)."""
    stop, counts = threading.Event(), [0] * n
    dbs = [open_db() for _ in range(n)]
    ths = [threading.Thread(target=committer, args=(dbs[t].set, t, stop, counts, pace_s, last), daemon=True)
           for t in range(n)]
    for th in ths:
        th.start()
    try:
        time.sleep(WARMUP_S)
        n0, t0 = sum(counts), time.perf_counter()
        extra = during(t0 + seconds) if during else None
        rest = t0 + seconds - time.perf_counter()
        if rest > 0:
            time.sleep(rest)
        got, dt = sum(counts) - n0, time.perf_counter() - t0
    finally:
        stop.set()
        for th in ths:
            th.join(30)
        for db in dbs:
            try:
                db.close()
            except Exception:
                pass
    return got, dt, extra


def worker_commit(addr: str, n: int, seconds: float) -> None:
    """A client process (``--worker``): n threads, prints {"n": commits, "dt": seconds}."""
    got, dt, _ = threads_commit(lambda: multisite.connect(addr), n, seconds,
                                during=lambda end: print("window", flush=True))  # the parent's cue
    print(json.dumps({"n": got, "dt": dt}), flush=True)


def commit_rate(pair: Pair, procs: int, conns: int, seconds: float) -> dict:
    """Commits/s of ``procs`` x ``conns`` clients on P; S's applied/s over the same window."""
    out = {}

    def applied(end: float) -> None:
        if pair.s is None:
            return None
        s0, t0 = pair.s_seqno(), time.perf_counter()
        time.sleep(max(0.0, end - time.perf_counter()))
        return (pair.s_seqno() - s0) / (time.perf_counter() - t0)

    if procs == 1:
        got, dt, e2e = threads_commit(lambda: multisite.connect(pair.p_addr), conns, seconds, during=applied)
        out["commits_s"] = got / dt
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", pair.p_addr, str(conns), str(seconds)]
        ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
        for p in ps:  # S's window starts with the workers' (after their imports, connections and warm-up)
            p.stdout.readline()
        e2e = applied(time.perf_counter() + seconds)
        res = [json.loads(p.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1]) for p in ps]
        out["commits_s"] = sum(r["n"] / r["dt"] for r in res)
    if e2e is not None:
        out["e2e_s"] = e2e
    return out


# -- lag at an offered rate -------------------------------------------------------------------------
def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def offered_load(open_db, s_addr: str, source_status, seconds: float, s_cpu=None) -> dict:
    """OFFERED_TX_S from LAG_THREADS paced threads; commit → visible on S; backlog; bytes/tx."""
    last: list = [None]
    lags: list[float] = []
    probe_error: list[str] = []
    backlog: list[int] = []

    def during(end: float) -> dict:
        st0 = source_status()
        cpu0 = s_cpu() if s_cpu else None
        halt = threading.Event()

        def probe() -> None:
            try:
                with multisite.connect(s_addr) as sdb:
                    while not halt.is_set():
                        got = last[0]
                        if got is None:
                            time.sleep(0.001)
                            continue
                        seqno, t_commit = got
                        while seqno_of(sdb) < seqno and not halt.is_set():
                            time.sleep(PROBE_POLL_S)
                        if not halt.is_set():
                            lags.append(time.perf_counter() - t_commit)
                        time.sleep(0.005)
            except Exception as e:  # reported, not swallowed: a lag figure without samples is no figure
                probe_error.append(repr(e))

        th = threading.Thread(target=probe, daemon=True)
        th.start()
        while time.perf_counter() < end:
            backlog.append(source_status()["backlog"])
            time.sleep(min(BACKLOG_SAMPLE_S, max(0.0, end - time.perf_counter())))
        st1 = source_status()
        cpu1 = s_cpu() if s_cpu else None
        backlog.append(st1["backlog"])
        halt.set()
        th.join(10)
        return {"bytes": st1["bytes_sent"] - st0["bytes_sent"], "sent": st1["sent_records"] - st0["sent_records"],
                "batches": st1["sent_batches"] - st0["sent_batches"], "compression": st1.get("compression"),
                "s_cpu": None if cpu0 is None else cpu1 - cpu0}

    got, dt, b = threads_commit(open_db, LAG_THREADS, seconds, pace_s=LAG_THREADS / OFFERED_TX_S, last=last,
                                during=during)
    bound = OFFERED_TX_S  # one second of offered load
    return {"achieved_s": got / dt, "lag_p50_ms": percentile(lags, 0.5) * 1e3,
            "lag_p99_ms": percentile(lags, 0.99) * 1e3, "samples": len(lags), "backlog_max": max(backlog),
            "backlog_end": backlog[-1], "bounded": backlog[-1] < bound and backlog[-1] < backlog[0] + bound,
            "bytes_per_tx": b["bytes"] / max(1, b["sent"]), "tx_per_batch": b["sent"] / max(1, b["batches"]),
            "compression": b["compression"],
            "s_cpu_us_per_tx": None if b["s_cpu"] is None else b["s_cpu"] / max(1, b["sent"]) * 1e6,
            **({"probe_error": probe_error[0]} if probe_error else {})}


def seqno_of(db) -> int:
    """The seqno a database handle shows (a property on ``multisite.connect``'s handle)."""
    s = db.seqno
    return s() if callable(s) else s


def lag_run(work: Path, compress: int, seconds: float, s_tree: Path | None = None) -> dict:
    pair = Pair(work, secondary=True, compress=compress, s_tree=s_tree)
    try:
        return offered_load(lambda: multisite.connect(pair.p_addr), pair.s_addr, pair.source, seconds,
                            pair.s_cpu_s)
    finally:
        pair.close()


# -- inside the server process (multisite.serve) ----------------------------------------------------
def serve_worker(work: str, seconds: float) -> None:
    """``--serve-worker``: P served in this process (pinned to P_CPU), linked to the S the parent
    started; the offered load, then full speed, from 16 threads on the embedded handle."""
    os.sched_setaffinity(0, {int(P_CPU)})
    spec = json.loads(Path(work, "serve.json").read_text())
    handle = multisite.serve(spec["p"], listen="127.0.0.1:0")
    try:
        handle.db.create_region("acct")
        control.call(spec["p"], "source.start", secondary="S", connect=spec["receiver"], compress=0)
        deadline = time.monotonic() + 30
        while control.call(spec["p"], "source.status", secondary="S")["state"] != "streaming":
            if time.monotonic() > deadline:
                raise RuntimeError("the source never connected")
            time.sleep(0.05)
        status = lambda: control.call(spec["p"], "source.status", secondary="S")  # noqa: E731
        lag = offered_load(lambda: _NoClose(handle.db), spec["s_addr"], status, seconds)
        s_seq = lambda: control.call(spec["s"], "status")["seqno"]  # noqa: E731

        def applied(end: float) -> float:
            s0, t0 = s_seq(), time.perf_counter()
            time.sleep(max(0.0, end - time.perf_counter()))
            return (s_seq() - s0) / (time.perf_counter() - t0)

        got, dt, e2e = threads_commit(lambda: _NoClose(handle.db), LAG_THREADS, seconds, during=applied)
        print(json.dumps({"lag": lag, "commits_s": got / dt, "e2e_s": e2e}), flush=True)
    finally:
        handle.close()


class _NoClose:
    """The embedded handle shared by threads: their ``close`` must not close it."""

    def __init__(self, db):
        self.set = db.set

    def close(self) -> None:
        pass


def serve_run(work: Path, seconds: float) -> dict:
    if not hasattr(multisite, "serve"):
        return {"missing": "multisite.serve does not exist in this tree (the `client` branch adds it)"}
    pair = Pair(work, secondary=True, serve_primary=True)
    try:
        (pair.work / "serve.json").write_text(json.dumps({"p": str(pair.p), "s": str(pair.s),
                                                          "receiver": pair.receiver, "s_addr": pair.s_addr}))
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--serve-worker", str(pair.work),
                              str(seconds)], capture_output=True, text=True, timeout=2 * seconds + 120)
        if res.returncode != 0:
            return {"missing": f"the serve worker failed: {res.stderr.strip().splitlines()[-1:]}"}
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        pair.close()


# -- PostgreSQL -------------------------------------------------------------------------------------
PG_CONF = """
listen_addresses = '127.0.0.1'
wal_level = {wal_level}
max_wal_senders = 10
max_replication_slots = 10
shared_buffers = '256MB'
max_wal_size = '4GB'
checkpoint_timeout = '1h'
hot_standby = on
"""
PGBENCH_SCRIPT = """\\set k random(1, 2000000000)
INSERT INTO acct VALUES (:k, '{"n": 1}') ON CONFLICT (k) DO UPDATE SET v = excluded.v;
"""


def ensure_postgres() -> Path:
    found = pg_bindir()
    if found is not None and (found / "pgbench").exists():
        return found
    if os.geteuid() != 0:
        raise SystemExit("no PostgreSQL binaries (pg_ctl, pgbench): install Debian's `postgresql` package, or "
                         "leave `postgres` out of --rows")
    note("PostgreSQL is missing: installing Debian's postgresql package ...")
    subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], check=True, capture_output=True)
    found = pg_bindir()
    if found is None:
        raise SystemExit("apt-get installed postgresql, but no pg_ctl was found under /usr/lib/postgresql")
    return found


class PGCluster:
    """One throwaway cluster on one CPU, as the ``postgres`` user when this script runs as root."""

    def __init__(self, bindir: Path, data: Path, cpu: str):
        from catchup import PG
        self.pg = PG(bindir)
        self.data, self.cpu, self.port = data, cpu, free_port()

    def init(self, wal_level: str) -> PGCluster:
        self.pg.mkdir(self.data.parent)
        self.pg.run("initdb", "-D", self.data, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(PG_CONF.format(wal_level=wal_level))
        return self

    def start(self) -> PGCluster:
        subprocess.run(["taskset", "-c", self.cpu, *self.pg.as_user, str(self.pg.bin / "pg_ctl"), "-D",
                        str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "120", "-o",
                        f"-p {self.port} -k {self.data}", "start"], check=True, capture_output=True)
        return self

    def psql(self, sql: str) -> str:
        return self.pg.psql(self.port, sql)

    def stop(self) -> None:
        self.pg.stop(self.data, "immediate")


def pg_run(bindir: Path, work: Path, mode: str, seconds: float) -> float:
    """pgbench tps with 2 clients: mode ``none``, ``physical`` (a streaming standby) or ``logical``."""
    run = work / f"pg-{mode}-{time.monotonic_ns()}"
    prim = PGCluster(bindir, run / "primary", P_CPU).init("logical" if mode == "logical" else "replica").start()
    other = None
    try:
        prim.psql("CREATE TABLE acct (k bigint PRIMARY KEY, v jsonb);")
        if mode == "physical":
            other = PGCluster(bindir, run / "standby", S_CPU)
            prim.pg.mkdir(run)
            prim.pg.run("pg_basebackup", "-D", other.data, "-h", "127.0.0.1", "-p", prim.port, "-U", "postgres",
                        "-X", "stream", "-R", "--no-sync")
            other.start()
            wait_pg(lambda: prim.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == "1",
                    "the standby to stream")
        elif mode == "logical":
            other = PGCluster(bindir, run / "sub", S_CPU).init("replica").start()
            prim.psql("CREATE PUBLICATION p FOR TABLE acct;")
            other.psql("CREATE TABLE acct (k bigint PRIMARY KEY, v jsonb);")
            other.psql(f"CREATE SUBSCRIPTION s CONNECTION 'host=127.0.0.1 port={prim.port} user=postgres "
                       f"dbname=postgres' PUBLICATION p WITH (copy_data = false);")
            wait_pg(lambda: prim.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == "1",
                    "the subscriber to stream")
        script = run / "insert.sql"
        script.write_text(PGBENCH_SCRIPT)
        os.chmod(script, 0o644)
        res = prim.pg.run("pgbench", "-n", "-c", "2", "-j", "2", "-T", int(round(seconds + WARMUP_S)), "-f", script,
                          "-h", "127.0.0.1", "-p", prim.port, "-U", "postgres", "postgres")
        tps = [ln for ln in res.stdout.splitlines() if ln.startswith("tps")]
        return float(tps[0].split("=")[1].split()[0])
    finally:
        if other is not None:
            other.stop()
        prim.stop()
        shutil.rmtree(run, ignore_errors=True)


def wait_pg(ok, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.1)


# -- the run ----------------------------------------------------------------------------------------
@dataclass
class Figures:
    runs: dict[str, list] = field(default_factory=dict)

    def add(self, name: str, value) -> None:
        self.runs.setdefault(name, []).append(value)

    def med(self, name: str, key: str | None = None) -> float | None:
        vs = [v if key is None else v.get(key) for v in self.runs.get(name, [])]
        vs = [v for v in vs if isinstance(v, (int, float))]
        return statistics.median(vs) if vs else None


def one_round(work: Path, rows: set[str], seconds: float, fig: Figures, flip: bool, pg_bin: Path | None,
              s_tree: Path | None) -> None:
    jobs = []
    if "commit2" in rows:
        jobs += [("ms2-none", lambda: with_pair(work, False, lambda p: commit_rate(p, 1, 2, seconds))),
                 ("ms2-sec", lambda: with_pair(work, True, lambda p: commit_rate(p, 1, 2, seconds)))]
    if "commit16" in rows:
        jobs += [("ms16-none", lambda: with_pair(work, False, lambda p: commit_rate(p, 2, 8, seconds))),
                 ("ms16-sec", lambda: with_pair(work, True, lambda p: commit_rate(p, 2, 8, seconds)))]
    if "lag" in rows:
        jobs += [("lag-c0", lambda: lag_run(work, 0, seconds)), ("lag-c3", lambda: lag_run(work, 3, seconds))]
        if s_tree is not None:
            jobs += [("lag-c0-base", lambda: lag_run(work, 0, seconds, s_tree))]
    if "serve" in rows:
        jobs += [("serve", lambda: serve_run(work, seconds))]
    if "postgres" in rows and pg_bin is not None:
        jobs += [(f"pg-{m}", lambda m=m: pg_run(pg_bin, work, m, seconds)) for m in ("none", "physical", "logical")]
    for name, job in (reversed(jobs) if flip else jobs):
        note(f"{name} ...")
        try:
            v = job()
        except Exception as e:  # one failed configuration is reported, the others still run
            note(f"[red]{name} failed: {e!r}[/red]")
            v = {"failed": repr(e)}
        note(f"{name}: {v}")
        fig.add(name, v)


def with_pair(work: Path, secondary: bool, fn):
    pair = Pair(work, secondary)
    try:
        return fn(pair)
    finally:
        pair.close()


def fmt(v: float | None, spec: str = ",.0f", unit: str = "") -> str:
    return "not measured" if v is None else f"{v:{spec}}{unit}"


def ratio(a: float | None, b: float | None) -> str:
    return "" if a is None or not b else f" (ratio {a / b:.2f})"


def table_rows(f: Figures) -> list[tuple[str, str, str, str]]:
    """(figure, multisite, PostgreSQL, target) rows, as in the issue."""
    m = f.med
    rows = []
    rows.append(("durable commits/s, 2 client connections, no secondary", fmt(m("ms2-none", "commits_s")),
                 fmt(m("pg-none")) + " (pgbench, 2 clients)", "≥ PostgreSQL"))
    rows.append(("same, streaming secondary attached",
                 fmt(m("ms2-sec", "commits_s")) + ratio(m("ms2-sec", "commits_s"), m("ms2-none", "commits_s")),
                 fmt(m("pg-physical")) + ratio(m("pg-physical"), m("pg-none")) + "; logical "
                 + fmt(m("pg-logical")) + ratio(m("pg-logical"), m("pg-none")), "ratio ≥ 0.85"))
    rows.append(("2 client processes × 8 connections, without / with secondary",
                 f"{fmt(m('ms16-none', 'commits_s'))} / {fmt(m('ms16-sec', 'commits_s'))}"
                 + ratio(m("ms16-sec", "commits_s"), m("ms16-none", "commits_s")), "", "ratio ≥ 0.85"))
    serve_missing = next((v["missing"] for v in f.runs.get("serve", []) if "missing" in v), None)
    serve_e2e = "not measured: " + serve_missing if serve_missing else fmt(m("serve", "e2e_s"))
    rows.append(("end to end (committed and applied), through `multisite.connect` (2×8)",
                 fmt(m("ms16-sec", "e2e_s")), "", "≥ 20,000"))
    rows.append(("end to end, through `multisite.serve(...).db` (16 threads)", serve_e2e, "", "≥ 20,000"))
    for c in (0, 3):
        runs = f.runs.get(f"lag-c{c}", [])
        bounded = sum(1 for r in runs if r.get("bounded"))
        rows.append((f"lag commit → visible on the secondary at {OFFERED_TX_S:,} tx/s offered by {LAG_THREADS} "
                     f"client threads (`--compress {c}`)",
                     f"p50 {fmt(m(f'lag-c{c}', 'lag_p50_ms'), '.2f')} ms, "
                     f"p99 {fmt(m(f'lag-c{c}', 'lag_p99_ms'), '.2f')}"
                     f" ms at {fmt(m(f'lag-c{c}', 'achieved_s'))} tx/s; backlog bounded in {bounded} of {len(runs)} "
                     f"run(s) (max {fmt(m(f'lag-c{c}', 'backlog_max'))})", "", "p50 < 2 ms, p99 < 10 ms"))
    serve_lag = ("not measured: " + serve_missing if serve_missing else
                 f"p50 {fmt(median_in(f, 'serve', 'lag', 'lag_p50_ms'), '.2f')} ms, p99 "
                 f"{fmt(median_in(f, 'serve', 'lag', 'lag_p99_ms'), '.2f')} ms")
    rows.append(("same load from 16 threads inside the server process (`multisite.serve`)", serve_lag, "", ""))
    cpu, base = m("lag-c0", "s_cpu_us_per_tx"), m("lag-c0-base", "s_cpu_us_per_tx")
    rows.append(("secondary's CPU per transaction in the lag row (`--compress 0`; user + system of its server)",
                 f"{fmt(cpu, '.0f')} µs" + (f" vs {fmt(base, '.0f')} µs with the secondary from --secondary-tree "
                                            f"(ratio {cpu / base:.2f})" if cpu and base else ""), "", "less"))
    b0, b3 = m("lag-c0", "bytes_per_tx"), m("lag-c3", "bytes_per_tx")
    rows.append((f"bytes per transaction streaming at {OFFERED_TX_S:,} tx/s, `--compress 3` vs none",
                 f"{fmt(b3, '.1f')} vs {fmt(b0, '.1f')}" + (f" ({b0 / b3:.2f}x)" if b0 and b3 else "")
                 + f"; {fmt(m('lag-c3', 'tx_per_batch'), '.1f')} tx per batch", "", "≥ 3x fewer"))
    return rows


def median_in(f: Figures, name: str, sub: str, key: str) -> float | None:
    vs = [v[sub][key] for v in f.runs.get(name, []) if isinstance(v.get(sub), dict)]
    return statistics.median(vs) if vs else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker_commit(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-worker":
        return serve_worker(sys.argv[2], float(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 run of 5 s; prints, does not write RESULTS.md")
    ap.add_argument("--runs", type=int, default=3, help="runs of every configuration (medians)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per configuration and run")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--secondary-tree", type=Path, metavar="SRC",
                    help="also run the lag row (--compress 0) with the secondary's server from this src/ directory "
                         "(e.g. a checkout of main): its CPU per transaction is the baseline of the secondary's")
    a = ap.parse_args()
    runs, seconds = (1, 5.0) if a.quick else (a.runs, a.seconds)
    rows = {r.strip() for r in a.rows.split(",") if r.strip()}
    if rows - set(ROWS):
        ap.error(f"unknown rows {sorted(rows - set(ROWS))}; choose from {', '.join(ROWS)}")
    if len(CPUS) < 2:
        note("[yellow]only one CPU available: primary and secondary share it[/yellow]")
    boost_session(os.getpid())
    pg_bin = ensure_postgres() if "postgres" in rows else None
    work = HERE / "out" / f"replication-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    load0, t_start = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    fig = Figures()
    try:
        for r in range(runs):
            note(f"run {r + 1}/{runs}")
            one_round(work, rows, seconds, fig, flip=r % 2 == 1, pg_bin=pg_bin, s_tree=a.secondary_tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    t = Table(title=f"Log shipping, {runs} run(s) of {seconds:g} s, medians")
    for c in ("figure", "multisite", "PostgreSQL same run", "target"):
        t.add_column(c)
    trows = table_rows(fig)
    for row in trows:
        t.add_row(*row)
    console.print(t)
    raw = HERE / "out" / "replication-last.json"
    raw.write_text(json.dumps(fig.runs, indent=1, default=str))
    console.print(f"every run's figures: {raw}")
    if a.quick:
        return
    begin, end = markers("replication.py")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    pgv = ""
    if pg_bin is not None:
        pgv = subprocess.run([str(pg_bin / "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    lines = [begin, "## Log shipping under load (`bench/replication.py`, issue 14)", "",
             f"Run {t_start} on commit {git_state()}: {machine}; {pgv or 'PostgreSQL not run'}. Load average "
             f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} before, {load1[0]:.1f} / {load1[1]:.1f} / "
             f"{load1[2]:.1f} after: **the machine (2 cores) was shared with other engineers' work**, so "
             f"absolute figures are low and noisy; ratios are within one run. {runs} run(s) of {seconds:g} s per "
             f"configuration, medians; group durability; primary on CPU {P_CPU}, secondary on CPU {S_CPU} "
             f"(`--cpus`, `taskset` for PostgreSQL).", "",
             "| figure | multisite | PostgreSQL same run | target |", "|---|---|---|---|"]
    lines += [f"| {a_} | {b_} | {c_} | {d_} |" for a_, b_, c_, d_ in trows]
    lines += ["", "Lag: a probe takes the seqno a client just got back and polls the secondary's client port "
              "until it shows it (so a figure includes up to one poll round trip). Bytes: every byte the Source "
              "Server wrote (batches and heartbeats) over the records it sent in the window.", "",
              "Reproduce: `.venv/bin/python bench/replication.py` (`--quick`, `--runs`, `--seconds`, `--rows`).",
              end]
    write_section("replication.py", "\n".join(lines) + "\n")
    console.print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
