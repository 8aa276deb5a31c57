"""The HA manager's process: ``multisite ha start DIR ...`` runs ``python -m multisite.ha.process``.

The process manages the instance server of DIR through its control socket (it must be running; ``ha
start`` starts it first when it is not), logs to ``DIR/log/ha.log`` and writes ``DIR/run/ha.json``
(its pid and settings) once it has joined the cluster. SIGTERM (``ha stop``) gives the leader key up
before exiting, so a planned stop does not wait for the lease.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError, MultisiteError, ServerError
from ..fsutil import atomic_write
from ..net.process import wait_exit
from ..net.tls import parse_hostport
from .coordinator import Coordinator, parse_urls
from .manager import HAConfig, HAManager, InstanceHandle

HA_START_TIMEOUT_S = 30.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_file(root: Path) -> Path:
    return Path(root) / "run" / "ha.json"


def start_ha(root: Path, cluster: str, etcd: str, *, ttl_s: float = 1.0, min_confirm: int = 0,
             replication: str | None = None, advertise: str | None = None) -> dict:
    """Spawn the manager for the (running) instance server of ``root``; its run info once it joined.
    ``advertise``: the host the other members and the clients reach this one at (published with the
    client port; default: the host the server listens on, if it names one, else 127.0.0.1);
    ``replication``: where the receiver listens (default: that host, any port)."""
    root = Path(root).absolute()
    parse_urls(etcd)
    if advertise is not None:
        parse_hostport(f"{advertise}:0")
    replication = replication or f"{advertise or '127.0.0.1'}:0"
    parse_hostport(replication)
    if not ttl_s >= 1:
        raise ConfigError(f"--ttl: etcd leases are whole seconds, at least 1; got {ttl_s}")
    if min_confirm < 0:
        raise ConfigError(f"--min-confirm: 0 or more secondaries, got {min_confirm}")
    rf = run_file(root)
    if rf.exists():
        info = json.loads(rf.read_text())
        if _alive(info.get("pid", 0)):
            raise ServerError(f"an HA manager already runs for {root} (pid {info['pid']}): ha stop {root} first")
        rf.unlink()
    cmd = [sys.executable, "-m", "multisite.ha.process", str(root), "--cluster", cluster, "--etcd", etcd,
           "--ttl", str(ttl_s), "--min-confirm", str(min_confirm), "--replication", replication]
    cmd += ["--advertise", advertise] if advertise else []
    (root / "log").mkdir(exist_ok=True)
    with open(root / "log" / "ha.out", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HA_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (root / "log" / "ha.out").read_text(errors="replace").strip().splitlines()[-3:]
            raise ServerError(f"the HA manager for {root} exited at start: " + " | ".join(tail))
        if rf.exists():
            return json.loads(rf.read_text())
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"the HA manager for {root} did not join {cluster!r} within {HA_START_TIMEOUT_S:.0f} s")


def stop_ha(root: Path, timeout_s: float = 10.0) -> int | None:
    """SIGTERM the manager of ``root`` (it gives the key up) and wait; its pid, None if none ran."""
    rf = run_file(Path(root).absolute())
    if not rf.exists():
        return None
    pid = json.loads(rf.read_text())["pid"]
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        wait_exit(pid, timeout_s)
    rf.unlink(missing_ok=True)
    return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _listen_host(root: Path) -> str:
    """The host the instance server's client port listens on, when it names one; else 127.0.0.1."""
    try:
        listen = json.loads((root / "run" / "server.json").read_text()).get("listen") or ""
        host = parse_hostport(listen)[0] if listen else ""
    except (OSError, ValueError, MultisiteError):
        host = ""
    return host if host not in ("", "0.0.0.0", "::", "*") else "127.0.0.1"


async def _main(root: Path, cfg: HAConfig) -> None:
    log = logging.getLogger("multisite.ha")
    inst = InstanceHandle(root)
    await inst.refresh()
    cfg.client_address = cfg.client_address or f"{cfg.advertise or _listen_host(root)}:{inst.state['client_port']}"
    coord = Coordinator(cfg.cluster, cfg.etcd, inst.state["name"], cfg.ttl_s)
    mgr = HAManager(inst, cfg, coord, log)
    await mgr.start()
    atomic_write(run_file(root), json.dumps({"pid": os.getpid(), "cluster": cfg.cluster, "etcd": cfg.etcd,
                                             "ttl_s": cfg.ttl_s, "min_confirm": cfg.min_confirm,
                                             "replication": mgr.replication}).encode())
    log.info("ha: %s joined cluster %s (etcd %s, ttl %g s, min-confirm %d)", mgr.name, cfg.cluster,
             ",".join(cfg.etcd), cfg.ttl_s, cfg.min_confirm)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = loop.create_task(mgr.run())
    await stop.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await mgr.stop()
    log.info("ha: %s left cluster %s", mgr.name, cfg.cluster)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m multisite.ha.process")
    ap.add_argument("dir")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--min-confirm", type=int, default=0)
    ap.add_argument("--replication", default="127.0.0.1:0")
    ap.add_argument("--advertise", default="")
    a = ap.parse_args(argv)
    root = Path(a.dir).absolute()
    (root / "log").mkdir(exist_ok=True)
    h = logging.FileHandler(root / "log" / "ha.log")
    h.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger("multisite").addHandler(h)
    logging.getLogger("multisite").setLevel(logging.INFO)
    cfg = HAConfig(a.cluster, parse_urls(a.etcd), a.ttl, a.min_confirm, a.replication, advertise=a.advertise)
    try:
        asyncio.run(_main(root, cfg))
    except MultisiteError as e:
        logging.getLogger("multisite.ha").error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
