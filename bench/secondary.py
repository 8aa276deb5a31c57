"""The secondary's CPU per applied transaction (issue 14: "the secondary keeps up with less CPU").

    .venv/bin/python bench/secondary.py                                  # this tree, both modes
    .venv/bin/python bench/secondary.py --quick                          # 1 run, shorter
    .venv/bin/python bench/secondary.py --tree before=/tmp/old/src --tree after=src
    .venv/bin/python bench/secondary.py --profile OUTDIR --modes replay  # cProfile of S, per thread

Every configuration runs a primary P (this tree) and a secondary S (``--tree``: the code under test,
its server process started with that ``PYTHONPATH``), each a ``multisite server`` process of its own,
group durability, P on the first CPU this script may use and S on the second. The figure is S's
server process's CPU time (user + system, /proc/PID/stat: the receiver, the Update Process and
everything else the process does) over the window, divided by the transactions S applied in it:
much less moved by the machine's other load than a rate. Modes (``--modes``):

- ``stream``: clients (``multisite.connect``, 16 paced threads in this process) offer
  ``--rate`` single-update transactions/s to P for ``--seconds``; S streams them as they commit
  (a few transactions a batch, the issue's case). Nothing polls S meanwhile.
- ``replay``: P holds ``--n`` single-update transactions (bench/catchup.py's primary, built once
  and cached); its source starts with ``max_batch_bytes`` ``--batch-bytes`` (about
  four transactions a batch, as in streaming) and S catches up from its journal files: S's receive
  path at streaming's batch size without any client on the machine.

- ``ratio`` (issue 27): commits/s through clients on P without a secondary and with S streaming,
  at 2 connections (2 threads of this process, ``multisite.connect``) and at 16 (2 client processes x
  8); the figure is with / without (target >= 0.85). P, S and the client processes run the tree's code.
- ``lag`` (issue 27): 5,000 tx/s offered to P by 16 paced threads with S streaming; a probe takes the
  seqno a client just got back and polls S's client port until S shows it: commit -> visible on S,
  p50 and p99 (target p50 < 1 ms, p99 < 10 ms); S's CPU per transaction in the same window.

Trees alternate run by run; the table gives medians and the ratio to the first tree. Without
``--quick`` the script rewrites its section of bench/RESULTS.md (a hand-written notes block in it is
kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import multisite
from multisite.net import control
from multisite.server.process import start_server, stop_server
from catchup import build_primary
from replication import CPUS, OFFERED_TX_S, P_CPU, S_CPU, Pair, commit_rate, lag_run, threads_commit
from results import boost_session, git_state, markers, write_section

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "secondary"
LAG_THREADS = 16


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds process ``pid`` has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def note(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def applied_here(root: Path) -> int:
    """Transactions S's receiver applied on its own loop (issue 27; 0 for a tree without it)."""
    rcv = control.call(root, "status").get("receiver") or {}
    return (rcv.get("update_process") or {}).get("applied_here", 0)


def start_s(root: Path, tree: Path, profile: Path | None) -> int:
    """S's server from ``tree`` (optionally under ``profiled_server.py``); its pid."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if profile is None:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(tree)
        try:
            pid = start_server(root, "127.0.0.1:0", S_CPU)["pid"]
            boost_session(pid)
            return pid
        finally:
            os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    profile.mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{HERE}"
    cmd = ["taskset", "-c", S_CPU, sys.executable, str(HERE / "profiled_server.py"), str(profile), str(root),
           "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, env=env, stdout=open(root / "log" / "server.out", "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not control.is_running(root):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the profiled server for {root} did not start")
        time.sleep(0.05)
    return proc.pid


class tree_env:
    """Every process started inside the block (P, S, client processes) runs ``tree``'s code."""

    def __init__(self, tree: Path):
        self.tree, self.old = str(tree), None

    def __enter__(self) -> None:
        self.old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = self.tree

    def __exit__(self, *exc: object) -> None:
        if self.old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.old


def ratio_run(tree: Path, args, work: Path) -> dict:
    """Commits/s through clients without and with S streaming, at 2 and at 16 connections."""
    out: dict = {"load": os.getloadavg()[0]}
    with tree_env(tree):
        for label, procs, conns in (("2", 1, 2), ("16", 2, 8)):
            for secondary in (False, True):
                pair = Pair(work, secondary)
                try:
                    out[f"{label}_{'with' if secondary else 'without'}"] = commit_rate(pair, procs, conns, args.seconds)["commits_s"]
                finally:
                    pair.close()
            out[f"{label}_ratio"] = out[f"{label}_with"] / max(1e-9, out[f"{label}_without"])
    return out


