"""What client authentication costs (issue 14): commits and connections through an instance server
with no authentication (the baseline), a password, TLS with a password, and TLS with a client
certificate, in one run.

    .venv/bin/python bench/client_auth.py            # writes its section of bench/RESULTS.md
    .venv/bin/python bench/client_auth.py --quick    # shorter, prints only

Each configuration gets a fresh ``none``-durability instance (the request path alone, no fdatasync to
hide it) served by ``multisite server start`` (a process of its own). Per round and configuration:
``CLIENTS`` client threads in this process commit single-update transactions through
``multisite.connect`` for a few seconds (every request passes the rights check; with TLS it is
encrypted), then one thread opens, authenticates and closes ``CONNECTS`` connections one after
another (a password costs one Argon2id verification; TLS a handshake). The configurations alternate,
``ROUNDS`` times; figures are totals over all rounds, set against the baseline's of the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import multisite
from multisite.instance.users import add_user
from multisite.server.process import start_server, stop_server
from multisite.net.tls import TLSConfig
from multisite.testing.certs import make_test_pki
from results import git_state, markers, write_section

HERE = Path(__file__).resolve().parent
CLIENTS = 4
CONNECTS = 40
ROUNDS = 3
PASSWORD = "bench-password"
console = Console()
if not console.is_terminal:
    console = Console(width=200)

CONFIGS = ("no authentication", "password", "TLS + password", "TLS + client certificate")


def _server(work: Path, pki: dict, config: str) -> tuple[Path, str, dict]:
    root = multisite.create(work / f"S-{time.monotonic_ns()}", name="S", durability="none")
    tls = None
    if config != "no authentication":
        add_user(root, "app", "read-write", PASSWORD)
        add_user(root, "client", "read-write", None)  # the test PKI's client certificate (CN=client)
    if config.startswith("TLS"):
        tls = TLSConfig(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca_cert"]))
    info = start_server(root, "127.0.0.1:0", tls=tls)
    kw: dict = {}
    if config in ("password", "TLS + password"):
        kw = {"user": "app", "password": PASSWORD}
    if config.startswith("TLS"):
        kw["tls_ca"] = str(pki["ca_cert"])
    if config == "TLS + client certificate":
        kw.update(tls_cert=str(pki["client_cert"]), tls_key=str(pki["client_key"]))
    return root, f"127.0.0.1:{info['client_port']}", kw


def one_round(work: Path, pki: dict, config: str, seconds: float, connects: int) -> tuple[int, float, int, float]:
    """(commits, their seconds, connections, their seconds) against a fresh server."""
    root, addr, kw = _server(work, pki, config)
    try:
        multisite.connect(addr, **kw).create_region("acct")
        stop, counts = threading.Event(), [0] * CLIENTS

        def client(t: int) -> None:
            db, i = multisite.connect(addr, **kw), t * 10**9
            while not stop.is_set():
                db.set("acct", ("k", i), i)
                i += 1
                counts[t] += 1
            db.close()

        ths = [threading.Thread(target=client, args=(t,)) for t in range(CLIENTS)]
        for th in ths:
            th.start()
        time.sleep(0.5)  # warm-up
        c0, t0 = sum(counts), time.perf_counter()
        time.sleep(seconds)
        commits, commit_s = sum(counts) - c0, time.perf_counter() - t0
        stop.set()
        for th in ths:
            th.join()
        t0 = time.perf_counter()
        for _ in range(connects):
            db = multisite.connect(addr, **kw)
            db.seqno  # one request after hello: the connection is usable
            db.close()
        return commits, commit_s, connects, time.perf_counter() - t0
    finally:
        stop_server(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s per configuration; print only")
    a = ap.parse_args()
    rounds, seconds, connects = (1, 1.0, 10) if a.quick else (ROUNDS, 4.0, CONNECTS)
    work = HERE / "out" / "client_auth"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pki = make_test_pki(work / "pki")
    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    totals = {c: [0, 0.0, 0, 0.0] for c in CONFIGS}
    try:
        for _ in range(rounds):
            for config in CONFIGS:
                r = one_round(work, pki, config, seconds, connects)
                for i in range(4):
                    totals[config][i] += r[i]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]
    base_c = totals[CONFIGS[0]][0] / totals[CONFIGS[0]][1]
    base_n = totals[CONFIGS[0]][2] / totals[CONFIGS[0]][3]
    rows = []
    for config in CONFIGS:
        commits, cs, conns, ns = totals[config]
        rate, crate = commits / cs, conns / ns
        rows.append((config, f"{rate:,.0f}", f"{rate / base_c:.2f}x", f"{crate:,.0f}", f"{1000 / crate:.1f}",
                     f"{crate / base_n:.2f}x"))
    t = Table(title="client authentication")
    for col in ("server", "commits/s", "ratio", "connections/s", "ms a connection", "ratio"):
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    console.print(f"load average {load_before:.1f} before, {load_after:.1f} after")
    if a.quick:
        return
    lines = [f"| {' | '.join(r)} |" for r in rows]
    begin, end = markers("client_auth.py")
    write_section("client_auth.py", f"""{begin}
## What client authentication costs (`bench/client_auth.py`)

Run {started} UTC on commit {git_state()}: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load_before:.1f} before, {load_after:.1f} after (a shared machine: other engineers' jobs ran too). A `none`-durability instance served by `multisite server start`; {CLIENTS} client threads in this process commit single-update transactions through `multisite.connect` for {seconds:.0f} s, then one thread opens, authenticates, asks once and closes {connects} connections one after another; {rounds} rounds, the configurations alternating, totals over the rounds. Ratios are against "no authentication" in the same run.

| server | commits/s | ratio | connections/s | ms a connection | ratio |
|---|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

No target in issue 14: this measures what the rights check per request (every configuration but the first), TLS per request, and the authentication per connection (an Argon2id verification at 19 MiB, 2 passes; a TLS handshake) cost.

Reproduce: `.venv/bin/python bench/client_auth.py` (`--quick` for a short run that only prints).
{end}""")


if __name__ == "__main__":
    main()
