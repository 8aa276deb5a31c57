"""The grid's figures (issue 11), with a catalog and containers as real processes on 127.0.0.1.

    PYTHONPATH=src .venv/bin/python bench/grid.py                       # every figure, writes RESULTS.md
    PYTHONPATH=src .venv/bin/python bench/grid.py --figure commit --quick   # one figure, short, prints only

Every grid is started as the integration tests start it (``grid.server.process.start_catalog`` /
``start_container``, a ``grid.toml`` with ``[maps.m]``), under bench/out/grid-PID/ (the repository's
disk), and stopped at the end of its step. The load comes from **worker processes** (this script
re-run as ``--worker``), each with ``--threads`` threads sharing one ``multisite.grid.connect``
client (a thread has its own connections): every thread commits single-update transactions
``g.put("m", (key,), {"n": i})`` on keys spread over every partition. Workers warm up, then count
the commits that return inside a common window; the parent reads utime + stime of every process
(catalog, containers, workers, itself) from ``/proc/PID/stat`` at both ends of the window, so the
tables say where the 2 cores went.

Figures (``--figure``, repeatable; default all):

- ``commit``: one synchronous replica (min_sync = max_sync = 1, max_async = 0, 2 containers) against
  none (all 0, 1 container), same partitions; several concurrency levels (workers x threads). Both
  grids are up at once and each level's windows alternate between them over ``--rounds`` (the
  machine is shared: the other load falls on both alike); the figure is the ratio at each one's
  plateau (its best level). Target >= 0.8.
- ``failover``: min_sync = 1, max_sync = 1, max_async = 1 on 3 containers (after the loss the async
  replica takes sync over, so the new primary has a current sync replica to vote); one writer thread
  commits to the partitions whose primary is on the victim; the victim is SIGKILLed; the figure is
  kill -> the first commit accepted after it, split from the catalog's and containers' logs
  (detection: ``container X lost``; promotion: ``promote partition``; the container taking the
  primary role; a sync replica current again) and the client's own retries. ``--heartbeat-timeout``.
- ``scaling``: 8 partitions, no replicas, on 2 containers against 1, alternated as ``commit``; the
  grid of 2 has ``initial_containers = 2`` (the first placement waits for both: a grid without
  replicas never moves a primary to a container that joins later). Target >= 1.6x.
- ``checkpoint``: a partition of ``--keys`` keys filled with many-key transactions
  (``g.transaction``), then a second container joins and the catalog places an async replica on it
  while writers keep updating; time until the replica's seqno reaches the primary's (``grid status``)
  and the primary container's VmRSS growth against the entries modified during the copy, at several
  writer rates (one filled grid; each copy to a new container, the previous one stopped). A fill of
  few big transactions alone gets a catch-up, not a copy (``shipping.start_point``): ``--copy-trigger``
  adds 201,000 single updates (default) or prunes the journal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
TICKS = os.sysconf("SC_CLK_TCK")
MAP = "m"
KEEP = False  # --keep: leave each grid's directories (logs) under bench/out/grid-PID/

console = Console()
if not console.is_terminal:
    console = Console(width=200)


def note(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}", highlight=False)


# -- /proc ------------------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), seconds; NaN once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    return mem_kb(pid).get(field, 0)


def mem_kb(pid: int) -> dict[str, int]:
    """VmRSS and its parts (RssAnon, RssFile, RssShmem) of ``pid``, KiB."""
    out = {}
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                k, v = ln.split(":", 1)
                out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (/proc/stat: everything but idle and iowait)."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = list(map(int, f))
    return (sum(v[:8]) - v[3] - v[4]) / TICKS


def log_times(path: Path, pattern: str) -> list[tuple[float, str]]:
    """(wall time, line) of each line of a process log matching ``pattern`` (LOG_FORMAT: asctime first)."""
    out = []
    if not path.exists():
        return out
    rx = re.compile(pattern)
    for ln in path.read_text(errors="replace").splitlines():
        if rx.search(ln):
            try:
                t = datetime.strptime(ln[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            out.append((t, ln))
    return out


# -- a grid of real processes -------------------------------------------------------------------------
class GridUp:
    """A catalog and its containers, started here and stopped by ``close`` (SIGKILL as the last resort)."""

    def __init__(self, work: Path, label: str, *, partitions: int, min_sync: int, max_sync: int, max_async: int,
                 heartbeat_timeout_s: float = 1.0, initial_containers: int = 1, etcd: str | None = None,
                 catalogs: int = 1, pki: dict | None = None) -> None:
        """``etcd``: the catalogs (``catalogs`` of them, k1..kN) and containers coordinate through it
        (issue 24); ``pki``: every grid wire is TLS, each process with a member certificate, the load too."""
        from multisite.grid.server.process import start_catalog
        self.etcd, self.pki = etcd, pki
        self.root = work / f"{label}-{time.monotonic_ns()}"
        self.root.mkdir(parents=True)
        self.name = "bench"
        self.policy = {"partitions": partitions, "min_sync": min_sync, "max_sync": max_sync, "max_async": max_async}
        self.toml = self.root / "grid.toml"
        self.toml.write_text(f'name = "{self.name}"\npartitions = {partitions}\nmin_sync = {min_sync}\n'
                             f'max_sync = {max_sync}\nmax_async = {max_async}\n'
                             f'initial_containers = {initial_containers}\n[maps.{MAP}]\n')
        self.catalogs = [f"k{i + 1}" for i in range(catalogs)] if etcd else ["catalog"]
        self.pids: dict[str, int] = {}
        addresses = []
        for k in self.catalogs:
            info = start_catalog(self.root / k, self.toml, "127.0.0.1:0", heartbeat_timeout_s, etcd=etcd,
                                 name=k if etcd else None, tls=self._tls(k))
            addresses.append(info["listen"])
            self.pids[k] = info["pid"]
        self.address = ",".join(addresses)
        self.containers: list[str] = []
        t = self._tls("bench-load")
        self.auth = {"tls_ca": t.ca, "tls_cert": t.cert, "tls_key": t.key} if t else {}

    def _tls(self, name: str):
        if not self.pki:
            return None
        from multisite.net.tls import TLSConfig
        from multisite.testing.certs import make_grid_cert
        c = make_grid_cert(self.pki, name, self.name)
        return TLSConfig(str(c["cert"]), str(c["key"]), str(c["ca"]))

    def add(self, name: str, listen: str = "127.0.0.1:0") -> int:
        from multisite.grid.server.process import start_container
        st = start_container(self.root / name, None if self.etcd else self.address, listen, name=name,
                             etcd=self.etcd, grid=self.name if self.etcd else None, tls=self._tls(name))
        if not st.get("registered"):
            raise RuntimeError(f"container {name} did not register")
        self.pids[name] = st["pid"]
        self.containers.append(name)
        return st["pid"]

    def status(self) -> dict:
        from multisite.grid.server.process import catalog_status
        from multisite.server.client import client_tls_context
        tls = client_tls_context(self.auth["tls_ca"], self.auth["tls_cert"], self.auth["tls_key"],
                                 check_hostname=False) if self.auth else None
        return catalog_status(self.address, tls=tls)

    def settled(self, timeout_s: float = 60.0, full: bool = True) -> dict:
        """The status once every container applied the placement, every sync replica is current, every
        shard reported a seqno equal to its primary's, and (``full``) nothing is under-replicated."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            up = [c for c in st["containers"] if c["up"]]
            ok = all(c["applied_version"] == st["version"] for c in up) and \
                all(set(p["sync"]) == set(p["current"]) for p in st["partitions"]) and \
                all(p["primary"] is not None for p in st["partitions"]) and \
                (not full or not st["under_replicated"])
            if ok:
                return st
            if time.monotonic() > deadline:
                raise RuntimeError(f"grid not settled after {timeout_s:.0f} s: {json.dumps(st)[:2000]}")
            time.sleep(0.1)

    def log(self, who: str) -> Path:
        return self.root / who / "log" / f"{'catalog' if who in self.catalogs else 'container'}.log"

    def kill(self, name: str) -> float:
        os.kill(self.pids[name], signal.SIGKILL)
        t = time.time()
        return t

    def close(self) -> None:
        from multisite.errors import ServerError
        from multisite.grid.server.process import stop_process
        for name in [*self.containers, *self.catalogs]:
            d = self.root / name
            what = "catalog" if name in self.catalogs else "container"
            if (d / "run" / f"{what}.json").exists():
                try:
                    stop_process(d, what, timeout=10)
                except (ServerError, OSError):
                    pass
            pid = self.pids.get(name)
            if pid and Path(f"/proc/{pid}").exists():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self) -> None:
        logs = OUT / "grid-logs" / self.root.name  # the processes' logs outlive the grid
        for f in self.root.glob("*/log/*"):
            (logs / f.parent.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, logs / f.parent.parent.name / f.name)
        if not KEEP:
            shutil.rmtree(self.root, ignore_errors=True)


