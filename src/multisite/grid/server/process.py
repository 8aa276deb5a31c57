"""Starting and stopping the grid's catalog and container processes, and asking a catalog its status.

Like ``process.py`` for the instance server: each process runs in a new session (a terminal's
signals do not reach it), logs under its DIR, and is ready once its control socket (named after DIR)
answers with its own pid. A container is ready once the catalog has accepted it; a container the
catalog refuses exits, and ``start_container`` raises with the refusal from its log.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from ...errors import AuthenticationFailed, ConfigError, PermissionDenied, ServerError, WrongGrid
from ..policy import load_policy
from ..routing import RouteTable
from ..wire import NEED_DATA, GridWire, Operate, Refused, RouteRequest, Routes, Side, Status, StatusRequest
from ...net import control
from .container import IDENTITY_FILE, REFUSED_FILE
from ...net.process import wait_exit
from ...net.tls import TLSConfig, parse_hostport
from ...instance.users import load_users
from ..access import check_listen
from .client import REFUSALS, open_socket, refusal
from ...ha.etcd_client import parse_urls

START_TIMEOUT_S = 30.0
REGISTER_TIMEOUT_S = 15.0  # a container waits this long for the catalog before start returns without it
STATUS_TIMEOUT_S = 10.0


def _spawn(root: Path, module: str, args: list[str], what: str) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    (root / "log").mkdir(exist_ok=True)
    if _running(root):
        raise ServerError(f"a {what} is already running in {root}")
    out = open(root / "log" / f"{what}.out", "ab")
    return subprocess.Popen([sys.executable, "-m", module, str(root), *args], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _running(root: Path) -> bool:
    return control.is_running(root)


def _tail(root: Path, what: str) -> str:
    lines = []
    for f in (f"{what}.out", f"{what}.log"):
        p = root / "log" / f
        if p.exists():
            lines += [ln for ln in p.read_text(errors="replace").splitlines() if "error" in ln.lower()]
    return lines[-1] if lines else "(no error in its log)"


def _wait_ready(proc: subprocess.Popen, root: Path, what: str) -> dict:
    """The run file of the started process ``proc`` once it answers; ServerError with its log's last error
    if it exits first. A refused process answers for a moment while it stops and has removed its run file
    (or not finished writing it): the next pass sees it exit."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"the {what} in {root} exited at start (status {proc.returncode}): {_tail(root, what)}")
        if _running(root):
            try:
                info = json.loads((root / "run" / f"{what}.json").read_text())
            except (FileNotFoundError, ValueError):
                info = {}
            if info.get("pid") == proc.pid:
                return info
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"the {what} in {root} did not answer within {START_TIMEOUT_S:.0f} s")


def _security_args(root: Path, listen: str, tls: TLSConfig | None, users: Path | None, insecure: bool) -> list[str]:
    """The TLS and users options of a grid process, checked here first (a clear error before spawning)."""
    check_listen(parse_hostport(listen)[0], tls is not None, len(load_users(users or root)), insecure)
    out = [] if tls is None else ["--tls-cert", str(Path(tls.cert).absolute()), "--tls-key",
                                  str(Path(tls.key).absolute()), "--tls-ca", str(Path(tls.ca).absolute())]
    out += ["--users", str(Path(users).absolute())] if users else []
    return out + (["--insecure"] if insecure else [])


def start_catalog(root: Path, grid: Path, listen: str, heartbeat_timeout_s: float, metrics: str | None = None,
                  *, etcd: str | None = None, name: str | None = None, lease_ttl_s: float | None = None,
                  tls: TLSConfig | None = None, users: Path | None = None, insecure: bool = False) -> dict:
    """Spawn the catalog for ``grid`` (a grid.toml) keeping its state in ``root`` (with ``etcd``: in
    etcd, as one of the grid's catalogs, named ``name``); returns its run info. ``tls``, ``users`` (the
    directory of the grid's users.json, default ``root``) and ``insecure``: ``grid/access.py``."""
    parse_hostport(listen)
    sec = _security_args(Path(root).absolute(), listen, tls, users, insecure)
    if etcd:
        parse_urls(etcd)
    if name and not etcd:
        raise ConfigError("--name names one of several catalogs: it needs --etcd")
    if not heartbeat_timeout_s > 0:
        raise ConfigError(f"--heartbeat-timeout takes seconds, more than 0, got {heartbeat_timeout_s}")
    load_policy(grid)  # a wrong policy is an error here, with its key, not only in the catalog's log
    if metrics:
        parse_hostport(metrics)
    proc = _spawn(Path(root).absolute(), "multisite.grid.server.catalog",
                  ["--grid", str(Path(grid).absolute()), "--listen", listen,
                   "--heartbeat-timeout", str(heartbeat_timeout_s)]
                  + (["--metrics", metrics] if metrics else [])
                  + (["--etcd", etcd] if etcd else []) + (["--name", name] if name else [])
                  + (["--lease-ttl", str(lease_ttl_s)] if lease_ttl_s else []) + sec, "catalog")
    return _wait_ready(proc, Path(root).absolute(), "catalog")


