"""``multisite server start|stop|status``: the process that owns an instance."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from ..errors import ConfigError, ServerError
from ..instance.layout import Layout
from ..net import control
from ..net.affinity import parse_cpus
from ..net.clients import KEEPALIVE_S, check_keepalive
from ..net.tls import parse_hostport
from .output import console, print_json, table

SERVER_START_TIMEOUT_S = 60.0


def start_server(root: Path, listen: str | None, cpus: str | None = None, keepalive: int | None = None) -> dict:
    """Spawn the instance server for ``root`` and wait until it answers; returns its run info."""
    lay = Layout.existing(root)
    if control.is_running(lay.root):
        raise ServerError(f"an instance server for {lay.root} is already running")
    if cpus:
        parse_cpus(cpus)  # a wrong value is an error here, not only in the server's log
    if listen:
        parse_hostport(listen)  # likewise
    if keepalive is not None:
        check_keepalive(keepalive)
    out = open(lay.log / "server.out", "ab")
    cmd = [sys.executable, "-m", "multisite.net.server", str(lay.root)] + (["--listen", listen] if listen else [])
    cmd += ["--cpus", cpus] if cpus else []
    cmd += ["--keepalive", str(keepalive)] if keepalive is not None else []
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (lay.log / "server.out").read_text(errors="replace").strip().splitlines()[-3:]
            raise ServerError(f"the instance server for {lay.root} exited at start (status {proc.returncode}): "
                              + " | ".join(tail))
        if control.is_running(lay.root):
            info = json.loads((lay.run / "server.json").read_text())
            if info.get("pid") == proc.pid:  # written before the control socket opened: this server's
                return info
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"the instance server for {lay.root} did not answer within {SERVER_START_TIMEOUT_S:.0f} s")


def stop_server(root: Path, timeout: float = 10.0) -> int:
    if not (math.isfinite(timeout) and timeout >= 0):  # nan, inf: a traceback from settimeout, server left up
        raise ConfigError(f"--timeout takes a number of seconds, 0 or more, got {timeout}")
    lay = Layout.existing(root)
    pid = control.call(lay.root, "ping")["pid"]
    control.call(lay.root, "shutdown", timeout=timeout + 5, timeout_s=timeout)  # socket timeout, flush bound
    deadline = time.monotonic() + timeout + 10
    while time.monotonic() < deadline:
        if _exited(pid):
            return pid
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return pid


def _exited(pid: int) -> bool:
    """True once ``pid`` is gone. A server started by this process (tests, the demo) stays a zombie,
    which ``kill(pid, 0)`` still reaches, until it is reaped here."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@click.group()
def server() -> None:
    """Run the process that owns an instance (engine, journal pool, replication servers)."""


@server.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--listen", default=None, help="HOST:PORT for application clients (multisite.connect).")
@click.option("--cpus", default=None,
              help="Run the server on these CPUs only, e.g. 0 or 0-1 (group commit under load gains ~30% "
                   "from one CPU: its threads wake each other faster).")
@click.option("--keepalive", type=int, default=KEEPALIVE_S, show_default=True,
              help="Seconds a client may stay silent before the server probes it; a client whose host or "
                   "network is gone answers no probe and is dropped about twice as late, freeing its connection.")
def start_cmd(dir: str, listen: str | None, cpus: str | None, keepalive: int) -> None:
    """Start the instance server; returns once it answers.

    Example: multisite server start /data/A --listen 127.0.0.1:7000 --cpus 0
    """
    info = start_server(Path(dir), listen, cpus, keepalive)
    console.print(f"instance server started: pid {info['pid']}, log {info['log']}"
                  + (f", clients on port {info['client_port']}" if info.get("client_port") else "")
                  + (f", CPUs {','.join(map(str, info['cpus']))}" if cpus else ""))


@server.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--timeout", type=float, default=10.0, show_default=True,
              help="Seconds for source servers to send what is pending before the server exits.")
def stop_cmd(dir: str, timeout: float) -> None:
    """Stop the instance server (sources first send what they can within --timeout).

    Example: multisite server stop /data/A --timeout 30
    """
    pid = stop_server(Path(dir), timeout)
    console.print(f"instance server pid {pid} stopped; log {Path(dir).absolute() / 'log' / 'server.log'}")


@click.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def status_cmd(dir: str, as_json: bool) -> None:
    """Status of an instance server and all its components.

    Example: multisite status /data/A --json
    """
    st = control.call(Layout.existing(dir).root, "status")
    if as_json:
        print_json(st)
        return
    table(f"instance {st['name']}", ["pid", "role", "seqno", "durability", "CPUs", "journal pool", "update process",
                                     "clients"],
          [(st["pid"], st["role"], st["seqno"], st["durability"], _cpu_list(st["cpus"]),
            f"{st['pool']['first_seqno']}..{st['pool']['last_seqno']}", st["update"]["state"],
            st.get("clients", 0) if st.get("client_port") else "-")])
    if st["sources"]:
        table("source servers", ["secondary", "state", "mode", "last sent", "confirmed", "backlog", "reading"],
              [(n, s["state"], s["mode"], s["last_sent"], s["last_confirmed"], s["backlog"], s["reading_from"])
               for n, s in st["sources"].items()])
    if st["receiver"]:
        r = st["receiver"]
        table("receiver server", ["state", "source", "listen", "received", "applied", "backlog"],
              [(r["state"], r["source"], r["listen"], r["received_seqno"], r["seqno"], r["backlog"])])


def _cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def register(cli: click.Group) -> None:
    cli.add_command(server)
    cli.add_command(status_cmd)