# -- load: worker processes ---------------------------------------------------------------------------
def worker_main(spec: dict) -> None:
    """A worker process: ``threads`` threads committing single-update transactions until ``end``;
    prints one JSON line: the commits returned inside [start, end], errors by kind."""
    import multisite.grid as mg
    g = mg.connect(spec["catalog"], **spec.get("auth", {}))
    start, end = spec["start"], spec["end"]
    counts = [0] * spec["threads"]
    errors: dict[str, int] = {}
    lock = threading.Lock()
    keys = spec.get("keys", 1 << 30)

    def run(t: int) -> None:
        rnd = random.Random(spec["seed"] * 1000 + t)
        i = 0
        while True:
            now = time.time()
            if now >= end:
                return
            k = rnd.randrange(keys)
            try:
                g.put(MAP, (k,), {"n": i})
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                time.sleep(0.01)
                continue
            i += 1
            done = time.time()
            if start <= done <= end:
                counts[t] += 1

    ths = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(spec["threads"])]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    g.close()
    print(json.dumps({"commits": sum(counts), "errors": errors}), flush=True)


def spawn_worker(spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ})


@dataclass
class Load:
    workers: int
    threads: int
    seconds: float
    commits: int = 0
    errors: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)  # process -> cores used in the window

    @property
    def rate(self) -> float:
        return self.commits / self.seconds

    @property
    def label(self) -> str:
        return f"{self.workers}x{self.threads}"


def drive(grid: GridUp, workers: int, threads: int, seconds: float, warmup: float = 1.5,
          keys: int = 1 << 30, extra_pids: dict[str, int] | None = None) -> Load:
    """Run ``workers`` x ``threads`` single-update committers against ``grid``; count a window of
    ``seconds`` after ``warmup``; CPU of every process over the window."""
    t_start = time.time() + warmup + 0.5  # process start-up (imports) before the warm-up
    t_end = t_start + seconds
    procs = [spawn_worker({"catalog": grid.address, "threads": threads, "start": t_start, "end": t_end,
                           "seed": w + 1, "keys": keys, "auth": grid.auth}) for w in range(workers)]
    pids = {**grid.pids, **(extra_pids or {}), **{f"worker{w}": p.pid for w, p in enumerate(procs)},
            "bench (this)": os.getpid()}
    time.sleep(max(0.0, t_start - time.time()))
    c0 = {n: cpu_s(p) for n, p in pids.items()}
    b0 = machine_busy_s()
    w0 = time.time()
    time.sleep(max(0.0, t_end - time.time()))
    c1 = {n: cpu_s(p) for n, p in pids.items()}
    b1 = machine_busy_s()
    dt = time.time() - w0
    load = Load(workers, threads, seconds)
    for p in procs:
        out, _ = p.communicate(timeout=120)
        if p.returncode != 0 or not out.strip():
            dead = [n for n, pid in grid.pids.items() if not Path(f"/proc/{pid}").exists()]
            raise RuntimeError(f"a worker failed (status {p.returncode}); grid processes gone: {dead or 'none'} "
                               f"(their logs: {OUT / 'grid-logs' / grid.root.name})")
        r = json.loads(out.strip().splitlines()[-1])
        load.commits += r["commits"]
        for k, v in r["errors"].items():
            load.errors[k] = load.errors.get(k, 0) + v
    load.cpu = {n: round((c1[n] - c0[n]) / dt, 2) for n in pids}
    load.cpu["other processes"] = round((b1 - b0) / dt - sum(load.cpu.values()), 2)
    return load


def cpu_text(cpu: dict) -> str:
    workers = sum(v for n, v in cpu.items() if n.startswith("worker"))
    parts = [f"{n} {v:.2f}" for n, v in cpu.items()
             if not n.startswith("worker") and n not in ("bench (this)", "other processes")]
    mine = sum(v for n, v in cpu.items() if n != "other processes")
    return ", ".join(parts + [f"workers {workers:.2f}"]) + f" (this bench {mine:.2f}; other processes " \
        f"{cpu.get('other processes', 0):.2f}; load {os.getloadavg()[0]:.1f})"


# -- figure 1: commit rate with one synchronous replica ------------------------------------------------
def compare(work: Path, a, configs: dict[str, dict], levels: list[tuple[int, int]], what: str) -> dict:
    """Every configuration's grid up at once (an idle grid costs only heartbeats); then, per round and
    per level, one window on each grid in turn, the order reversed every other round, so that the
    rest of the machine's load falls on all of them alike. Rates are commits / seconds over all rounds."""
    grids = {}
    res: dict[str, dict[str, list[Load]]] = {c: {f"{w}x{t}": [] for w, t in levels} for c in configs}
    try:
        for cname, c in configs.items():
            g = GridUp(work, f"{what}-{cname}", partitions=c["partitions"], min_sync=c["min_sync"],
                       max_sync=c["max_sync"], max_async=c["max_async"], initial_containers=c["containers"],
                       etcd=ETCD.endpoints if c.get("etcd") else None, catalogs=c.get("catalogs", 1),
                       pki=PKI if c.get("tls") else None)
            grids[cname] = g
            for i in range(c["containers"]):
                g.add(f"c{i + 1}")
        for cname, g in grids.items():
            st = g.settled()
            note(f"{what} {cname}: {configs[cname]['partitions']} partitions, primaries "
                 f"{ {c['name']: c['primaries'] for c in st['containers']} }")
        for r in range(a.rounds):
            for w, t in levels:
                order = list(configs) if r % 2 == 0 else list(configs)[::-1]
                for cname in order:
                    ld = drive(grids[cname], w, t, a.seconds, warmup=a.warmup)
                    res[cname][ld.label].append(ld)
                    note(f"  round {r + 1}/{a.rounds} {what} {cname} {ld.label}: {ld.rate:,.0f} tx/s, errors "
                         f"{ld.errors or 0}; cores: {cpu_text(ld.cpu)}")
        for cname, g in grids.items():
            if configs[cname]["max_sync"]:  # every acknowledged commit is on the sync replicas too
                st = g.settled(30)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    lag = [(p["partition"], p["seqnos"]) for p in st["partitions"]
                           if len(set(p["seqnos"].values())) > 1]
                    if not lag:
                        break
                    time.sleep(0.3)
                    st = g.status()
                if lag:
                    note(f"  [yellow]{cname}: replica seqnos differ 5 s after the load: {lag}[/yellow]")
    finally:
        for g in grids.values():
            g.close()
            g.remove()
    out = {"seconds": a.seconds, "rounds": a.rounds, "levels": {}, "configs": configs}
    best = {}
    for cname in configs:
        for lvl, lds in res[cname].items():
            n, s = sum(x.commits for x in lds), sum(x.seconds for x in lds)
            cpu = {k: round(statistics.mean(x.cpu[k] for x in lds), 2) for k in lds[0].cpu}
            out["levels"].setdefault(lvl, {})[cname] = {"rate": n / s, "runs": [x.rate for x in lds], "cpu": cpu,
                                                        "errors": [x.errors for x in lds]}
            if cname not in best or n / s > best[cname][1]:
                best[cname] = (lvl, n / s)
    out["best"] = {c: {"level": lv, "rate": rt} for c, (lv, rt) in best.items()}
    return out


def commit_figure(work: Path, a) -> dict:
    levels = [tuple(map(int, s.split("x"))) for s in a.levels.split(",")]
    configs = {"sync1": {"partitions": a.partitions, "min_sync": 1, "max_sync": 1, "max_async": 0, "containers": 2},
               "none": {"partitions": a.partitions, "min_sync": 0, "max_sync": 0, "max_async": 0, "containers": 1}}
    out = compare(work, a, configs, levels, "commit")
    out["partitions"] = a.partitions
    out["ratio_at_plateau"] = out["best"]["sync1"]["rate"] / out["best"]["none"]["rate"]
    out["ratio_by_level"] = {lvl: v["sync1"]["rate"] / v["none"]["rate"] for lvl, v in out["levels"].items()}
    return out


