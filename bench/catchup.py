"""Catch-up of a secondary N single-update transactions behind, with real processes, beside PostgreSQL.

    .venv/bin/python bench/catchup.py                                   # the code it runs with, N = 1,000,000
    .venv/bin/python bench/catchup.py --n 100000 --runs 1               # a quick try
    .venv/bin/python bench/catchup.py --tree before=../old-checkout/src --tree after=src --json out.json

A Makefile target would be ``bench-catchup: ; .venv/bin/python bench/catchup.py $(ARGS)``.

Builds once, cached under bench/out/catchup-cache/ (on the repository's disk, never a tmpfs), a
primary instance A (durability ``none``) holding N single-update transactions in region ``acct``
(key ``(i,)``, value ``{"n": i, "pad": 32 x}``). Then, for each code tree under test (``--tree
LABEL=PATH/src``, repeatable; default: the code this script imports), each run:

- copies A fresh, creates an empty secondary B with ``multisite instance create B --name B`` (same
  group, durability ``--secondary-durability``, the CLI's default ``fsync``);
- ``multisite server start`` A and B, ``multisite receiver start B --listen 127.0.0.1:0``: every
  ``multisite`` command and every server process runs with ``PYTHONPATH`` set to the tree measured;
- starts the clock, issues ``multisite source start A --secondary B --connect 127.0.0.1:PORT`` and
  polls B's seqno every 50 ms over the control socket until it reaches A's: the figure is N / that
  time, the source's start (the CLI process included) and B's last apply included;
- stops both servers and deletes the copies (the servers' logs are kept under bench/out/catchup-logs/).

Trees alternate run by run (in the given order on even runs, reversed on odd ones); the table
gives medians.

Baseline in the same run (``--postgres``, on by default when a PostgreSQL server binary is found;
run as the ``postgres`` user through ``runuser`` when this script runs as root). Built once, cached
as a template: a publisher with ``acct(k int primary key, v jsonb)``, its publication, a logical
replication slot (pgoutput) and a physical slot, a standby from ``pg_basebackup`` and an empty
subscriber, all taken before the load; then the publisher commits N single-row transactions (a DO
block committing each insert, ``synchronous_commit = off``: WAL written, not flushed per commit, like
multisite's ``none``). Each run copies the template and times:

- logical replication: the subscription (``copy_data = false`` on the existing slot, created
  disabled) is enabled, and the clock runs until the subscriber holds key N (then it checks the row
  count); the subscriber applies with the subscription's default ``synchronous_commit = off``;
- physical streaming: the standby is up (hot standby, no ``primary_conninfo``); the clock starts when
  ``primary_conninfo`` is written and the standby is sent SIGHUP, and runs until its replay LSN
  reaches the publisher's current LSN (then it checks the row count). Rows/s = N / seconds.

Polling PostgreSQL goes through one long-lived ``psql`` per server (no driver needed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
CACHE = OUT / "catchup-cache"
LOGS = OUT / "catchup-logs"
MULTISITE = str(Path(sys.executable).with_name("multisite"))
POLL_S = 0.05
PAD = 32

console = Console()
if not console.is_terminal:  # a log file or a pipe: keep the table's rows on one line each
    console = Console(width=200)


def note(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


# -- the primary instance -------------------------------------------------------------------------------
def build_primary(n: int) -> tuple[Path, int]:
    """A (cached): N single-update transactions. Returns (its directory, its seqno)."""
    import multisite  # the code this script runs with builds it; every tree must read it

    path = CACHE / f"primary-{n}"
    stamp = path / "BENCH_PARAMS.json"
    want = {"n": n, "pad": PAD}
    if stamp.exists():
        got = json.loads(stamp.read_text())
        if {k: got.get(k) for k in want} == want:
            return path, got["seqno"]
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    note(f"building the primary: {n:,} single-update transactions (cached in {path}) ...")
    t0 = time.perf_counter()
    multisite.create(path, name="A", durability="none")
    with multisite.open(path) as db:
        db.create_region("acct")
        pad = "x" * PAD
        for i in range(n):
            db.set("acct", (i,), {"n": i, "pad": pad})
        seqno = db.seqno
    stamp.write_text(json.dumps({**want, "seqno": seqno}))
    note(f"built in {time.perf_counter() - t0:.1f} s ({n / (time.perf_counter() - t0):,.0f} tx/s); seqno {seqno:,}")
    return path, seqno


# -- control of a multisite instance server --------------------------------------------------------------
def ctl(root: Path, op: str, timeout: float = 10.0, **args) -> dict:
    """One control request, as ``multisite.net.control.call`` sends it (JSON line over the abstract
    Unix socket named after the instance directory); kept here so that the poll does not depend on
    the tree this script imports."""
    addr = "\0multisite-" + hashlib.sha1(str(Path(root).absolute()).encode()).hexdigest()[:24]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(addr)
        s.sendall((json.dumps({"op": op, "args": args}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                raise RuntimeError(f"{root}: control connection closed during {op}")
            buf += chunk
    reply = json.loads(buf)
    if not reply.get("ok"):
        raise RuntimeError(f"{root}: {op}: {reply.get('error')}")
    return reply["result"]


@dataclass
class Tree:
    label: str
    src: Path
    origin: str = ""  # the multisite package the tree's processes import

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.src), "COLUMNS": "500"}

    def ms(self, *args: object, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run([MULTISITE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                             env=self.env())
        if check and res.returncode != 0:
            raise RuntimeError(f"[{self.label}] `multisite {' '.join(map(str, args))}` failed "
                               f"({res.returncode}): {res.stdout}{res.stderr}")
        return res


def check_tree(t: Tree) -> None:
    res = subprocess.run([sys.executable, "-c", "import multisite; print(multisite.__file__)"], env=t.env(),
                         capture_output=True, text=True, check=True)
    t.origin = str(Path(res.stdout.strip()).parent.parent)
    if Path(t.origin).resolve() != t.src.resolve():
        raise SystemExit(f"tree {t.label}: PYTHONPATH={t.src} imports multisite from {t.origin}")


@dataclass
class MsRun:
    seconds: float
    cli_s: float  # the `source start` command returned
    first_s: float  # B's seqno first moved
    stats: list[str] = field(default_factory=list)


def multisite_run(t: Tree, primary: Path, target: int, work: Path, sec_dur: str, timeout: float,
                  logdir: Path) -> MsRun:
    run = work / f"{t.label}-{time.monotonic_ns()}"
    a, b = run / "A", run / "B"
    shutil.copytree(primary, a)
    started: list[Path] = []
    proc = None
    try:
        t.ms("instance", "create", b, "--name", "B", "--durability", sec_dur)
        for root in (a, b):
            t.ms("server", "start", root)
            started.append(root)
        t.ms("receiver", "start", b, "--listen", "127.0.0.1:0")
        port = int(ctl(b, "receiver.status")["listen"].rsplit(":", 1)[1])
        assert ctl(b, "status")["seqno"] == 0
        t0 = time.perf_counter()
        proc = subprocess.Popen([MULTISITE, "source", "start", a, "--secondary", "B", "--connect",
                                 f"127.0.0.1:{port}"], env=t.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        cli_s = first_s = None
        deadline = t0 + timeout
        while True:
            seqno = ctl(b, "status")["seqno"]
            now = time.perf_counter()
            if seqno and first_s is None:
                first_s = now - t0
            if seqno >= target:
                break
            if cli_s is None and proc.poll() is not None:
                cli_s = now - t0
                if proc.returncode != 0:
                    raise RuntimeError(f"[{t.label}] source start failed: {proc.stdout.read()}")
            if now > deadline:
                raise RuntimeError(f"[{t.label}] B at seqno {seqno:,} of {target:,} after {timeout:.0f} s")
            time.sleep(POLL_S)
        seconds = now - t0
        proc.wait(60)
        if cli_s is None:
            cli_s = seconds  # returned after the catch-up: at most this
        for root in (a, b):  # sources flush and stop first
            t.ms("server", "stop", root, "--timeout", "5")
            started.remove(root)
        logdir.mkdir(parents=True, exist_ok=True)
        stats = []
        for root, name in ((a, "A"), (b, "B")):
            for f in sorted((root / "log").glob("*.log")):
                shutil.copy(f, logdir / f"{name}-{f.name}")
                if f.name != "server.log":  # it repeats the components' own logs
                    stats += [f"{name}/{f.name}: {ln.strip()}" for ln in f.read_text(errors="replace").splitlines()]
        return MsRun(seconds, cli_s, first_s or seconds, stats)
    finally:
        if proc is not None and proc.poll() is None:  # a failed or timed-out run: the CLI must not outlive it
            proc.kill()
            proc.wait(10)
        for root in started:
            t.ms("server", "stop", root, "--timeout", "2", check=False)
        shutil.rmtree(run, ignore_errors=True)


# -- PostgreSQL -------------------------------------------------------------------------------------------
def pg_bindir() -> Path | None:
    for name in ("postgres", "pg_ctl"):
        p = shutil.which(name) or (f"/usr/local/bin/{name}" if os.path.exists(f"/usr/local/bin/{name}") else None)
        if p:
            return Path(p).resolve().parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PG:
    """PostgreSQL clusters started by this script, as a non-root user."""

    def __init__(self, bindir: Path):
        self.bin = bindir
        self.as_user = []
        self.uid = self.gid = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise SystemExit("running as root and there is no `postgres` user to run PostgreSQL as: "
                                 "run as another user, or pass --no-postgres") from None
            self.as_user, self.uid, self.gid = ["runuser", "-u", "postgres", "--"], pw.pw_uid, pw.pw_gid
        self.version = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True,
                                      check=True).stdout.strip()

    def run(self, tool: str, *args: object, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("check", True)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run([*self.as_user, str(self.bin / tool), *map(str, args)], **kw)

    def mkdir(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def start(self, data: Path, port: int) -> None:
        self.run("pg_ctl", "-D", data, "-l", data / "server.log", "-w", "-t", "120", "-o",
                 f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start")

    def stop(self, data: Path, mode: str = "fast") -> None:
        if (data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", data, "-m", mode, "-w", "stop", check=False)

    def psql(self, port: int, sql: str) -> str:
        return self.run("psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", port,
                        "-U", "postgres", "-d", "postgres", input=sql).stdout.strip()


class Session:
    """One long-lived psql: a query costs a round trip, not a process."""

    def __init__(self, pg: PG, port: int):
        self.p = subprocess.Popen([str(pg.bin / "psql"), "-X", "-A", "-t", "-q", "-h", "127.0.0.1", "-p",
                                   str(port), "-U", "postgres", "-d", "postgres"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

    def one(self, sql: str) -> str:
        self.p.stdin.write(sql.rstrip().rstrip(";") + ";\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"psql ended: {self.p.stderr.read()}")
        return line.strip()

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(10)


PG_CONF = """
listen_addresses = '127.0.0.1'
wal_level = logical
max_wal_size = '16GB'
min_wal_size = '1GB'
checkpoint_timeout = '1h'
shared_buffers = '256MB'
max_replication_slots = 10
max_wal_senders = 10
hot_standby = on
"""


def build_pg(pg: PG, n: int) -> dict:
    """The template (cached): pub (N transactions, both slots), standby and sub taken before the load."""
    tpl = CACHE / f"pg-{n}"
    stamp = tpl / "BENCH_PARAMS.json"
    want = {"n": n, "pad": PAD, "version": pg.version}
    if stamp.exists():
        got = json.loads(stamp.read_text())
        if {k: got.get(k) for k in want} == want:
            return got
    if tpl.exists():
        subprocess.run(["rm", "-rf", str(tpl)], check=True)
    pg.mkdir(tpl)
    note(f"building the PostgreSQL template ({pg.version}; cached in {tpl}) ...")
    pub, sub, standby = tpl / "pub", tpl / "sub", tpl / "standby"
    for d in (pub, sub):
        pg.run("initdb", "-D", d, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        with open(d / "postgresql.conf", "a") as f:
            f.write(PG_CONF)
    port = free_port()
    pg.start(pub, port)
    try:
        pg.psql(port, "CREATE TABLE acct (k int PRIMARY KEY, v jsonb);\n"
                      "CREATE PUBLICATION p FOR TABLE acct;\n"
                      "SELECT pg_create_logical_replication_slot('sub_slot', 'pgoutput');\n")
        pg.run("pg_basebackup", "-D", standby, "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-X", "stream",
               "-C", "-S", "phys_slot", "-R", "--no-sync")
        auto = standby / "postgresql.auto.conf"  # -R wrote primary_conninfo: the run sets it itself
        auto.write_text("".join(ln for ln in auto.read_text().splitlines(True) if "primary_conninfo" not in ln)
                        + "primary_slot_name = 'phys_slot'\n")
        t0 = time.perf_counter()
        pg.psql(port, "SET synchronous_commit = off;\n"
                      f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO acct VALUES "
                      f"(i, jsonb_build_object('n', i, 'pad', repeat('x', {PAD}))); COMMIT; END LOOP; END $$;\n")
        load_s = time.perf_counter() - t0
        count = int(pg.psql(port, "SELECT count(*) FROM acct;"))
        assert count == n, count
        lsn = pg.psql(port, "SELECT pg_current_wal_lsn();")
    finally:
        pg.stop(pub)
    sport = free_port()
    pg.start(sub, sport)
    try:
        pg.psql(sport, "CREATE TABLE acct (k int PRIMARY KEY, v jsonb);")
    finally:
        pg.stop(sub)
    info = {**want, "load_s": load_s, "lsn": lsn}
    stamp.write_text(json.dumps(info))
    note(f"PostgreSQL loaded {n:,} single-row transactions in {load_s:.1f} s ({n / load_s:,.0f} tx/s)")
    return info


def pg_copy(pg: PG, n: int, work: Path, names: tuple[str, ...]) -> Path:
    run = pg.mkdir(work / f"pg-{time.monotonic_ns()}")
    for name in names:  # cp -a: the owner and the 0700 mode PostgreSQL insists on
        subprocess.run(["cp", "-a", str(CACHE / f"pg-{n}" / name), str(run / name)], check=True)
    return run


def wait_for(what: str, fn, timeout: float) -> float:
    t0 = time.perf_counter()
    while not fn():
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"PostgreSQL: {what} not done after {timeout:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter()


def pg_logical(pg: PG, n: int, work: Path, timeout: float) -> float:
    run = pg_copy(pg, n, work, ("pub", "sub"))
    pub, sub = run / "pub", run / "sub"
    pport, sport = free_port(), free_port()
    s = None
    try:
        pg.start(pub, pport)
        pg.start(sub, sport)
        pg.psql(sport, f"CREATE SUBSCRIPTION s CONNECTION 'host=127.0.0.1 port={pport} user=postgres "
                       f"dbname=postgres' PUBLICATION p WITH (create_slot = false, slot_name = 'sub_slot', "
                       f"copy_data = false, enabled = false);")
        s = Session(pg, sport)
        assert s.one("SELECT count(*) FROM acct") == "0"
        t0 = time.perf_counter()
        s.one("ALTER SUBSCRIPTION s ENABLE; SELECT 1")
        t1 = wait_for("logical catch-up", lambda: int(s.one("SELECT coalesce(max(k), 0) FROM acct")) >= n, timeout)
        got = int(s.one("SELECT count(*) FROM acct"))
        if got != n:
            raise RuntimeError(f"PostgreSQL logical: the subscriber holds {got:,} rows, not {n:,}")
        return t1 - t0
    finally:
        if s:
            s.close()
        pg.stop(sub, "immediate")
        pg.stop(pub, "immediate")
        subprocess.run(["rm", "-rf", str(run)], check=False)


def pg_physical(pg: PG, n: int, work: Path, timeout: float) -> float:
    run = pg_copy(pg, n, work, ("pub", "standby"))
    pub, standby = run / "pub", run / "standby"
    pport, sport = free_port(), free_port()
    s = None
    try:
        pg.start(pub, pport)
        pg.start(standby, sport)  # hot standby, consistent at the base backup, no primary to stream from
        target = pg.psql(pport, "SELECT pg_current_wal_lsn();")
        s = Session(pg, sport)
        assert s.one("SELECT pg_is_in_recovery()") == "t"
        assert s.one("SELECT count(*) FROM acct") == "0"
        pid = int((standby / "postmaster.pid").read_text().split()[0])
        t0 = time.perf_counter()
        with open(standby / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={pport} user=postgres'\n")
        os.kill(pid, signal.SIGHUP)
        t1 = wait_for("physical catch-up", lambda: s.one(
            f"SELECT coalesce(pg_last_wal_replay_lsn() >= '{target}'::pg_lsn, false)") == "t", timeout)
        got = int(s.one("SELECT count(*) FROM acct"))
        if got != n:
            raise RuntimeError(f"PostgreSQL physical: the standby holds {got:,} rows, not {n:,}")
        return t1 - t0
    finally:
        if s:
            s.close()
        pg.stop(standby, "immediate")
        pg.stop(pub, "immediate")
        subprocess.run(["rm", "-rf", str(run)], check=False)


# -- report -----------------------------------------------------------------------------------------------
def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="transactions behind (default 1,000,000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per tree and per baseline (default 3)")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH/src",
                    help="a code tree to measure (repeatable); default: the code this script imports")
    ap.add_argument("--secondary-durability", default="fsync", choices=("fsync", "group", "none"),
                    help="B's durability (default fsync, `multisite instance create`'s default)")
    ap.add_argument("--postgres", action=argparse.BooleanOptionalAction, default=None,
                    help="measure PostgreSQL too (default: when its server binary is found)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one catch-up may take")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE ('-': stdout)")
    a = ap.parse_args()

    if a.tree:
        trees = []
        for spec in a.tree:
            label, sep, path = spec.partition("=")
            if not sep or not label or not path:
                ap.error(f"--tree takes LABEL=PATH/src, got {spec!r}")
            trees.append(Tree(label, Path(path).absolute()))
    else:
        import multisite
        trees = [Tree("this", Path(multisite.__file__).resolve().parent.parent)]
    for t in trees:
        check_tree(t)
    bindir = pg_bindir()
    use_pg = a.postgres if a.postgres is not None else bindir is not None
    if use_pg and bindir is None:
        ap.error("--postgres: no PostgreSQL server binary (postgres, pg_ctl) found")
    pg = PG(bindir) if use_pg else None

    OUT.mkdir(exist_ok=True)
    work = OUT / f"catchup-{os.getpid()}"
    work.mkdir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    load0 = os.getloadavg()[0]
    ms: dict[str, list[MsRun]] = {t.label: [] for t in trees}
    pgr: dict[str, list[float]] = {"logical": [], "physical": []}
    pg_info = None
    try:
        primary, target = build_primary(a.n)
        if pg:
            pg.mkdir(work)
            pg_info = build_pg(pg, a.n)
        for r in range(a.runs):
            for t in (trees if r % 2 == 0 else trees[::-1]):
                with console.status(f"run {r + 1}/{a.runs}: {t.label} ..."):
                    res = multisite_run(t, primary, target, work, a.secondary_durability, a.timeout,
                                        LOGS / f"{stamp}-{t.label}-run{r + 1}")
                ms[t.label].append(res)
                note(f"run {r + 1}/{a.runs} {t.label}: {res.seconds:.2f} s = {a.n / res.seconds:,.0f} tx/s "
                     f"(source start returned at {res.cli_s:.2f} s, first transaction on B at {res.first_s:.2f} s; "
                     f"load average {os.getloadavg()[0]:.1f})")
            if pg:
                for kind, fn in (("logical", pg_logical), ("physical", pg_physical)):
                    with console.status(f"run {r + 1}/{a.runs}: PostgreSQL {kind} ..."):
                        sec = fn(pg, a.n, work, a.timeout)
                    pgr[kind].append(sec)
                    note(f"run {r + 1}/{a.runs} PostgreSQL {kind}: {sec:.2f} s = {a.n / sec:,.0f} "
                         f"{'tx' if kind == 'logical' else 'rows'}/s (load average {os.getloadavg()[0]:.1f})")
    finally:
        if pg:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        else:
            shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]

    med = {lb: statistics.median(r.seconds for r in rs) for lb, rs in ms.items()}
    first = a.n / med[trees[0].label]
    pg_med = {k: statistics.median(v) for k, v in pgr.items() if v}
    tab = Table(title=f"catch-up of a secondary {a.n:,} single-update transactions behind "
                      f"(B durability {a.secondary_durability}; medians of {a.runs} runs)")
    for col, just in (("what", "left"), ("runs", "right"), ("seconds", "right"), ("runs (s)", "right"),
                      ("rate", "right"), (f"vs {trees[0].label}", "right"), ("vs PG logical", "right")):
        tab.add_column(col, justify=just)
    rows = []
    for t in trees:
        rate = a.n / med[t.label]
        vs_pg = f"{rate / (a.n / pg_med['logical']):.2f}x" if "logical" in pg_med else "-"
        secs = [r.seconds for r in ms[t.label]]
        tab.add_row(f"multisite {t.label}", str(len(secs)), f"{med[t.label]:.2f}", spread(secs), f"{rate:,.0f} tx/s",
                    f"{rate / first:.2f}x", vs_pg)
        rows.append({"what": f"multisite {t.label}", "src": str(t.src), "seconds": med[t.label], "rate": rate,
                     "unit": "tx/s", "runs": secs, "source_start_returned_s": [r.cli_s for r in ms[t.label]],
                     "first_applied_s": [r.first_s for r in ms[t.label]]})
    for kind, unit in (("logical", "tx/s"), ("physical", "rows/s")):
        if kind in pg_med:
            rate = a.n / pg_med[kind]
            vs_pg = f"{rate / (a.n / pg_med['logical']):.2f}x"
            tab.add_row(f"PostgreSQL {kind}", str(len(pgr[kind])), f"{pg_med[kind]:.2f}", spread(pgr[kind]),
                        f"{rate:,.0f} {unit}", f"{rate / first:.2f}x", vs_pg)
            rows.append({"what": f"PostgreSQL {kind}", "seconds": pg_med[kind], "rate": rate, "unit": unit,
                         "runs": pgr[kind]})
    console.print(tab)
    for t in trees:
        last = ms[t.label][-1]
        console.print(f"[bold]{t.label}[/bold], last run's component logs (all of them: {LOGS}/{stamp}-{t.label}-run{a.runs}):")
        for ln in last.stats:
            console.print("  " + ln, highlight=False, markup=False)
    if a.json:
        doc = {"benchmark": "catchup", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "n": a.n, "runs": a.runs,
               "secondary_durability": a.secondary_durability,
               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
               "load_average": [load0, load1], "postgres": pg.version if pg else None,
               "postgres_load_s": pg_info["load_s"] if pg_info else None, "results": rows,
               "logs_last_run": {t.label: ms[t.label][-1].stats for t in trees}}
        text = json.dumps(doc, indent=2)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text + "\n")
            console.print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
