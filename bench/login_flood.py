"""A client's login time while one address floods the client port (issue 29): idle against flooded, in one run.

    .venv/bin/python bench/login_flood.py            # writes its section of bench/RESULTS.md
    .venv/bin/python bench/login_flood.py --quick    # fewer logins, prints only

An instance server with a user (so every connection must log in: a hello with a password, one Argon2id
verification) is started by ``multisite server start``. A legitimate client in this process logs in
from 127.0.0.2 (``multisite.testing.flood.login``: connect, hello, answer) ``LOGINS`` times
per phase, ``LOGIN_EVERY_S`` apart (a phase outlasts the 5 s login deadline); the phases alternate:

- idle: nothing else connects;
- held: a flooder process (``python -m multisite.testing.flood``) opened ``FLOOD`` connections from
  127.0.0.1 and holds them without a byte, opening none again;
- persistent: the same, and the flooder opens again each connection the server closes (refused at
  accept, closed at the login deadline), up to ``REOPEN_PER_S`` a second.

The figure is the median login time of each flooded phase over the idle one's (issue 29: within 2x).
``ulimit -n`` is raised for this process and its children (the server, the flooder) first.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import multisite
from multisite.instance.users import add_user
from multisite.net import control
from multisite.server.process import start_server, stop_server
from multisite.testing.flood import login
from results import git_state, markers, write_section

HERE = Path(__file__).resolve().parent
FLOOD = 1000
REOPEN_PER_S = 500.0
LOGINS = 40
LOGIN_EVERY_S = 0.15  # between a client's logins: a phase then spans the login deadline (5 s)
ROUNDS = 3
PASSWORD = "bench-password"
TARGET_RATIO = 2.0
FDS = 8192  # file descriptors wanted (the flooder holds FLOOD sockets)
console = Console()
if not console.is_terminal:
    console = Console(width=200)


def raise_fd_limit(want: int = FDS) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def logins(addr: str, n: int, every_s: float = LOGIN_EVERY_S) -> list[float]:
    out = []
    for _ in range(n):
        out.append(login(addr, "app", PASSWORD, source="127.0.0.2"))
        time.sleep(every_s)
    return out


def flooded(addr: str, n: int, reopen_per_s: float) -> tuple[list[float], str]:
    """Login times while a flooder process holds FLOOD connections; and its last report."""
    proc = subprocess.Popen([sys.executable, "-m", "multisite.testing.flood", addr, "--connections", str(FLOOD),
                             "--source", "127.0.0.1", "--reopen-per-s", str(reopen_per_s)],
                            stdout=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("ready"):
            raise SystemExit(f"the flooder did not start: {ready!r}")
        time.sleep(1.0)  # the server has refused what it refuses; the held ones wait for their deadline
        times = logins(addr, n)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    last = (out.strip().splitlines() or [ready.strip()])[-1]
    return times, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 10 logins a phase; print only")
    a = ap.parse_args()
    rounds, n = (1, 10) if a.quick else (ROUNDS, LOGINS)
    fds = raise_fd_limit()
    work = HERE / "out" / "login_flood"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    root = multisite.create(work / "A", name="A", durability="none")
    add_user(root, "app", "read-write", PASSWORD)
    info = start_server(root, "127.0.0.1:0")
    addr = f"127.0.0.1:{info['client_port']}"
    phases: dict[str, list[float]] = {"idle": [], "held": [], "persistent": []}
    flooder: dict[str, str] = {}
    try:
        logins(addr, 5, 0.0)  # warm-up
        for _ in range(rounds):
            phases["idle"] += logins(addr, n)
            times, flooder["held"] = flooded(addr, n, 0.0)
            phases["held"] += times
            times, flooder["persistent"] = flooded(addr, n, REOPEN_PER_S)
            phases["persistent"] += times
        adm = control.call(root, "status")["client_auth"]["admission"]
    finally:
        stop_server(root)
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]
    idle = statistics.median(phases["idle"])
    what = {"idle": "idle server",
            "held": f"{FLOOD:,} connections held from 127.0.0.1",
            "persistent": f"{FLOOD:,} held from 127.0.0.1, reopened up to {REOPEN_PER_S:.0f}/s as closed"}
    rows = []
    for phase, ts in phases.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=20, method="inclusive")
        rows.append((what[phase], f"{len(ts)}", f"{med * 1000:.1f}", f"{q[18] * 1000:.1f}", f"{max(ts) * 1000:.1f}",
                     f"{med / idle:.2f}x"))
    ratio = max(statistics.median(phases[p]) for p in ("held", "persistent")) / idle
    t = Table(title="a client's login time (127.0.0.2) while 127.0.0.1 floods")
    for col in ("server", "logins", "median ms", "p95 ms", "max ms", "vs idle"):
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    console.print(f"flooder's last report: {flooder}")
    console.print(f"server's admission counts: {adm}")
    console.print(f"worst flooded/idle: {ratio:.2f}x (target {TARGET_RATIO:g}x); load average {load_before:.1f} "
                  f"before, {load_after:.1f} after; ulimit -n {fds}")
    if a.quick:
        return
    lines = [f"| {' | '.join(r)} |" for r in rows]
    lim = adm["limits"]
    begin, end = markers("login_flood.py")
    write_section("login_flood.py", f"""{begin}
## A client's login while one address floods the client port (`bench/login_flood.py`, issue 29)

Run {started} UTC on commit {git_state()}: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load_before:.1f} before, {load_after:.1f} after (a shared machine). One instance server with a user (every connection must log in: a hello with a password, one Argon2id verification); a client in the bench's process logs in from 127.0.0.2 (connect, hello, answer) {n} times a phase, {LOGIN_EVERY_S:g} s apart (a phase outlasts the login deadline); a flooder process opens {FLOOD:,} connections from 127.0.0.1 and says nothing on them; {rounds} rounds, the phases alternating. `ulimit -n` raised to {fds}.

| server | logins | median ms | p95 ms | max ms | vs idle |
|---|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

Target (issue 29): a legitimate client's login time with 1,000 unauthenticated connections held from one address within {TARGET_RATIO:g}x of its time on an idle server: **{'met' if ratio <= TARGET_RATIO else 'not met'}** (worst flooded phase {ratio:.2f}x).

The limits (`protocol/admission.py`): {lim['unauthenticated_per_address_max']} connections not logged in per address, {lim['unauthenticated_total_max']} in all, {lim['connections_max']} connections, {lim['login_deadline_s']:g} s to log in. The server's counts at the end: {adm['refused']['per_address']:,} refused at accept for the address's share, {adm['timeouts']:,} closed at the login deadline, {adm['evicted']} evicted, {adm['logins']:,} logins. Before the admission gate the same flood took all 256 connection slots, each for up to 30 s: the client was refused at accept (no login time at all) until the flood's connections timed out.

Reproduce: `.venv/bin/python bench/login_flood.py` (`--quick` for a short run that only prints).
{end}""")


if __name__ == "__main__":
    main()