# -- figure 2: failover ---------------------------------------------------------------------------------
def failover_once(work: Path, hb: float, run: int) -> dict:
    """One SIGKILL of the container with the most primaries, under one writer per lost partition (each
    its own client, committing single updates to one key of its partition in a loop)."""
    import multisite.grid as mg
    from multisite.errors import (
        CommitOutcomeUnknown,
        GridUnavailable,
        ReplicationVotedToRollback,
    )
    g = GridUp(work, f"failover-{hb:g}-{run}", partitions=4, min_sync=1, max_sync=1, max_async=1,
               heartbeat_timeout_s=hb)
    try:
        for n in ("c1", "c2", "c3"):
            g.add(n)
        st = g.settled()
        victim = max(st["containers"], key=lambda c: (c["primaries"], c["name"]))["name"]
        parts = [p["partition"] for p in st["partitions"] if p["primary"] == victim]
        probe = mg.connect(g.address)
        keys: dict[int, int] = {}
        k = 0
        while len(keys) < len(parts):  # one key per lost partition
            p = probe.partition_of((k,))
            if p in parts and p not in keys:
                keys[p] = k
            k += 1
        probe.close()
        # (wall time it returned, kind, detail, wall time it was sent)
        events: dict[int, list[tuple[float, str, str, float]]] = {p: [] for p in parts}
        stop = threading.Event()

        def writer(p: int) -> None:
            client = mg.connect(g.address, timeout_s=FAILOVER_CLIENT_TIMEOUT_S)
            i = 0
            while not stop.is_set():
                t0 = time.time()
                try:
                    client.put(MAP, (keys[p],), {"n": i})
                    events[p].append((time.time(), "ok", "", t0))
                except (CommitOutcomeUnknown, GridUnavailable, ReplicationVotedToRollback) as e:
                    events[p].append((time.time(), type(e).__name__, str(e)[:300], t0))
                i += 1
            client.close()

        ths = [threading.Thread(target=writer, args=(p,), daemon=True) for p in parts]
        for th in ths:
            th.start()
        time.sleep(1.5)
        t_kill = g.kill(victim)
        deadline = time.time() + FAILOVER_CLIENT_TIMEOUT_S + 5
        while time.time() < deadline:
            if all(any(t0 > t_kill and kind == "ok" for _, kind, _, t0 in ev[-20:]) for ev in events.values()):
                break
            time.sleep(0.02)
        time.sleep(0.5)
        stop.set()
        for th in ths:
            th.join(FAILOVER_CLIENT_TIMEOUT_S + 5)
        per_part = {}
        msgs = []
        for p, ev in events.items():
            # the first commit sent after the kill and accepted: the dead primary cannot have taken it
            first_ok = next((t for t, kind, _, t0 in ev if t0 > t_kill and kind == "ok"), None)
            errs: dict[str, int] = {}
            for t, kind, d, _ in ev:
                if t > t_kill and kind != "ok" and (first_ok is None or t <= first_ok):
                    errs[kind] = errs.get(kind, 0) + 1
                    if len(msgs) < 6 and (kind != "ReplicationVotedToRollback" or errs[kind] == 1):
                        msgs.append(f"p{p} +{t - t_kill:.3f} s {kind}: {d}")
            per_part[p] = {"first_ok_s": None if first_ok is None else first_ok - t_kill, "errors": errs,
                           "commits_before_kill": sum(1 for t, kind, _, _ in ev if kind == "ok" and t <= t_kill)}
        cat = g.log("catalog")
        lost = [t for t, _ in log_times(cat, rf"container {victim} lost") if t > t_kill - 1]
        promote = [t for t, _ in log_times(cat, r"promote partition") if lost and t >= lost[0]]
        assigned = [t for t, _ in log_times(cat, r"assignments to ") if lost and t >= lost[0]]
        st2 = g.status()
        new_primaries = {st2["partitions"][p]["primary"] for p in parts}
        took, current = [], []
        for c in new_primaries:
            if c is None:
                continue
            took += [t for t, _ in log_times(g.log(c), r"shard p\d+ is primary at epoch") if t > t_kill]
            current += [t for t, _ in log_times(g.log(c), r"synchronous replica .* is current") if t > t_kill]
        firsts = [v["first_ok_s"] for v in per_part.values()]
        return {"heartbeat_timeout_s": hb, "victim": victim, "lost_partitions": parts,
                "first_ok_s": min((f for f in firsts if f is not None), default=None),
                "all_ok_s": None if None in firsts else max(firsts),
                "stuck_partitions": [p for p, v in per_part.items() if v["first_ok_s"] is None],
                "detected_s": lost[0] - t_kill if lost else None,
                "promoted_s": promote[0] - t_kill if promote else None,
                "assignments_sent_s": assigned[0] - t_kill if assigned else None,
                "primary_taken_s": min(took) - t_kill if took else None,
                "sync_current_s": min(current) - t_kill if current else None,
                "per_partition": per_part, "client_error_messages": msgs}
    finally:
        g.close()
        g.remove()


FAILOVER_KEYS = ("first_ok_s", "all_ok_s", "detected_s", "promoted_s", "assignments_sent_s", "primary_taken_s",
                 "sync_current_s")
FAILOVER_CLIENT_TIMEOUT_S = 10.0


def failover_series(work: Path, a, hb: float, label: str) -> dict:
    runs = []
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for r in range(a.failover_runs):
        res = failover_once(work, hb, r)
        runs.append(res)
        note(f"failover ({label}) hb {hb:g} s run {r + 1}: first commit {fmt(res['first_ok_s'])} s, every lost "
             f"partition {fmt(res['all_ok_s'])} s (lost detected {fmt(res['detected_s'])}, promoted "
             f"{fmt(res['promoted_s'])}, primary taken {fmt(res['primary_taken_s'])}, sync current "
             f"{fmt(res['sync_current_s'])}); stuck {res['stuck_partitions'] or 'none'}; errors "
             f"{ {p: v['errors'] for p, v in res['per_partition'].items()} }")
    med = {}
    for k in FAILOVER_KEYS:
        vals = [r[k] for r in runs if r[k] is not None]
        med[k] = statistics.median(vals) if vals else None
    return {"runs": runs, "median": med, "runs_with_stuck_partition": sum(1 for r in runs if r["stuck_partitions"])}


def failover_figure(work: Path, a) -> dict:
    out = {"client": {}}
    for hb in a.heartbeat_timeouts:
        out["client"][str(hb)] = failover_series(work, a, hb, "client")
    return out


# -- figure 3: scaling --------------------------------------------------------------------------------
def scaling_figure(work: Path, a) -> dict:
    levels = [tuple(map(int, s.split("x"))) for s in a.scaling_levels.split(",")]
    # initial_containers = 2: the first placement waits for both (a grid without replicas never moves a
    # primary to a container that joins later), so they split the 8 partitions
    configs = {"2": {"partitions": 8, "min_sync": 0, "max_sync": 0, "max_async": 0, "containers": 2},
               "1": {"partitions": 8, "min_sync": 0, "max_sync": 0, "max_async": 0, "containers": 1}}
    out = compare(work, a, configs, levels, "scaling")
    out["ratio_at_plateau"] = out["best"]["2"]["rate"] / out["best"]["1"]["rate"]
    out["ratio_by_level"] = {lvl: v["2"]["rate"] / v["1"]["rate"] for lvl, v in out["levels"].items()}
    return out


# -- issue 24: no single point of failure, TLS on every wire -----------------------------------------
ETCD = None  # the etcd figures' testing.etcd.EtcdCluster (3 members on loopback, started once)
PKI: dict | None = None  # the TLS figure's testing.certs.make_test_pki
OBSERVE_S = 3.0  # after a catalog's kill: how long the writers' acknowledgements are watched


def etcd_up(work: Path):
    global ETCD
    if ETCD is None:
        from multisite.testing.etcd import EtcdCluster
        ETCD = EtcdCluster(work / "etcd").start()
    return ETCD


class PartitionWriters:
    """One writer thread per partition, each with its own client, committing single updates to one key of
    its partition in a loop; ``events[p]``: (wall time sent, wall time answered, accepted)."""

    def __init__(self, g: GridUp, parts: list[int]) -> None:
        import multisite.grid as mg
        self.g, self.parts = g, parts
        probe = mg.connect(g.address, **g.auth)
        self.keys: dict[int, int] = {}
        k = 0
        while len(self.keys) < len(parts):
            p = probe.partition_of((k,))
            if p in parts and p not in self.keys:
                self.keys[p] = k
            k += 1
        probe.close()
        self.events: dict[int, list[tuple[float, float, bool]]] = {p: [] for p in parts}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(p,), daemon=True) for p in parts]

    def _run(self, p: int) -> None:
        import multisite.grid as mg
        from multisite.errors import MultisiteError
        client = mg.connect(self.g.address, timeout_s=FAILOVER_CLIENT_TIMEOUT_S, **self.g.auth)
        i = 0
        while not self.stopping.is_set():
            t0 = time.time()
            try:
                client.put(MAP, (self.keys[p],), {"n": i})
                self.events[p].append((t0, time.time(), True))
            except MultisiteError:
                self.events[p].append((t0, time.time(), False))
            i += 1
        client.close()

    def start(self) -> "PartitionWriters":
        for th in self.threads:
            th.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for th in self.threads:
            th.join(FAILOVER_CLIENT_TIMEOUT_S + 5)

    def next_ok(self, t: float, sent_after: bool = False) -> dict[int, float | None]:
        """Per partition: seconds from ``t`` to its next accepted commit (``sent_after``: of one sent after ``t``)."""
        return {p: next((b - t for s, b, ok in ev if ok and b > t and (not sent_after or s > t)), None)
                for p, ev in self.events.items()}

    def longest_gap(self, t0: float, t1: float) -> dict[int, float]:
        """Per partition: the longest time in [t0, t1] without an accepted commit."""
        out = {}
        for p, ev in self.events.items():
            ts = [b for _, b, ok in ev if ok and t0 <= b <= t1]
            out[p] = round(max(b - a for a, b in zip([t0, *ts], [*ts, t1])), 3)
        return out

    def accepted(self, t0: float, t1: float) -> int:
        return sum(1 for ev in self.events.values() for _, b, ok in ev if ok and t0 <= b <= t1)


