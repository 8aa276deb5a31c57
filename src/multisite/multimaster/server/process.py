"""Starting, stopping and asking a document server (``multisite docserver``, the console verbs).

Like ``grid_process.py``: the server runs in a new session, logs under its HOME, and is ready once
its control socket (named after HOME) answers with its own pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...errors import ConfigError, ServerError
from ...fsutil import atomic_write, check_not_world_writable, create_file, make_dir, make_root
from ...net import control
from ...net.process import wait_exit
from ...net.tls import parse_hostport
from .. import couch_cors

START_TIMEOUT_S = 30.0
PEERS_FILE = "peers.json"  # in run/: the --peer names it was started with, for the console verbs to check


def resolve_peer(server: str, peers: dict[str, str], where: str) -> str:
    """The address of ``server``: a --peer name's, or ``server`` itself when it is HOST:PORT; a name
    the server does not know is a ConfigError listing those it knows."""
    if server in peers:
        return peers[server]
    try:
        parse_hostport(server)
    except ConfigError:
        known = ", ".join(f"{n} ({a})" for n, a in sorted(peers.items())) or "none"
        raise ConfigError(f"{server!r} is not a known peer of the document server {where} (its peers: {known}); "
                          f"give a peer's name or HOST:PORT, or start the server with --peer {server}=HOST:PORT"
                          ) from None
    return server


def known_peers(home: Path) -> dict[str, str] | None:
    """The --peer names the document server of ``home`` was started with (None: not recorded)."""
    try:
        return json.loads((Path(home).absolute() / "run" / PEERS_FILE).read_text())
    except (OSError, ValueError):
        return None


def start_docserver(home: Path, dirs: list[str], name: str, listen: str, *, replicators: int = 1,
                    peers: dict[str, str] | None = None, address_book: str | None = None,
                    tls: dict[str, str] | None = None, metrics: str | None = None,
                    couch_listen: str | None = None, couch_cors_origins: Iterable[str] = ()) -> dict:
    """Spawn a document server serving ``dirs``; returns its run info once it answers."""
    parse_hostport(listen)
    if not dirs and not address_book:
        raise ConfigError("a document server serves at least one database directory")
    if replicators < 1:
        raise ConfigError(f"--replicators must be 1 or more, got {replicators}")
    from .docdb import read_identity
    for d in dirs + ([address_book] if address_book else []):
        read_identity(d)  # not a document database: an error here, naming it
    home = Path(home).absolute()
    if not home.exists():
        make_root(home)  # 0700: its run/ holds the address book's state, its log/ what peers sent
    check_not_world_writable(home, "document server home")
    for sub in ("log", "run"):
        make_dir(home / sub)
    if control.is_running(home):
        raise ServerError(f"a document server is already running with home {home}")
    cmd = [sys.executable, "-m", "multisite.multimaster.server.docserver", str(home), *[str(Path(d).absolute()) for d in dirs],
           "--name", name, "--listen", listen, "--replicators", str(replicators)]
    for n, a in (peers or {}).items():
        cmd += ["--peer", f"{n}={a}"]
    if address_book:
        cmd += ["--address-book", str(Path(address_book).absolute())]
    for k, v in (tls or {}).items():
        if v is True:
            cmd += [f"--tls-{k.replace('_', '-')}"]
        elif v:
            cmd += [f"--tls-{k.replace('_', '-')}", str(v)]
    if metrics:
        parse_hostport(metrics)
        cmd += ["--metrics", metrics]
    if couch_listen:  # CouchDB's replication protocol over HTTP (couch_http.py)
        parse_hostport(couch_listen)
        cmd += ["--couch-listen", couch_listen]
    origins = couch_cors.parse_origins(couch_cors_origins)  # a malformed one: ConfigError here
    if origins and not couch_listen:
        raise ConfigError(f"{couch_cors.OPTION} is for the CouchDB endpoints: give --couch-listen HOST:PORT too")
    for origin in sorted(origins):
        cmd += [couch_cors.OPTION, origin]
    for a in (peers or {}).values():
        parse_hostport(a)  # a wrong address is an error here, naming it, not in the server's log
    atomic_write(home / "run" / PEERS_FILE, json.dumps(peers or {}).encode())
    out = open(create_file(home / "log" / "docserver.out"), "ab")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return _started(proc, home, name)


def _started(proc: subprocess.Popen, home: Path, name: str) -> dict:
    """The run info of the document server ``proc`` once it answers on its control socket; its
    start-up error (from ``docserver.out``) if it exits first, or a timeout after START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = (home / "log" / "docserver.out").read_text(errors="replace").strip().splitlines()
            err = [ln for ln in lines if "error" in ln.lower()] or lines[-1:]
            raise ServerError(f"the document server {name} exited at start (status {proc.returncode}): "
                              f"{err[-1] if err else '(no output)'}")
        if control.is_running(home):
            info = json.loads((home / "run" / "docserver.json").read_text())
            if info.get("pid") == proc.pid:
                info["process"] = proc
                return info
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"the document server {name} did not answer within {START_TIMEOUT_S:.0f} s")


def call(home: Path, op: str, timeout: float = control.CONTROL_TIMEOUT_S, **args: Any) -> Any:
    """One control request to the document server whose home is ``home`` (its errors name the document
    server: one that exits mid-session is not "the instance server")."""
    return control.request(Path(home).absolute(), op, args, timeout=timeout, kind="document server",
                           start="multisite docserver start DIR... --name NAME --home {root}")


def stop_docserver(home: Path, timeout: float = 10.0) -> int:
    home = Path(home).absolute()
    pid = call(home, "ping", timeout=5)["pid"]
    call(home, "shutdown", timeout=timeout)
    return wait_exit(pid, timeout)
