"""Multi-master document replication between two real document servers, beside PouchDB (issue 12).

    .venv/bin/python bench/multimaster.py            # writes its section of bench/RESULTS.md
    .venv/bin/python bench/multimaster.py --quick    # 10x smaller, prints only

Two workloads, the issue's shapes, each timed from the Replicator's first request to its last reply
(the session time the server reports; the CLI round trip is also printed):

1. **one-shot replication** of 100,000 new small documents (two fields, ~80 bytes): B, a new empty
   replica, pulls them from A (``multisite pull A --on B``);
2. **bidirectional sync with 10,000 conflicting documents**: C and D share 10,000 documents, each
   side then changes every one of them; C runs a pull-push session with D: every document is a
   conflict, the winner goes to the loser's side and the loser becomes a conflict document, which
   goes to the other side too (both end with 20,000 identical documents).

Durably: both databases are in ``fsync`` durability (every applied batch hardened before its bookmark
moves). The peer runs in the same process tree right after: ``bench/pouchdb_baseline.js`` (PouchDB 9
on LevelDB, ``PouchDB.replicate`` and ``db.sync``) with the same shapes, when ``node`` and the
``pouchdb`` package (``POUCHDB_NODE_PATH``, default /tmp/pouch/node_modules) are there; otherwise
the issue's figures for it (4,990 and 2,060 docs/s) are used and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console

from multisite.multimaster.server import docdb
from multisite.multimaster.server.process import call, start_docserver, stop_docserver
from results import git_state, markers, write_section

HERE = Path(__file__).resolve().parent
console = Console()
POUCH_ISSUE = {"oneshot": 4990.0, "sync": 2060.0}
TARGET = {"oneshot": 20000.0, "sync": 8000.0}


def _server(work: Path, name: str, db: Path) -> dict:
    return start_docserver(work / f"srv-{name}", [str(db)], name, "127.0.0.1:0")


def oneshot(work: Path, n: int) -> dict:
    a = docdb.create(work / "A", "Bench", durability="fsync")
    for i in range(0, n, 5000):
        a.create_many([("F", {"n": j, "pad": "x" * 64}) for j in range(i, min(n, i + 5000))])
    rid = a.replica_id
    a.close()
    docdb.create(work / "B", "Bench", replica_id=rid, durability="fsync").close()
    sa = _server(work, "A", work / "A")
    _server(work, "B", work / "B")
    try:
        t = time.perf_counter()
        rep = call(work / "srv-B", "replicate", timeout=600, server=sa["listen"], mode="pull-only")
        wall = time.perf_counter() - t
        assert rep["totals"]["new"] == n, rep["totals"]
        count = call(work / "srv-B", "status")["databases"][0]["changeno"]
        assert count == n, count
    finally:
        stop_docserver(work / "srv-A")
        stop_docserver(work / "srv-B")
    return {"docs": n, "seconds": rep["seconds"], "wall_s": wall, "rate": n / rep["seconds"]}


def sync(work: Path, n: int) -> dict:
    c = docdb.create(work / "C", "Sync", durability="fsync")
    for i in range(0, n, 5000):
        c.create_many([("F", {"v": 0, "pad": "x" * 64}) for _ in range(i, min(n, i + 5000))])
    rid = c.replica_id
    c.close()
    docdb.create(work / "D", "Sync", replica_id=rid, durability="fsync").close()
    with docdb.open(work / "C", durability="none") as c, docdb.open(work / "D", durability="none") as d:
        from multisite.multimaster.session import run_local
        run_local(c, d, "pull-push", server_a="C", server_b="D")  # both hold the same 10,000 documents, and
        # the bookmarks a first session between servers C and D would leave
        for db, val in ((c, "C"), (d, "D")):  # setup, not timed: every document changed on both sides
            db.update_many([(x.unid, {"v": val}) for x in db.documents()])
        c.flush()
        d.flush()
    _server(work, "C", work / "C")
    sd = _server(work, "D", work / "D")
    try:
        t = time.perf_counter()
        rep = call(work / "srv-C", "replicate", timeout=600, server=sd["listen"], mode="pull-push")
        wall = time.perf_counter() - t
        tot = rep["totals"]
        assert tot["conflicts"] == n, tot
        docs_c = call(work / "srv-C", "doc.list", db="Sync")
        docs_d = call(work / "srv-D", "doc.list", db="Sync")
        assert len(docs_c) == len(docs_d) == 2 * n and docs_c == docs_d
    finally:
        stop_docserver(work / "srv-C")
        stop_docserver(work / "srv-D")
    return {"docs": n, "seconds": rep["seconds"], "wall_s": wall, "rate": n / rep["seconds"]}


def pouchdb(work: Path, n_new: int, n_conf: int) -> dict | None:
    node_path = os.environ.get("POUCHDB_NODE_PATH", "/tmp/pouch/node_modules")
    if not shutil.which("node") or not (Path(node_path) / "pouchdb").exists():
        return None
    d = work / "pouch"
    d.mkdir()
    out = subprocess.run(["node", str(HERE / "pouchdb_baseline.js"), str(d), str(n_new), str(n_conf)],
                         env={**os.environ, "NODE_PATH": node_path}, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        console.print(f"[red]PouchDB run failed: {out.stderr[-400:]}")
        return None
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"oneshot": r["oneshot_docs"] / r["oneshot_s"], "sync": r["sync_docs"] / r["sync_s"], "raw": r}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    n_new, n_conf = (10_000, 1_000) if a.quick else (100_000, 10_000)
    runs = 1 if a.quick else a.runs
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ours: dict[str, list[dict]] = {"oneshot": [], "sync": []}
    pouch: list[dict] = []
    for r in range(runs):
        with tempfile.TemporaryDirectory(prefix="mm-bench-") as tmp:
            w = Path(tmp)
            for sub in ("o", "s"):
                (w / sub).mkdir()
            ours["oneshot"].append(oneshot(w / "o", n_new))
            ours["sync"].append(sync(w / "s", n_conf))
            p = pouchdb(w, n_new, n_conf)
            if p:
                pouch.append(p)
        console.print(f"run {r + 1}: one-shot {ours['oneshot'][-1]['rate']:,.0f} docs/s, sync "
                      f"{ours['sync'][-1]['rate']:,.0f} docs/s" + (f"; PouchDB {pouch[-1]['oneshot']:,.0f} / "
                                                                   f"{pouch[-1]['sync']:,.0f}" if pouch else ""))

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    rows = []
    for k, what in (("oneshot", f"one-shot replication, {n_new:,} new docs"),
                    ("sync", f"bidirectional sync, {n_conf:,} conflicting docs")):
        rate = med([x["rate"] for x in ours[k]])
        secs = med([x["seconds"] for x in ours[k]])
        peer = med([p[k] for p in pouch]) if pouch else POUCH_ISSUE[k]
        ratio = rate / peer
        rows.append((what, secs, rate, peer, ratio, rate / TARGET[k] * 4 if not pouch else ratio))
    src = "PouchDB 9.0.0 on LevelDB, same run" if pouch else "PouchDB figures from the issue (not run here)"
    lines = [f"Run {started}, {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip() if shutil.which('node') else '-'}, "
             f"tree {git_state()}, load average at the end {os.getloadavg()[0]:.1f}. Medians of {runs} run(s); "
             f"baseline: {src}.", "",
             "| workload | multisite seconds | multisite docs/s | PouchDB docs/s (this run) | ratio | "
             "PouchDB docs/s (issue) | ratio | target | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (what, secs, rate, peer, ratio, _), k in zip(rows, ("oneshot", "sync")):
        issue_ratio = rate / POUCH_ISSUE[k]
        verdict = "met" if ratio >= 4 and rate >= TARGET[k] else (
            "missed: below the absolute target" if ratio >= 4 else "missed")
        lines.append(f"| {what} | {secs:.2f} | {rate:,.0f} | {peer:,.0f} | {ratio:.2f}x | {POUCH_ISSUE[k]:,.0f} | "
                     f"{issue_ratio:.2f}x | {TARGET[k]:,.0f} | {verdict} |")
    table = "\n".join(lines)
    console.print(table)
    if a.quick:
        return
    begin, end = markers("multimaster.py")
    body = (f"{begin}\n## Multi-master document replication (`bench/multimaster.py`, issue 12)\n\n{table}\n\n"
            f"{NOTES}\n{end}")
    write_section("multimaster.py", body)


NOTES = """Both multisite servers are real processes on 127.0.0.1 (no TLS), their databases in `fsync`
durability; the time is the Replicator's session, from its Hello to the last reply applied and
hardened. The PouchDB figures are `PouchDB.replicate(a, b)` and `c.sync(d)` between two LevelDB
databases in one node process (no network, no HTTP), so the comparison favours the peer."""


if __name__ == "__main__":
    main()