def catalog_kill_once(work: Path, run: int, etcd: bool) -> dict:
    """Under one writer per partition, SIGKILL the leading catalog (with etcd, of 2) or the single one."""
    g = GridUp(work, f"catkill-{'etcd' if etcd else 'single'}-{run}", partitions=4, min_sync=1, max_sync=1,
               max_async=1, etcd=etcd_up(work).endpoints if etcd else None, catalogs=2 if etcd else 1)
    try:
        for n in ("c1", "c2", "c3"):
            g.add(n)
        st = g.settled()
        w = PartitionWriters(g, list(range(4))).start()
        time.sleep(1.5)
        victim = st["coordination"]["leader"] if etcd else "catalog"
        t_kill = g.kill(victim)
        time.sleep(OBSERVE_S)
        w.stop()
        nxt = w.next_ok(t_kill)
        out = {"etcd": etcd, "victim": victim, "next_commit_s": nxt,
               "every_partition_s": None if None in nxt.values() else round(max(nxt.values()), 3),
               "longest_gap_after_s": w.longest_gap(t_kill, t_kill + OBSERVE_S),
               "longest_gap_before_s": w.longest_gap(t_kill - 1.0, t_kill),
               "accepted_after": w.accepted(t_kill, t_kill + OBSERVE_S),
               "accepted_1s_before": w.accepted(t_kill - 1.0, t_kill)}
        if etcd:
            other = next(k for k in g.catalogs if k != victim)
            led = [t for t, _ in log_times(g.log(other), r"leads grid") if t > t_kill]
            out["new_leader_s"] = round(led[0] - t_kill, 3) if led else None
        return out
    finally:
        g.close()
        g.remove()


def catalog_kill_figure(work: Path, a) -> dict:
    runs = {"etcd": [], "single": []}
    for r in range(a.failover_runs):
        for kind in ("etcd", "single") if r == 0 else ("etcd",):  # the single catalog once: nothing to average
            res = catalog_kill_once(work, r, kind == "etcd")
            runs[kind].append(res)
            note(f"catalog kill ({kind}) run {r + 1}: next commit per partition {res['next_commit_s']}, longest gap "
                 f"after {res['longest_gap_after_s']}, commits in the {OBSERVE_S:g} s after: {res['accepted_after']} "
                 f"(in the second before: {res['accepted_1s_before']}), new leader "
                 f"{res.get('new_leader_s', '-')} s")
    every = [r["every_partition_s"] for r in runs["etcd"]]
    gaps = [max(r["longest_gap_after_s"].values()) for r in runs["etcd"]]
    return {"runs": runs, "max_next_commit_s": None if None in every else max(every),
            "median_next_commit_s": None if None in every else statistics.median(every),
            "max_gap_after_s": max(gaps), "observe_s": OBSERVE_S}


def etcd_rate_figure(work: Path, a) -> dict:
    etcd_up(work)
    levels = [tuple(map(int, s.split("x"))) for s in a.levels.split(",")]
    base = {"partitions": a.partitions, "min_sync": 1, "max_sync": 1, "max_async": 0, "containers": 2}
    configs = {"etcd": {**base, "etcd": True, "catalogs": 2}, "single": dict(base)}
    out = compare(work, a, configs, levels, "etcdrate")
    out["ratio_at_plateau"] = out["best"]["etcd"]["rate"] / out["best"]["single"]["rate"]
    out["ratio_by_level"] = {lvl: v["etcd"]["rate"] / v["single"]["rate"] for lvl, v in out["levels"].items()}
    return out


def tls_rate_figure(work: Path, a) -> dict:
    global PKI
    from multisite.testing.certs import make_test_pki
    PKI = PKI or {k: str(v) for k, v in make_test_pki(work / "pki").items()}
    levels = [tuple(map(int, s.split("x"))) for s in a.levels.split(",")]
    base = {"partitions": a.partitions, "min_sync": 1, "max_sync": 1, "max_async": 0, "containers": 2}
    configs = {"tls": {**base, "tls": True}, "plain": dict(base)}
    out = compare(work, a, configs, levels, "tlsrate")
    out["ratio_at_plateau"] = out["best"]["tls"]["rate"] / out["best"]["plain"]["rate"]
    out["ratio_by_level"] = {lvl: v["tls"]["rate"] / v["plain"]["rate"] for lvl, v in out["levels"].items()}
    return out


def etcd_failover_once(work: Path, run: int) -> dict:
    """SIGKILL of the container with the most primaries on a grid coordinated through etcd (2 catalogs),
    under one writer per lost partition; the split from the leading catalog's and the containers' logs."""
    g = GridUp(work, f"etcdfailover-{run}", partitions=4, min_sync=1, max_sync=1, max_async=1,
               etcd=etcd_up(work).endpoints, catalogs=2)
    try:
        for n in ("c1", "c2", "c3"):
            g.add(n)
        st = g.settled()
        victim = max(st["containers"], key=lambda c: (c["primaries"], c["name"]))["name"]
        parts = [p["partition"] for p in st["partitions"] if p["primary"] == victim]
        w = PartitionWriters(g, parts).start()
        time.sleep(1.5)
        t_kill = g.kill(victim)
        deadline = time.time() + FAILOVER_CLIENT_TIMEOUT_S + 5
        while time.time() < deadline and None in w.next_ok(t_kill, sent_after=True).values():
            time.sleep(0.05)
        time.sleep(0.3)
        w.stop()
        first = w.next_ok(t_kill, sent_after=True)
        st2 = g.status()
        cat = g.log(st2["coordination"]["leader"] or g.catalogs[0])
        lost = [t for t, _ in log_times(cat, rf"container {victim} lost") if t > t_kill - 1]
        wrote = [t for t, _ in log_times(cat, r"wrote placement version") if lost and t >= lost[0]]
        took, current = [], []
        for c in {st2["partitions"][p]["primary"] for p in parts} - {None}:
            took += [t for t, _ in log_times(g.log(c), r"shard p\d+ is primary at epoch") if t > t_kill]
            current += [t for t, _ in log_times(g.log(c), r"synchronous replica .* is current") if t > t_kill]
        rel = lambda ts: round(min(ts) - t_kill, 3) if ts else None  # noqa: E731
        firsts = list(first.values())
        return {"victim": victim, "lost_partitions": parts, "per_partition_s": first,
                "first_ok_s": None if None in firsts else round(min(firsts), 3),
                "all_ok_s": None if None in firsts else round(max(firsts), 3),
                "lease_ended_s": rel(lost), "written_s": rel(wrote), "primary_taken_s": rel(took),
                "sync_current_s": rel(current)}
    finally:
        g.close()
        g.remove()


ETCD_FAILOVER_KEYS = ("first_ok_s", "all_ok_s", "lease_ended_s", "written_s", "primary_taken_s", "sync_current_s")


def etcd_failover_figure(work: Path, a) -> dict:
    runs = []
    for r in range(a.failover_runs):
        res = etcd_failover_once(work, r)
        runs.append(res)
        note(f"failover on etcd run {r + 1}: " + ", ".join(f"{k} {res[k]}" for k in ETCD_FAILOVER_KEYS))
    med = {}
    for k in ETCD_FAILOVER_KEYS:
        vals = [r[k] for r in runs if r[k] is not None]
        med[k] = statistics.median(vals) if vals else None
    return {"runs": runs, "median": med, "max_all_ok_s": max((r["all_ok_s"] or 1e9) for r in runs)}


ISSUE24 = ("catalog-kill", "etcd-rate", "etcd-failover", "tls-rate")


# -- figure 4: checkpoint copy -------------------------------------------------------------------------
def fill(address: str, keys: int, per_txn: int, routing: int = 1, pad: int = 16) -> tuple[int, float]:
    """``keys`` keys ``(routing, i)`` (one partition) in transactions of ``per_txn`` keys; (seqno, seconds)."""
    import multisite.grid as mg
    g = mg.connect(address)
    t0 = time.perf_counter()
    seqno = 0
    v = "x" * pad
    for lo in range(0, keys, per_txn):
        with g.transaction(routing) as tx:
            for i in range(lo, min(keys, lo + per_txn)):
                tx.put(MAP, (routing, i), {"n": i, "p": v})
        seqno = tx.seqno
    g.close()
    return seqno, time.perf_counter() - t0