def lag_of(tree: Path, args, work: Path) -> dict:
    """Commit -> visible on S at OFFERED_TX_S offered (replication.lag_run), S from ``tree``."""
    with tree_env(tree):
        r = lag_run(work, 0, args.seconds)
    return {k: r[k] for k in ("achieved_s", "lag_p50_ms", "lag_p99_ms", "samples", "tx_per_batch", "s_cpu_us_per_tx",
                              "bounded")} | {"load": os.getloadavg()[0],
                                             "s_cpu_us_per_batch": r["s_cpu_us_per_tx"] * r["tx_per_batch"]}


def one(mode: str, tree: Path, args, work: Path, profile: Path | None) -> dict:
    if mode == "ratio":
        return ratio_run(tree, args, work)
    if mode == "lag":
        return lag_of(tree, args, work)
    run = work / f"run-{time.monotonic_ns()}"
    p_root, s_root = run / "P", run / "S"
    started: list[Path] = []
    try:
        if mode == "replay":
            shutil.copytree(build_primary(args.n)[0], p_root)
        else:
            multisite.create(p_root, name="P", durability="group")
        multisite.create(s_root, name="S", durability="group")
        s_pid = start_s(s_root, tree, profile)
        started.append(s_root)
        listen = control.call(s_root, "receiver.start", listen="127.0.0.1:0")["listen"]
        p_info = start_server(p_root, '127.0.0.1:0', P_CPU)
        boost_session(p_info["pid"])
        p_addr = f"127.0.0.1:{p_info['client_port']}"
        started.append(p_root)
        seqno = lambda root: control.call(root, "status")["seqno"]  # noqa: E731
        if mode == "replay":
            target = seqno(p_root)
            cpu0, s0, t0 = cpu_seconds(s_pid), seqno(s_root), time.perf_counter()
            control.call(p_root, "source.start", secondary="S", connect=listen, max_batch_bytes=args.batch_bytes)
            while seqno(s_root) < target:
                if time.perf_counter() - t0 > args.timeout:
                    raise RuntimeError(f"S at seqno {seqno(s_root):,} of {target:,} after {args.timeout:.0f} s")
                time.sleep(0.05)
            dt, cpu1 = time.perf_counter() - t0, cpu_seconds(s_pid)
            st = control.call(p_root, "source.status", secondary="S")
            applied = target - s0
        else:
            with multisite.connect(p_addr) as db:
                db.create_region("acct")
            control.call(p_root, "source.start", secondary="S", connect=listen)
            while control.call(p_root, "source.status", secondary="S")["state"] != "streaming":
                time.sleep(0.05)
            box: dict = {}

            def during(end: float) -> None:
                box["cpu0"], box["s0"], box["st0"] = cpu_seconds(s_pid), seqno(s_root), \
                    control.call(p_root, "source.status", secondary="S")
                box["here0"] = applied_here(s_root)
                time.sleep(max(0.0, end - time.perf_counter()))
                box["cpu1"], box["s1"], box["here1"] = cpu_seconds(s_pid), seqno(s_root), applied_here(s_root)

            got, dt, _ = threads_commit(lambda: multisite.connect(p_addr), LAG_THREADS, args.seconds,
                                        pace_s=LAG_THREADS / args.rate, during=during)
            cpu0, cpu1, applied = box["cpu0"], box["cpu1"], box["s1"] - box["s0"]
            st1 = control.call(p_root, "source.status", secondary="S")
            st = {k: st1[k] - box["st0"][k] for k in ("sent_records", "sent_batches")}
            st["here"] = box["here1"] - box["here0"]
        per_tx = 1e6 / max(1, applied)
        user, sys_ = (cpu1[0] - cpu0[0]) * per_tx, (cpu1[1] - cpu0[1]) * per_tx
        tx_per_batch = st["sent_records"] / max(1, st["sent_batches"])
        return {"cpu_us_per_tx": user + sys_, "user_us_per_tx": user, "sys_us_per_tx": sys_, "applied": applied,
                "applied_s": applied / dt, "tx_per_batch": tx_per_batch,
                "cpu_us_per_batch": (user + sys_) * tx_per_batch,
                "applied_here": st.get("here", 0) / max(1, applied)}
    finally:
        for root in reversed(started):
            try:
                stop_server(root, 30)
            except Exception as e:
                note(f"stopping {root}: {e}")
        shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH/src",
                    help="S's code tree (repeatable; default this one)")
    ap.add_argument("--modes", default="stream,replay", help="comma-separated: stream, replay")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="stream: measured seconds")
    ap.add_argument("--rate", type=float, default=3000.0, help="stream: offered transactions/s")
    ap.add_argument("--n", type=int, default=200_000, help="replay: transactions behind")
    ap.add_argument("--batch-bytes", type=int, default=512, help="replay: the source's max_batch_bytes")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true", help="1 run, 5 s streaming, 50,000 replayed")
    ap.add_argument("--profile", metavar="DIR", help="run S under cProfile; per-thread .prof files in DIR")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds, args.n = 1, 5.0, 50_000
    trees = [(lbl, Path(p).resolve()) for lbl, p in (t.split("=", 1) for t in args.tree)] or \
        [("this", Path(multisite.__file__).resolve().parent.parent)]
    modes = [m for m in args.modes.split(",") if m]
    if len(CPUS) < 2:
        note("warning: one CPU: P and S share it")
    boost_session(os.getpid())  # this session: the client processes and threads
    load0 = os.getloadavg()
    t_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    note(f"load average before {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}")
    OUT.mkdir(parents=True, exist_ok=True)
    res: dict = {m: {lbl: [] for lbl, _ in trees} for m in modes}
    for r in range(args.runs):
        for mode in modes:
            for lbl, tree in (trees if r % 2 == 0 else trees[::-1]):
                prof = Path(args.profile) / f"{mode}-{lbl}-{r}" if args.profile else None
                x = one(mode, tree, args, OUT, prof)
                res[mode][lbl].append(x)
                note(f"run {r} {mode:6} {lbl:8} {describe(mode, x)}")
    load1 = os.getloadavg()
    note(f"load average after {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}")
    summary = {"load_before": load0, "load_after": load1, "args": vars(args), "runs": res, "median": {}}
    for mode in modes:
        for lbl, _ in trees:
            rs = res[mode][lbl]
            med = {k: statistics.median(x[k] for x in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
            summary["median"].setdefault(mode, {})[lbl] = med
            print(f"{mode:6} {lbl:8} median: {describe(mode, med)}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if not args.quick and args.profile is None:
        write_section("secondary.py", section(summary, trees, modes, args, t_start))


def describe(mode: str, x: dict) -> str:
    """One run's (or the medians') figures as a line."""
    if mode == "ratio":
        return (f"2 connections {x['2_without']:,.0f} -> {x['2_with']:,.0f} commits/s with S (ratio {x['2_ratio']:.2f}); "
                f"16: {x['16_without']:,.0f} -> {x['16_with']:,.0f} ({x['16_ratio']:.2f}) (load {x['load']:.1f})")
    if mode == "lag":
        return (f"lag p50 {x['lag_p50_ms']:.2f} ms, p99 {x['lag_p99_ms']:.2f} ms at {x['achieved_s']:,.0f} tx/s "
                f"({x['samples']:.0f} samples, {x['tx_per_batch']:.1f} tx/batch), S CPU {x['s_cpu_us_per_tx']:.1f} "
                f"us/tx, {x['s_cpu_us_per_batch']:.0f} us/batch (load {x['load']:.1f})")
    # Per batch as well: S's work is mostly per batch, and how many transactions a batch holds moves
    # with the load (3-6 here), so us/tx moves with it for the same code.
    return (f"S CPU {x['cpu_us_per_tx']:7.1f} us/tx (user {x['user_us_per_tx']:.0f}, sys {x['sys_us_per_tx']:.0f}), "
            f"{x['cpu_us_per_batch']:.0f} us/batch, {x['applied_s']:,.0f} tx/s applied, "
            f"{x['tx_per_batch']:.1f} tx/batch"
            + (f", {x['applied_here']:.0%} applied on the receiver's loop" if x.get("applied_here") else ""))


NOTES_BEGIN, NOTES_END = "<!-- secondary notes: begin -->", "<!-- secondary notes: end -->"


def section(summary: dict, trees, modes, args, t_start: str) -> str:
    """This script's section of RESULTS.md: the medians per mode and tree; the notes block is kept."""
    from results import RESULTS

    begin, end = markers("secondary.py")
    old = RESULTS.read_text() if RESULTS.exists() else ""
    notes = f"{NOTES_BEGIN}\n{NOTES_END}"
    if NOTES_BEGIN in old and NOTES_END in old:
        notes = NOTES_BEGIN + old.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0] + NOTES_END
    l0, l1 = summary["load_before"], summary["load_after"]
    lines = [begin, "## The secondary: its CPU per transaction, the primary's commit rate with it, lag "
             "(`bench/secondary.py`, issues 14 and 27)", "",
             f"Run {t_start}, git {git_state()}, {os.cpu_count()} CPUs; load average {l0[0]:.1f} before, {l1[0]:.1f} "
             f"after (**shared machine**). {args.runs} run(s) per mode and tree, trees alternating, medians; group "
             f"durability, P on CPU {P_CPU}, S on CPU {S_CPU}. Trees: "
             + ", ".join(f"`{lbl}` = `{t}`" for lbl, t in trees) + ".", ""]
    for mode in modes:
        lines.append(f"- **{mode}**: " + "; ".join(f"`{lbl}`: {describe(mode, summary['median'][mode][lbl])}"
                                                   for lbl, _ in trees))
    lines += ["", "Targets (issue 27): ratio with / without S through clients >= 0.85; lag at "
              f"{OFFERED_TX_S:,} tx/s offered p50 < 1 ms, p99 < 10 ms.", "", notes, end]
    return "\n".join(lines)

if __name__ == "__main__":
    main()