def start_container(root: Path, catalog: str | None, listen: str, zone: str | None = None, name: str | None = None,
                    grid: str | None = None, checkpoint_after: int | None = None,
                    advertise: str | None = None, metrics: str | None = None, *, etcd: str | None = None,
                    lease_ttl_s: float | None = None, tls: TLSConfig | None = None, users: Path | None = None,
                    insecure: bool = False) -> dict:
    """Spawn a container; returns its status once the catalog accepted it (``registered`` False if the
    catalog did not answer within REGISTER_TIMEOUT_S: it keeps trying). ``catalog`` may list several
    addresses; with ``etcd`` the container registers in etcd instead (``grid`` is then needed the
    first time)."""
    if not catalog and not etcd:
        raise ConfigError("a container needs --catalog HOST:PORT[,HOST:PORT...] or --etcd URLS")
    for c in _addresses(catalog or ""):
        parse_hostport(c)
    if etcd:
        parse_urls(etcd)
    parse_hostport(listen)
    root = Path(root).absolute()
    if etcd and not grid and not _known_grid(root):
        raise ConfigError(f"a new container with --etcd needs --grid NAME: the grid whose keys it joins in etcd "
                          f"({root} has joined none yet)")
    args = (["--catalog", catalog] if catalog else []) + ["--listen", listen]
    args += _security_args(root, listen, tls, users, insecure)
    args += ["--etcd", etcd] if etcd else []
    args += ["--lease-ttl", str(lease_ttl_s)] if lease_ttl_s else []
    args += ["--zone", zone] if zone else []
    args += ["--name", name] if name else []
    args += ["--grid", grid] if grid else []
    args += ["--checkpoint-after", str(checkpoint_after)] if checkpoint_after is not None else []
    args += ["--advertise", advertise] if advertise else []
    if metrics:
        parse_hostport(metrics)
        args += ["--metrics", metrics]
    refused_file = root / "run" / REFUSED_FILE
    refused_file.unlink(missing_ok=True)
    proc = _spawn(root, "multisite.grid.server.container", args, "container")
    try:
        _wait_ready(proc, root, "container")
    except ServerError:
        _raise_refused(refused_file, catalog, root)  # refused before its control socket answered
        raise
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            st = control.call(root, "status", timeout=5)
        except ServerError:
            st = None
        if st and st["registered"]:
            return st
        if proc.poll() is not None or (st and st["refused"]):
            proc.wait(timeout=10)
            _raise_refused(refused_file, catalog, root)
            raise ServerError(f"the container in {root} exited (status {proc.returncode}): {_tail(root, 'container')}")
        time.sleep(0.05)
    return st or {"registered": False}


def _known_grid(root: Path) -> str | None:
    try:
        return json.loads((root / IDENTITY_FILE).read_text()).get("grid") or None
    except (OSError, ValueError):
        return None


def _raise_refused(refused_file: Path, catalog: str, root: Path) -> None:
    if refused_file.exists():
        r = json.loads(refused_file.read_text())
        cls = WrongGrid if r["code"] == WrongGrid.code else ServerError
        by = f"the catalog {catalog}" if catalog else "etcd"
        raise cls(f"{by} refused the container in {root}: {r['code']}: {r['message']}")


def stop_process(root: Path, what: str, timeout: float = 10.0) -> int:
    """Stop the catalog or container running in ``root``; returns its pid."""
    root = Path(root).absolute()
    try:
        pid = control.call(root, "ping", timeout=5)["pid"]
    except ServerError:
        raise ServerError(f"no {what} is running in {root}; start one with `multisite {what} start`") from None
    control.call(root, "shutdown", timeout=timeout)
    return wait_exit(pid, timeout)