def rate_writer(address: str, routing: int, keys: int, rate: float, stop: threading.Event,
                counts: dict) -> None:
    """Single-update transactions at ``rate`` per second in all on random keys of the partition, from
    one thread per 200 tx/s (a commit's round trip caps one thread), each with its own client."""
    import multisite.grid as mg
    n_threads = max(1, int(rate // 200))
    lock = threading.Lock()

    def one(t: int) -> None:
        g = mg.connect(address)
        rnd = random.Random(7 + t)
        t0 = time.perf_counter()
        n = 0
        while not stop.is_set():
            due = t0 + n * n_threads / rate
            d = due - time.perf_counter()
            if d > 0:
                time.sleep(d)
            try:
                g.put(MAP, (routing, rnd.randrange(keys)), {"n": n, "u": 1})
                kind = "ok"
            except Exception as e:  # noqa: BLE001
                kind = type(e).__name__
                time.sleep(0.01)
            with lock:
                counts[kind] = counts.get(kind, 0) + 1
            n += 1
        g.close()
    ths = [threading.Thread(target=one, args=(t,), daemon=True) for t in range(n_threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


def shard_seqno(g: GridUp, container: str, partition: int = 0) -> int | None:
    """The shard's seqno from its container's control socket (None while it is not there)."""
    from multisite.net import control
    try:
        st = control.call(g.root / container, "status", timeout=5)
        return st["shards"][str(partition)]["seqno"]
    except Exception:  # noqa: BLE001 - the shard being swapped, the container starting
        return None


def burst(address: str, n: int, workers: int = 2, threads: int = 32, routing: int = 1, keys: int = 1000) -> float:
    """``n`` single-update transactions on partition ``routing``'s keys, from worker processes; seconds."""
    t0 = time.perf_counter()
    per = n // (workers * threads) + 1
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--burst",
                               json.dumps({"catalog": address, "threads": threads, "n": per, "routing": routing,
                                           "keys": keys, "seed": w})], env={**os.environ})
             for w in range(workers)]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a burst worker failed")
    return time.perf_counter() - t0


def burst_main(spec: dict) -> None:
    import multisite.grid as mg
    g = mg.connect(spec["catalog"])

    def run(t: int) -> None:
        rnd = random.Random(spec["seed"] * 1000 + t)
        for i in range(spec["n"]):
            g.put(MAP, (spec["routing"], rnd.randrange(spec["keys"])), {"n": i, "b": 1})
    ths = [threading.Thread(target=run, args=(t,)) for t in range(spec["threads"])]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    g.close()


def checkpoint_grid(work: Path, a) -> tuple[GridUp, dict]:
    """The grid of the checkpoint figure: 1 partition (min_sync 0, max_async 1) on c1, filled with
    ``--keys`` keys in many-key transactions, then made to need a checkpoint copy (``--copy-trigger``)."""
    from multisite.engine import create
    from multisite.instance.maintenance import prune
    from multisite.grid.server.process import stop_process
    g = GridUp(work, "checkpoint", partitions=1, min_sync=0, max_sync=0, max_async=1)
    shard = g.root / "c1" / f"{g.name}-p0"
    how = a.copy_trigger
    if how == "prune":  # the container opens the instance it finds: one with 8 MiB journal segments
        create(shard, f"{g.name}-p0", group=g.name, durability="group", segment_bytes=8 << 20)
    g.add("c1")
    g.settled(full=False)
    seqno, fill_s = fill(g.address, a.keys, a.per_txn)
    note(f"checkpoint: filled {a.keys:,} keys in {seqno} transactions in {fill_s:.1f} s ({a.keys / fill_s:,.0f} keys/s)")
    info = {"keys": a.keys, "fill_transactions": seqno, "fill_s": fill_s, "trigger": how}
    if how == "prune":
        # the primary's journal must not reach back to seqno 1: prune it (the container stopped)
        listen = json.loads((g.root / "c1" / "run" / "container.json").read_text())["listen"]
        stop_process(g.root / "c1", "container")
        g.containers.remove("c1")
        rep = prune(shard, seqno + 1)
        info.update(pruned_segments=len(rep.removed), journal_first=rep.kept_from_seqno)
        note(f"checkpoint: pruned the primary's journal: removed {len(rep.removed)} segment(s), it starts at seqno "
             f"{rep.kept_from_seqno} now (the container restarted: its SQLite page cache is cold)")
        g.add("c1", listen)  # the same address: the catalog knows it by it
        g.settled(full=False)
    elif how == "behind":  # more than 200,000 transactions: shipping.CHECKPOINT_AFTER_DEFAULT
        n = a.behind
        secs = burst(g.address, n)
        info.update(behind_transactions=n, behind_s=secs)
        note(f"checkpoint: then {n:,} single-update transactions in {secs:.1f} s ({n / secs:,.0f} tx/s); seqno "
             f"{shard_seqno(g, 'c1'):,}")
    info["journal_mib"] = sum(f.stat().st_size for f in (shard / "journal").glob("*")) / 2**20
    info["store_mib"] = sum(f.stat().st_size for f in shard.rglob("*") if f.is_file() and "journal" not in f.parts) / 2**20
    return g, info


def copy_once(g: GridUp, a, rate: float, replica: str) -> dict:
    """One copy to a new container ``replica`` under a writer at ``rate`` tx/s (after ``--control-s`` of
    the writer alone); until the replica's shard holds the primary's seqno, sampling the primary
    container's memory every 50 ms; the replica container is stopped after."""
    from multisite.grid.server.process import stop_process
    seqno = shard_seqno(g, "c1")
    stop = threading.Event()
    counts: dict = {}
    wth = threading.Thread(target=rate_writer, args=(g.address, 1, a.keys, rate, stop, counts), daemon=True) \
        if rate > 0 else None
    if wth:
        wth.start()
        time.sleep(1.0)
    ppid = g.pids["c1"]
    ctl = None
    if wth and a.control_s > 0:  # the same writer without a copy: what it costs the primary by itself
        m0, k0 = mem_kb(ppid), counts.get("ok", 0)
        peak_ctl = m0["VmRSS"]
        t_end = time.time() + a.control_s
        while time.time() < t_end:
            time.sleep(0.05)
            peak_ctl = max(peak_ctl, rss_kb(ppid))
        m1, k1 = mem_kb(ppid), counts.get("ok", 0)
        ctl = {"seconds": a.control_s, "modified": k1 - k0, "rate": (k1 - k0) / a.control_s,
               "rss_growth_kb": peak_ctl - m0["VmRSS"], "anon_growth_kb": m1["RssAnon"] - m0["RssAnon"]}
    m_before = mem_kb(ppid)
    shard = g.root / "c1" / f"{g.name}-p0"
    wal = lambda: sum(f.stat().st_size for f in shard.rglob("*-wal"))
    wal0 = wal_peak = wal()
    samples = [(0.0, m_before)]
    ok0 = counts.get("ok", 0)
    cpu0 = cpu_s(ppid)
    b0 = machine_busy_s()
    t0 = time.time()
    g.add(replica)
    done_at = None
    s1 = s2 = None
    while time.time() - t0 < a.copy_timeout:
        s1, s2 = shard_seqno(g, "c1"), shard_seqno(g, replica)
        samples.append((round(time.time() - t0, 2), mem_kb(ppid)))
        wal_peak = max(wal_peak, wal())
        if s1 is not None and s2 is not None and s2 >= seqno and s2 >= s1 - max(2, int(rate * 0.05)):
            done_at = time.time() - t0
            break
        time.sleep(0.05)
    ok1 = counts.get("ok", 0)
    cpu1 = cpu_s(ppid)
    busy = (machine_busy_s() - b0) / max(1e-3, time.time() - t0)
    n_copy = len(samples)
    for _ in range(40):  # 2 s more: is the growth given back once the replica is live?
        time.sleep(0.05)
        samples.append((round(time.time() - t0, 2), mem_kb(ppid)))
    stop.set()
    if wth:
        wth.join(30)
    during = [m for _, m in samples[:n_copy]]
    grow = {k: max(m.get(k, 0) for m in during) - m_before.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")}
    after = samples[-1][1]
    ck_lines = [ln for _, ln in log_times(g.log("c1"), rf"(checkpoint at seqno|subscribes at seqno).*{replica}|"
                                                    rf"{replica} .*(checkpoint at seqno|subscribes at seqno)")]
    inst_lines = [ln for _, ln in log_times(g.log(replica), r"checkpoint installed|a checkpoint of the primary")]
    kind = "checkpoint" if any("checkpoint" in ln.split("subscribes", 1)[-1] for ln in ck_lines) else "catch-up"
    modified = ok1 - ok0
    res = {"rate": rate, "replica": replica, "primary_seqno": seqno, "start_kind": kind, "copy_s": done_at,
           "final_seqnos": [s1, s2], "modified_during_copy": modified,
           "achieved_rate": modified / done_at if done_at else None, "writer_alone": ctl,
           "mem_before_kb": m_before, "growth_kb": grow, "wal_before_b": wal0, "wal_peak_b": wal_peak, "mem_2s_after_kb": after,
           "primary_cpu_s": cpu1 - cpu0, "primary_cores": (cpu1 - cpu0) / done_at if done_at else None,
           "machine_cores_busy": busy, "load_average": os.getloadavg()[0],
           "writer_counts": dict(counts), "primary_log": [ln[24:] for ln in ck_lines][-3:],
           "replica_log": [ln[24:] for ln in inst_lines][-3:],
           "samples": [(t, m.get("VmRSS"), m.get("RssAnon"), m.get("RssFile")) for t, m in samples]}
    stop_process(g.root / replica, "container")
    g.containers.remove(replica)
    return res


def checkpoint_figure(work: Path, a) -> dict:
    g, info = checkpoint_grid(work, a)
    runs = []
    try:
        for i, rate in enumerate(a.writer_rates):
            st = g.settled(30, full=False)
            while any(c["up"] and c["name"] != "c1" for c in st["containers"]):  # the last replica gone
                time.sleep(0.1)
                st = g.status()
            res = copy_once(g, a, rate, f"r{i + 1}")
            runs.append(res)
            gr = res["growth_kb"]
            note(f"checkpoint copy #{i + 1} ({res['start_kind']}, primary at seqno {res['primary_seqno']:,}) under "
                 f"{rate:g} tx/s (achieved {res['achieved_rate'] or 0:,.0f}; alone "
                 f"{(res['writer_alone'] or {}).get('rate', 0):,.0f}): online in "
                 f"{'-' if res['copy_s'] is None else format(res['copy_s'], '.2f')} s; primary growth VmRSS "
                 f"+{gr['VmRSS'] / 1024:.1f} MiB (anon +{gr['RssAnon'] / 1024:.1f}, file +{gr['RssFile'] / 1024:.1f}) "
                 f"for {res['modified_during_copy']:,} entries modified; writer alone: "
                 f"{res['writer_alone']}")
    finally:
        g.close()
        g.remove()
    base = next((r["growth_kb"] for r in runs if r["rate"] == 0), None)
    for r in runs:  # the growth a copy costs with no writer is the copy's own; the rest is per entry
        m = r["modified_during_copy"]
        r["anon_bytes_per_modified_over_idle"] = (r["growth_kb"]["RssAnon"] - base["RssAnon"]) * 1024 / m \
            if base and m else None
        r["rss_bytes_per_modified_over_idle"] = (r["growth_kb"]["VmRSS"] - base["VmRSS"]) * 1024 / m \
            if base and m else None
    return {**info, "runs": runs, "idle_growth_kb": base}


# -- report -------------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(doc: dict) -> list[str]:
    """The result table (printed) and the RESULTS.md lines."""
    rows = []
    f = doc["figures"]
    if "commit" in f:
        c = f["commit"]
        b = c["best"]
        rows.append(("commit rate, 1 sync replica vs none (plateau of each)",
                     f"{b['sync1']['rate']:,.0f} tx/s ({b['sync1']['level']})",
                     f"{b['none']['rate']:,.0f} tx/s ({b['none']['level']})",
                     f"{c['ratio_at_plateau']:.2f}", ">= 0.8", verdict(c["ratio_at_plateau"] >= 0.8)))
        for lvl, v in c["levels"].items():
            rows.append((f"  at {lvl} (workers x threads)", f"{v['sync1']['rate']:,.0f} tx/s",
                         f"{v['none']['rate']:,.0f} tx/s", f"{c['ratio_by_level'][lvl]:.2f}", "", ""))
    if "failover" in f:
        fmt = lambda x: "-" if x is None else f"{x:.2f}"
        for which, title in (("client", "client"),):
            for hb, v in f["failover"].get(which, {}).items():
                m = v["median"]
                tot = m["first_ok_s"]
                rows.append(((f"failover ({title}), heartbeat timeout {hb} s, median of {len(v['runs'])}: first "
                             f"commit / every lost partition"),
                             f"{fmt(tot)} / {fmt(m['all_ok_s'])} s", "", "", "< 2 s",
                             "" if tot is None else verdict(tot < 2.0)))
                rows.append(("  split: detected / promoted / primary taken / sync current",
                             (f"{fmt(m['detected_s'])} / {fmt(m['promoted_s'])} / {fmt(m['primary_taken_s'])} / "
                             f"{fmt(m['sync_current_s'])} s"), "", "", "", ""))
                rows.append(("  runs where a lost partition never came back to the client",
                             f"{v['runs_with_stuck_partition']} of {len(v['runs'])}", "", "", "", ""))
    if "scaling" in f:
        s = f["scaling"]
        b = s["best"]
        rows.append(("scaling, 8 partitions, 2 containers vs 1 (plateau of each)",
                     f"{b['2']['rate']:,.0f} tx/s ({b['2']['level']})", f"{b['1']['rate']:,.0f} tx/s ({b['1']['level']})",
                     f"{s['ratio_at_plateau']:.2f}x", ">= 1.6x", verdict(s["ratio_at_plateau"] >= 1.6)))
        for lvl, v in s["levels"].items():
            rows.append((f"  at {lvl}", f"{v['2']['rate']:,.0f} tx/s", f"{v['1']['rate']:,.0f} tx/s",
                         f"{s['ratio_by_level'][lvl]:.2f}x", "", ""))
    if "checkpoint" in f:
        ck = f["checkpoint"]
        for r in ck["runs"]:
            rows.append(((f"{ck['keys']:,}-key partition online ({r['start_kind']}), writer {r['rate']:g} tx/s "
                         f"(achieved {r['achieved_rate'] or 0:,.0f})"),
                         "-" if r["copy_s"] is None else f"{r['copy_s']:.1f} s", "", "", "< 30 s",
                         "" if r["copy_s"] is None else verdict(r["copy_s"] < 30)))
            gr = r["growth_kb"]
            over = r.get("anon_bytes_per_modified_over_idle")
            rows.append(("  primary growth VmRSS (anon, file) / entries modified; anon B/entry over the idle copy",
                         (f"+{gr['VmRSS'] / 1024:.1f} MiB (+{gr['RssAnon'] / 1024:.1f}, +{gr['RssFile'] / 1024:.1f}) "
                         f"/ {r['modified_during_copy']:,}"),
                         "-" if over is None else f"{over:,.0f} B/entry", "", "", ""))
    return rows


def report24(doc: dict) -> list[tuple]:
    """Issue 24's rows: the figures of a grid without a single point of failure, and of TLS."""
    rows = []
    f = doc["figures"]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    if "catalog-kill" in f:
        c = f["catalog-kill"]
        single = c["runs"]["single"][0] if c["runs"]["single"] else None
        rows.append((f"write pause, leading catalog SIGKILLed (etcd, 2 catalogs): next commit of every partition, "
                     f"median / max of {len(c['runs']['etcd'])}",
                     f"{fmt(c['median_next_commit_s'])} / {fmt(c['max_next_commit_s'])} s",
                     "" if single is None else (f"single catalog: {single['accepted_after']} commits in the "
                                                f"{c['observe_s']:g} s after its kill"),
                     "", "<= 1 s", "" if c["max_next_commit_s"] is None else verdict(c["max_next_commit_s"] <= 1.0)))
        rows.append((f"  longest time without a commit on a partition in the {c['observe_s']:g} s after the kill",
                     f"{fmt(c['max_gap_after_s'])} s", "", "", "", ""))
    if "etcd-rate" in f:
        e = f["etcd-rate"]
        b = e["best"]
        rows.append(("commit rate, catalogs on etcd (2) vs the single catalog (plateau of each)",
                     f"{b['etcd']['rate']:,.0f} tx/s ({b['etcd']['level']})",
                     f"{b['single']['rate']:,.0f} tx/s ({b['single']['level']})",
                     f"{e['ratio_at_plateau']:.2f}", ">= 0.95", verdict(e["ratio_at_plateau"] >= 0.95)))
        for lvl, v in e["levels"].items():
            rows.append((f"  at {lvl}", f"{v['etcd']['rate']:,.0f} tx/s", f"{v['single']['rate']:,.0f} tx/s",
                         f"{e['ratio_by_level'][lvl]:.2f}", "", ""))
    if "etcd-failover" in f:
        fo = f["etcd-failover"]
        m = fo["median"]
        rows.append((f"container failover on etcd, SIGKILL -> first commit on every lost partition, median of "
                     f"{len(fo['runs'])} (max)", f"{fmt(m['all_ok_s'])} s ({fmt(fo['max_all_ok_s'])})", "", "",
                     "<= 2 s", "" if m["all_ok_s"] is None else verdict(fo["max_all_ok_s"] <= 2.0)))
        rows.append(("  split: lease ended / state written / primary taken / sync current / first commit",
                     (f"{fmt(m['lease_ended_s'])} / {fmt(m['written_s'])} / {fmt(m['primary_taken_s'])} / "
                      f"{fmt(m['sync_current_s'])} / {fmt(m['first_ok_s'])} s"), "", "", "", ""))
    if "tls-rate" in f:
        t = f["tls-rate"]
        b = t["best"]
        rows.append(("commit rate, TLS on every grid wire vs none (plateau of each)",
                     f"{b['tls']['rate']:,.0f} tx/s ({b['tls']['level']})",
                     f"{b['plain']['rate']:,.0f} tx/s ({b['plain']['level']})",
                     f"{t['ratio_at_plateau']:.2f}", ">= 0.9", verdict(t["ratio_at_plateau"] >= 0.9)))
        for lvl, v in t["levels"].items():
            rows.append((f"  at {lvl}", f"{v['tls']['rate']:,.0f} tx/s", f"{v['plain']['rate']:,.0f} tx/s",
                         f"{t['ratio_by_level'][lvl]:.2f}", "", ""))
    return rows


def write_results_24(doc: dict) -> None:
    """Issue 24's section of RESULTS.md (its own markers: the issue 11 section is left as it is)."""
    from results import RESULTS, write_section, markers
    script = "grid.py (issue 24)"
    begin, end = markers(script)
    old = RESULTS.read_text() if RESULTS.exists() else ""
    notes = ""
    if NOTES24_BEGIN in old and NOTES24_END in old:  # hand-written analysis, kept across runs
        notes = NOTES24_BEGIN + old.split(NOTES24_BEGIN, 1)[1].split(NOTES24_END, 1)[0] + NOTES24_END
    f = doc["figures"]
    runs = {k: v for k, v in doc.get("figure_runs", {}).items() if k in ISSUE24}
    L = [begin, "## Grid without a single point of failure, TLS on every wire (issue 24)", "",
         (f"Run on commit {doc.get('commit', '?')}: {doc['machine']}, the 2 CPUs shared with other sessions. "
          "Each figure's run: " + "; ".join(f"{k} at {v['time']} (load average {v['load_average'][0]:.1f} → "
                                            f"{v['load_average'][1]:.1f})" for k, v in runs.items()) + ". "
          "etcd: 3 members on loopback (`testing/etcd.py`, 50 ms heartbeat, 500 ms election); catalogs and "
          "containers with `--etcd` and a 1 s lease. Ratios are same-run: both grids up at once, each level's "
          "windows alternating between them (`compare`)."), "",
         "| figure | measured | baseline | ratio | target | verdict |", "|---|---:|---:|---:|---|---|"]
    for row in report24(doc):
        L.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
    if "catalog-kill" in f:
        c = f["catalog-kill"]
        L += ["", "### The leading catalog SIGKILLed under a writer", "",
              ("4 partitions, min_sync 1, max_sync 1, max_async 1, 3 containers; one writer thread per partition "
               "(its own client) commits single updates in a loop; the leading catalog is SIGKILLed and the "
               f"writers watched for {c['observe_s']:g} s. `next commit` = from the kill to the partition's next "
               "accepted commit; `longest gap` = the longest time in the window without an accepted commit on a "
               "partition; `new leader` = the other catalog logs that it leads."), "",
              "| grid | run | next commit per partition (s) | longest gap after (before) | commits after / 1 s before | new leader |",
              "|---|---|---|---|---|---:|"]
        for kind, rs in c["runs"].items():
            for i, r in enumerate(rs):
                L.append(f"| {kind} | {i + 1} | {r['next_commit_s']} | {max(r['longest_gap_after_s'].values()):.3f} "
                         f"({max(r['longest_gap_before_s'].values()):.3f}) | {r['accepted_after']} / "
                         f"{r['accepted_1s_before']} | {r.get('new_leader_s', '-')} |")
    if "etcd-failover" in f:
        L += ["", "### Container failover on etcd", "",
              ("The container with the most primaries is SIGKILLed under one writer per lost partition. Times "
               "from the kill: `lease ended` = the leading catalog logs `container X lost: its lease in etcd "
               "ended` (etcd ends a lease at its TTL, checking every 500 ms); `written` = it wrote the promotion; "
               "`primary taken` = the new primary's container logs it; `sync current` = it counts a synchronous "
               "replica current (min_sync 1 needs one to answer); `first` / `all` = the first accepted commit "
               "sent after the kill, of the first and of the last lost partition."), "",
              "| run | lease ended | written | primary taken | sync current | first | all |", "|---|---:|---:|---:|---:|---:|---:|"]
        for i, r in enumerate(f["etcd-failover"]["runs"]):
            L.append(f"| {i + 1} | " + " | ".join("-" if r[k] is None else f"{r[k]:.3f}" for k in
                                                  ("lease_ended_s", "written_s", "primary_taken_s", "sync_current_s",
                                                   "first_ok_s", "all_ok_s")) + " |")
    for key, a_, b_, title in (("etcd-rate", "etcd", "single", "Commit rate, catalogs on etcd vs the single catalog"),
                               ("tls-rate", "tls", "plain", "Commit rate, TLS on every grid wire vs none")):
        if key in f:
            e = f[key]
            L += ["", f"### {title}", "",
                  (f"{doc['args']['partitions']} partitions, min_sync 1, max_sync 1, max_async 0 on 2 containers "
                   f"(every commit crosses the container ⇄ container vote wire); load as in the issue 11 commit "
                   f"figure (W worker processes x T threads of `g.put`), {e['rounds']} alternating rounds of "
                   f"{e['seconds']:g} s per level." + (" The TLS grid: every process and the load with a member "
                                                       "certificate of the grid's CA." if key == "tls-rate" else "")),
                  "", f"| W x T | {a_} tx/s | {b_} tx/s | ratio | cores, {a_} | cores, {b_} |",
                  "|---|---:|---:|---:|---|---|"]
            for lvl, v in e["levels"].items():
                L.append(f"| {lvl} | {v[a_]['rate']:,.0f} | {v[b_]['rate']:,.0f} | {e['ratio_by_level'][lvl]:.2f} | "
                         f"{md_cpu(v[a_]['cpu'])} | {md_cpu(v[b_]['cpu'])} |")
    L += ["", notes or f"{NOTES24_BEGIN}\n{NOTES24_END}", "",
          ("Reproduce: `PYTHONPATH=src .venv/bin/python bench/grid.py --figure catalog-kill --figure etcd-failover "
           "--figure etcd-rate --figure tls-rate --warmup 8 --merge` (`--warmup`: seconds of load before each "
           "window, so that the workers' TLS handshakes are done)."), end]
    write_section(script, "\n".join(L) + "\n")


NOTES_BEGIN, NOTES_END = "<!-- grid notes: begin -->", "<!-- grid notes: end -->"
NOTES24_BEGIN, NOTES24_END = "<!-- grid issue 24 notes: begin -->", "<!-- grid issue 24 notes: end -->"


def md_cpu(cpu: dict) -> str:
    workers = sum(v for n, v in cpu.items() if n.startswith("worker"))
    parts = [f"{n} {v:.2f}" for n, v in cpu.items()
             if not n.startswith("worker") and n not in ("bench (this)", "other processes")]
    return ", ".join(parts + [f"workers {workers:.2f}", f"bench {cpu.get('bench (this)', 0):.2f}",
                              f"**others {cpu.get('other processes', 0):.2f}**"])


def write_results(doc: dict) -> None:
    """The Grid (issue 11) section of RESULTS.md from ``doc``; the notes block in it is kept."""
    from results import RESULTS, markers, write_section
    begin, end = markers("grid.py")
    notes = ""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    if NOTES_BEGIN in old and NOTES_END in old:
        notes = NOTES_BEGIN + old.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0] + NOTES_END
    f = doc["figures"]
    la = doc.get("load_average", [0, 0])
    L = [begin, "## Grid (issue 11)", "",
         (f"Run {doc['time']} on commit {doc.get('commit', '?')}: {doc['machine']}. Load average {la[0]:.1f} before, "
         f"{la[1]:.1f} after: **the 2 CPUs were shared with other sessions' benchmarks and test suites** "
         f"(each table gives the cores the rest of the machine used in the same window, from /proc/stat). "
         f"Every process is on the same 2 CPUs: catalog, containers, the load's worker processes and this script. "
         f"Containers' shards have `group` durability (the container's default)."), "",
         "| figure | measured | baseline | ratio | target | verdict |", "|---|---:|---:|---:|---|---|"]
    for row in report(doc):
        L.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    runs = doc.get("figure_runs", {})
    if runs:
        L += ["", "Each figure's run: " + "; ".join(
            f"{k} at {v['time']} (load average {v['load_average'][0]:.1f} → {v['load_average'][1]:.1f})"
            for k, v in runs.items()) + "."]
    if "commit" in f:
        c = f["commit"]
        L += ["", (f"### Commit rate, one synchronous replica vs none ({c['partitions']} partitions, "
                  f"{c['rounds']} alternating rounds of {c['seconds']:g} s per level)"), "",
              ("Load: W worker processes x T threads, each thread `g.put(\"m\", (k,), {\"n\": i})` on random keys; "
              "both grids are up at once and each level's windows alternate between them (the order reversed "
              "every other round), so that the other sessions' load falls on both alike; "
              "sync1 = min_sync 1, max_sync 1, max_async 0 on 2 containers (each primary of half the partitions and "
              "sync replica of the other half); none = all 0 on 1 container. Cores = CPU seconds per second over "
              "the window (mean of the rounds)."), "",
              "| W x T | sync1 tx/s | none tx/s | ratio | cores, sync1 | cores, none |", "|---|---:|---:|---:|---|---|"]
        for lvl, v in c["levels"].items():
            L.append(f"| {lvl} | {v['sync1']['rate']:,.0f} | {v['none']['rate']:,.0f} | {c['ratio_by_level'][lvl]:.2f} | "
                     f"{md_cpu(v['sync1']['cpu'])} | {md_cpu(v['none']['cpu'])} |")
    if "failover" in f:
        L += ["", "### Failover", "",
              ("min_sync 1, max_sync 1, max_async 1, 4 partitions on 3 containers; the container with the most "
              "primaries is SIGKILLed while one writer thread per lost partition (its own client) commits single "
              "updates in a loop. Times from the kill: `detected` = the catalog logs `container X lost`; "
              "`promoted` = its `promote partition` line; `primary taken` = the surviving container logs `shard pN is "
              "primary`; `sync current` = it logs a synchronous replica current again (min_sync 1 needs one); "
              "`first commit` = the first commit a writer got accepted after the kill; `every partition` = the last "
              "lost partition's first accepted commit."), "",
              ("| client | heartbeat timeout | run | detected | promoted | primary taken | sync current | first commit "
              "| every partition | client errors before the first accepted commit |"), "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
        fmt = lambda x: "-" if x is None else f"{x:.3f}"
        for which, title in (("client", "client"),):
            for hb, v in f["failover"].get(which, {}).items():
                for i, r in enumerate(v["runs"]):
                    errs = "; ".join(f"p{p}: " + ", ".join(f"{k} {n}" for k, n in pv["errors"].items())
                                     for p, pv in r["per_partition"].items())
                    stuck = f" (stuck: p{r['stuck_partitions']})" if r["stuck_partitions"] else ""
                    L.append(f"| {title} | {hb} s | {i + 1} | {fmt(r['detected_s'])} | {fmt(r['promoted_s'])} | "
                             f"{fmt(r['primary_taken_s'])} | {fmt(r['sync_current_s'])} | {fmt(r['first_ok_s'])} | "
                             f"{fmt(r['all_ok_s'])}{stuck} | {errs} |")
    if "scaling" in f:
        sc = f["scaling"]
        L += ["", "### Scaling: 8 partitions, no replicas, 2 containers vs 1", "",
              "| W x T | 2 containers tx/s | 1 container tx/s | ratio | cores, 2 containers | cores, 1 container |",
              "|---|---:|---:|---:|---|---|"]
        for lvl, v in sc["levels"].items():
            L.append(f"| {lvl} | {v['2']['rate']:,.0f} | {v['1']['rate']:,.0f} | {sc['ratio_by_level'][lvl]:.2f}x | "
                     f"{md_cpu(v['2']['cpu'])} | {md_cpu(v['1']['cpu'])} |")
    if "checkpoint" in f:
        ck = f["checkpoint"]
        trig = {"behind": f"then {ck.get('behind_transactions', 0):,} single-update transactions, so that a new "
                          f"replica is more than 200,000 transactions behind (`shipping.CHECKPOINT_AFTER_DEFAULT`)",
                "prune": "then the primary's journal pruned (8 MiB segments), so that it no longer starts at seqno 1",
                "none": "nothing more (the replica replays the journal)"}[ck["trigger"]]
        L += ["", "### Checkpoint copy", "",
              (f"One partition (min_sync 0, max_async 1) on container c1, filled with {ck['keys']:,} keys `(1, i)` in "
              f"{ck['fill_transactions']} transactions of {doc['args']['per_txn']:,} keys through `g.transaction(1)` "
              f"({ck['fill_s']:.1f} s), {trig}; journal {ck['journal_mib']:.0f} MiB, store {ck['store_mib']:.0f} MiB. "
              "Then, for each writer rate, a new container joins, the catalog places the async replica on it and "
              "it subscribes at seqno 0 (a checkpoint copy, then the frames after it); the time is until its "
              "shard's seqno reaches the primary's (both from the containers' control sockets, every 50 ms). "
              "Before each copy the writer runs alone for a few seconds (`alone`), to tell its own cost from the "
              "copy's. The primary's VmRSS and its parts (RssAnon, RssFile) are sampled every 50 ms; growth = peak "
              "during the copy minus the value at its start. Each copy's replica container is stopped before the "
              "next."), "",
              ("| writer tx/s: asked / alone / during the copy | online in | entries modified during the copy | "
              "VmRSS growth | RssAnon growth | RssFile growth | anon B/entry over the idle copy | VmRSS 2 s after | "
              "store WAL on disk, start → peak | primary cores | machine cores busy |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for r in ck["runs"]:
            gr = r["growth_kb"]
            alone = (r["writer_alone"] or {}).get("rate", 0)
            over = r.get("anon_bytes_per_modified_over_idle")
            L.append(f"| {r['rate']:g} / {alone:,.0f} / {r['achieved_rate'] or 0:,.0f} | "
                     f"{'-' if r['copy_s'] is None else format(r['copy_s'], '.1f')} s | {r['modified_during_copy']:,} | "
                     f"+{gr['VmRSS'] / 1024:.1f} MiB | +{gr['RssAnon'] / 1024:.1f} MiB | +{gr['RssFile'] / 1024:.1f} MiB | "
                     f"{'-' if over is None else format(over, ',.0f')} | {r['mem_2s_after_kb'].get('VmRSS', 0) / 1024:.1f} MiB | "
                     + (f"{r['wal_before_b'] / 2**20:.1f} → {r['wal_peak_b'] / 2**20:.1f} MiB" if "wal_peak_b" in r else "-")
                     + f" | {r['primary_cores'] or 0:.2f} | {r['machine_cores_busy']:.2f} |")
        if ck["runs"]:
            L += ["", "Logs of the last copy: " + "; ".join(f"`{ln}`" for ln in ck["runs"][-1]["primary_log"] +
                                                            ck["runs"][-1]["replica_log"])]
    L += ["", notes or f"{NOTES_BEGIN}\n{NOTES_END}", "",
          ("Reproduce: `make bench-grid` (or `PYTHONPATH=src .venv/bin/python bench/grid.py`, `--figure NAME` for "
          "one, `--quick` for a short try); JSON in bench/out/grid.json; `--results-from bench/out/grid.json` "
          "rewrites this section from a JSON without measuring."), end]
    write_section("grid.py", "\n".join(L) + "\n")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker_main(json.loads(sys.argv[2]))
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--burst":
        burst_main(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figure", action="append",
                    choices=("commit", "failover", "scaling", "checkpoint", *ISSUE24, "all"))
    ap.add_argument("--quick", action="store_true", help="short windows, one round; prints, writes no RESULTS.md")
    ap.add_argument("--partitions", type=int, default=4, help="commit figure: partitions of both grids")
    ap.add_argument("--levels", default="2x16,4x64,4x128,6x128", help="commit figure: workers x threads, comma-separated")
    ap.add_argument("--scaling-levels", default="2x16,4x64,4x128,6x128", help="scaling figure: workers x threads")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window per level")
    ap.add_argument("--warmup", type=float, default=1.5,
                    help="seconds of load before each window (the workers' connections, TLS handshakes included)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each configuration, alternating")
    ap.add_argument("--heartbeat-timeouts", type=float, nargs="+", default=[1.0])
    ap.add_argument("--failover-runs", type=int, default=5)
    ap.add_argument("--keys", type=int, default=1_000_000, help="checkpoint: keys in the partition")
    ap.add_argument("--per-txn", type=int, default=10_000, help="checkpoint: keys per fill transaction")
    ap.add_argument("--copy-trigger", choices=("prune", "behind", "none"), default="behind",
                    help="checkpoint: how the new replica's subscription is made a checkpoint copy: prune the "
                         "primary's journal after the fill (8 MiB segments), or add --behind single-update "
                         "transactions after it; none: the replica replays the fill's journal")
    ap.add_argument("--behind", type=int, default=201_000, help="checkpoint, --copy-trigger behind: transactions")
    ap.add_argument("--writer-rates", type=float, nargs="+", default=[0, 500, 2000, 4000])
    ap.add_argument("--copy-timeout", type=float, default=120.0)
    ap.add_argument("--control-s", type=float, default=5.0,
                    help="checkpoint: seconds of the writer alone before the copy (its own memory growth)")
    ap.add_argument("--keep", action="store_true", help="keep every grid's directory and logs")
    ap.add_argument("--json", default=str(OUT / "grid.json"))
    ap.add_argument("--write-results", action=argparse.BooleanOptionalAction, default=None,
                    help="write the Grid (issue 11) section of RESULTS.md (default: unless --quick or one figure)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other figures of the existing --json file (and write RESULTS.md from all)")
    ap.add_argument("--results-from", metavar="JSON", help="only write RESULTS.md's section from this JSON")
    a = ap.parse_args()
    if a.results_from:
        write_results(json.loads(Path(a.results_from).read_text()))
        console.print(f"wrote the Grid (issue 11) section of {HERE / 'RESULTS.md'}")
        return
    global KEEP
    KEEP = a.keep
    figs = ["commit", "failover", "scaling", "checkpoint", *ISSUE24] if not a.figure or "all" in a.figure \
        else a.figure
    if a.quick:
        a.seconds, a.rounds, a.failover_runs = 2.0, 1, 1
    OUT.mkdir(exist_ok=True)
    work = OUT / f"grid-{os.getpid()}"
    work.mkdir()
    load0 = os.getloadavg()
    doc = {"benchmark": "grid", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "figures": {},
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
           "args": {k: v for k, v in vars(a).items() if k != "json"}}
    try:
        from results import git_state
        doc["commit"] = git_state()
    except ImportError:
        pass
    if a.merge and Path(a.json).exists():  # keep the figures this run does not measure
        old = json.loads(Path(a.json).read_text())
        doc["figures"] = {k: v for k, v in old.get("figures", {}).items() if k not in figs}
        doc["figure_runs"] = {k: v for k, v in old.get("figure_runs", {}).items() if k not in figs}
    try:
        for fig in figs:
            note(f"[bold]figure {fig}[/bold]")
            fn = {"commit": commit_figure, "failover": failover_figure, "scaling": scaling_figure,
                  "checkpoint": checkpoint_figure, "catalog-kill": catalog_kill_figure, "etcd-rate": etcd_rate_figure,
                  "etcd-failover": etcd_failover_figure, "tls-rate": tls_rate_figure}[fig]
            l0, t0 = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M")
            doc["figures"][fig] = fn(work, a)
            doc.setdefault("figure_runs", {})[fig] = {"time": t0, "load_average": [l0, os.getloadavg()[0]],
                                                      "commit": doc.get("commit")}
            Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")  # each figure as it lands
    finally:
        if ETCD is not None:
            ETCD.stop()
        if not KEEP:
            shutil.rmtree(work, ignore_errors=True)
    doc["load_average"] = [load0[0], os.getloadavg()[0]]
    Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    t = Table(title="the grid (issue 11): same-run figures")
    for col in ("figure", "measured", "baseline", "ratio", "target", "verdict"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for row in report(doc) + report24(doc):
        t.add_row(*row)
    console.print(t)
    console.print(f"wrote {a.json}")
    old = [f for f in figs if f not in ISSUE24]
    write = a.write_results if a.write_results is not None else (not a.quick and (len(old) == 4 or a.merge))
    if write and (old or not a.merge):
        write_results(doc)
        console.print(f"wrote the Grid (issue 11) section of {HERE / 'RESULTS.md'}")
    if (a.write_results if a.write_results is not None else not a.quick) and any(f in ISSUE24 for f in figs):
        write_results_24(doc)
        console.print(f"wrote the Grid (issue 24) section of {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
