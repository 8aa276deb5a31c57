"""Starting and stopping an instance server process (``python -m multisite.server.instance``).

Used by ``multisite server start|stop``, the test harnesses and the benches alike: the server is a
process of its own, started in a new session so that a terminal's signals do not reach it, and
ready once its control socket answers with its own pid.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError, ServerError
from ..fsutil import create_file
from ..instance.layout import Layout
from ..net import control
from ..net.process import wait_exit
from ..net.affinity import parse_cpus
from .sockets import check_keepalive
from ..instance.users import load_users
from ..protocol.auth import check_listen
from ..net.tls import TLSConfig, parse_hostport

SERVER_START_TIMEOUT_S = 60.0


def start_server(root: Path, listen: str | None, cpus: str | None = None, keepalive: int | None = None,
                 metrics: str | None = None, *, tls: TLSConfig | None = None, insecure: bool = False) -> dict:
    """Spawn the instance server for ``root`` and wait until it answers; returns its run info. ``tls``
    and ``insecure`` are the client port's (``server.client_auth``); ``metrics`` serves /metrics."""
    lay = Layout.existing(root)
    if control.is_running(lay.root):
        raise ServerError(f"an instance server for {lay.root} is already running")
    if cpus:
        parse_cpus(cpus)  # a wrong value is an error here, not only in the server's log
    if listen:  # likewise, and a port open to other hosts without users is refused here (check_listen)
        check_listen(parse_hostport(listen)[0], len(load_users(lay.root)), insecure)
    if tls:
        tls.server_context()  # unreadable files: an error here
    if keepalive is not None:
        check_keepalive(keepalive)
    if metrics:
        parse_hostport(metrics)
    out = open(create_file(lay.log / "server.out"), "ab")
    cmd = [sys.executable, "-m", "multisite.server.instance", str(lay.root)] + (["--listen", listen] if listen else [])
    cmd += ["--cpus", cpus] if cpus else []
    cmd += ["--keepalive", str(keepalive)] if keepalive is not None else []
    cmd += ["--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca] if tls else []
    cmd += ["--insecure"] if insecure else []
    cmd += ["--metrics", metrics] if metrics else []
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
    ping = control.call(lay.root, "ping")
    pid = ping["pid"]
    control.call(lay.root, "shutdown", timeout=timeout + 5, timeout_s=timeout)  # socket timeout, flush bound
    if ping.get("in_process"):  # multisite.serve: the pid is the application's, which goes on
        return _wait_unserved(lay, pid, timeout + 10)
    return wait_exit(pid, timeout + 10)


def _wait_unserved(lay: Layout, pid: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for an in-process server told to shut down to close the instance
    (its last step removes the run file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (lay.run / "server.json").exists():
            return pid
        time.sleep(0.05)
    raise ServerError(f"the instance server of {lay.root}, served inside process {pid}, did not stop within "
                      f"{timeout:.0f} s; that process is an application's and was left running")