def catalog_status(catalog: str, timeout: float = STATUS_TIMEOUT_S, *, tls: ssl.SSLContext | None = None,
                   user: str | None = None, password: str | None = None) -> dict:
    """Ask the catalog at ``catalog`` (HOST:PORT, or several: the first that answers) its status over
    the grid wire; ``answered_by`` says which. ``tls`` (``server.client.client_tls_context``), ``user``
    and ``password``: on a grid with TLS and users."""
    addr, msg = _ask_any(catalog, StatusRequest(user, password), Status, timeout, tls)
    return {**json.loads(msg.json), "answered_by": addr}


def catalog_routes(catalog: str, timeout: float = STATUS_TIMEOUT_S, *, tls: ssl.SSLContext | None = None,
                   user: str | None = None, password: str | None = None) -> RouteTable:
    """The catalog's route table: each partition's primary address (None while it is down) and epoch."""
    return RouteTable.from_dict(json.loads(_ask_any(catalog, RouteRequest(user, password), Routes, timeout,
                                                    tls)[1].json))


def catalog_operate(catalog: str, op: str, args: dict, timeout: float = STATUS_TIMEOUT_S, *,
                    tls: ssl.SSLContext | None = None, user: str | None = None,
                    password: str | None = None) -> dict:
    """An operator's request (``drain``, ``promote``) to whichever catalog of the list leads; its answer
    (``message``: what was done, or the warning of a forced promotion)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while True:
        for addr in _addresses(catalog):
            try:
                return json.loads(_ask(addr, Operate(op, args, user, password), Status, timeout, tls).json)
            except ServerError as e:
                text = str(e)
                if "BAD_REQUEST" in text:
                    raise ConfigError(text.split("BAD_REQUEST: ", 1)[-1]) from None
                seen[addr] = text
        if time.monotonic() > deadline:
            raise ServerError("no catalog carried the operation out: " + "; ".join(f"{a}: {t}" for a, t in seen.items()))
        time.sleep(0.3)


def _addresses(catalogs: str) -> list[str]:
    return [c.strip() for c in catalogs.split(",") if c.strip()]


def _ask_any(catalogs: str, request, reply_type: type, timeout: float, tls: ssl.SSLContext | None = None):
    """``(address, answer)`` of the first catalog of the list that answers; the errors of all otherwise."""
    addrs = _addresses(catalogs)
    if not addrs:
        raise ConfigError("give the catalog as HOST:PORT[,HOST:PORT...]")
    errors = []
    for addr in addrs:
        try:
            return addr, _ask(addr, request, reply_type, timeout if len(addrs) == 1 else min(timeout, 3.0), tls)
        except (AuthenticationFailed, PermissionDenied):
            raise
        except ServerError as e:
            if len(addrs) == 1:
                raise
            errors.append(str(e))
    raise ServerError("no catalog answered: " + "; ".join(errors))


def _ask(catalog: str, request, reply_type: type, timeout: float, tls: ssl.SSLContext | None = None):
    wire = GridWire(Side.MEMBER)
    try:
        with open_socket(catalog, timeout, tls) as s:
            s.sendall(wire.send(request))
            while True:
                ev = wire.next_event()
                if ev is NEED_DATA:
                    wire.receive_data(s.recv(65536))
                    continue
                if isinstance(ev, reply_type):
                    return ev
                if isinstance(ev, Refused) and ev.code in REFUSALS:
                    raise refusal(ev.code, f"the catalog at {catalog}: {ev.message}")
                if isinstance(ev, Refused):
                    raise ServerError(f"the catalog at {catalog} refused: {ev.code}: {ev.message}")
                raise ServerError(f"the catalog at {catalog} closed the connection without an answer")
    except socket.timeout:
        raise ServerError(f"the catalog at {catalog} did not answer within {timeout:.0f} s") from None
    except ssl.SSLError as e:  # the handshake, or (TLS 1.3) the catalog's verdict on our certificate after it
        raise AuthenticationFailed(f"TLS with the catalog at {catalog} failed: {e.reason or e} (give the grid's CA "
                                   f"with --tls-ca, and a certificate it signed)") from None
    except OSError as e:
        raise ServerError(f"cannot reach the catalog at {catalog}: {e.strerror or e}; is it started "
                          f"(`multisite catalog start`)?") from None
