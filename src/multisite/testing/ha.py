"""A log-shipping cluster under HA managers, for tests, the bench and the demo (issue 25).

    c = HACluster(tmp_path, etcd.endpoints, ["A", "B", "C"], ttl_s=1.0)
    c.start()                       # instances, servers, one HA manager each
    c.wait_primary(); c.wait_followers()
    w = c.writer()                  # a thread committing through the multi-host client
    c.lose_host(c.primary())        # SIGKILL of the server and its manager
    ...
    w.stop(); c.wait_identical(); c.check_acknowledged(w)

Every part is real: each server and each manager is a process of its own; the managers talk to a real
etcd; the writer is a ``multisite.connect`` client with every member's address.

With ``hosts`` (``testing/netns.py``), each member lives in the network namespace of the same name: its
server listens on that host's address, its manager publishes it (``ha start --advertise``), and both
processes are started from inside it (``Hosts.entered``), where the harness also reaches their control
sockets; the writer, in the test's own namespace, reaches every member through the bridge.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import engine as database
from ..errors import CommitOutcomeUnknown, MinConfirmTimeout, MultisiteError, ServerError
from ..ha.process import run_file, start_ha, stop_ha
from ..journal.lostfile import LostFile, list_lost_files
from ..net import control
from ..server.client import RemoteDatabase
from ..server.min_confirm import MIN_CONFIRM_TIMEOUT_S_DEFAULT
from ..server.process import start_server, stop_server
from .checks import wait_until
from .cluster import wait_dead
from .history import READ, WRITE, Recorder

if TYPE_CHECKING:
    from .netns import Hosts

REGION = "acct"
# a commit's answer: above the min-confirm wait; a paused primary holds the writer this long before its
# commit counts as unknown and the writer looks for the new primary
WRITER_TIMEOUT_S = MIN_CONFIRM_TIMEOUT_S_DEFAULT + 3.0
READ_EVERY = 4  # after every 4th commit acknowledged the writer reads it back, and one acknowledged before


@dataclass
class Writer:
    """A thread committing ``(REGION, key(i), i)`` one at a time (``key(i)`` is ``(i,)``, or ``(tag, i)``
    with a tag); what was acknowledged, refused, unknown. A commit refused with MIN_CONFIRM_TIMEOUT is
    hard on the primary but unconfirmed: its outcome is unknown, not refused. Every call, and a read of
    every ``READ_EVERY``-th acknowledged key right after its answer and of an earlier acknowledged one (a
    failover between them shows), goes into ``history``
    (``testing/history``) with its invocation, outcome and the value read."""

    addresses: str
    tag: str = ""
    acked: dict[int, int] = field(default_factory=dict)  # i -> seqno
    unknown: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    ack_times: list[tuple[float, int, str]] = field(default_factory=list)  # (monotonic, i, primary's address)
    errors: list[str] = field(default_factory=list)
    history: Recorder = field(default_factory=Recorder)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = RemoteDatabase(self.addresses, WRITER_TIMEOUT_S, failover_timeout_s=30)
        rng = random.Random(self.tag)
        i = 0
        while not self._stop.is_set():
            i += 1
            if self._commit(db, i) and i % READ_EVERY == 0:
                self._read(db, i)
                self._read(db, rng.choice(list(self.acked)))
        db.close()

    def _commit(self, db: RemoteDatabase, i: int) -> bool:
        """Commit ``i``; whether it was acknowledged."""
        op = self.history.invoke("ha-writer", WRITE, self.key(i), i)
        try:
            seqno = db.set(REGION, self.key(i), i)
        except (CommitOutcomeUnknown, MinConfirmTimeout):
            self.history.unknown(op)
            self.unknown.append(i)
            return False
        except MultisiteError as e:
            self.history.fail(op)
            self.refused.append(i)
            self.errors.append(f"{e.code}: {e.message}")
            time.sleep(0.01)
            return False
        self.history.ok(op)
        self.acked[i] = seqno
        self.ack_times.append((time.monotonic(), i, db.address))
        return True

    def _read(self, db: RemoteDatabase, i: int) -> None:
        op = self.history.invoke("ha-writer", READ, self.key(i))
        try:
            value = db.get(REGION, self.key(i))
        except MultisiteError:
            self.history.unknown(op)
            return
        self.history.ok(op, value, read=True)

    def key(self, i: int) -> tuple:
        return (self.tag, i) if self.tag else (i,)

    def wait_commit_after(self, t: float, timeout_s: float, on: str | None = None) -> float:
        """The monotonic time of the first commit acknowledged after ``t`` (by the primary at ``on``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for x, _, addr in self.ack_times:
                if x > t and (on is None or addr == on):
                    return x
            time.sleep(0.005)
        raise ServerError(f"no commit acknowledged within {timeout_s} s after the fault; errors: {self.errors[-3:]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


class HACluster:
    """Members named ``names`` under ``base``, each an instance server with its HA manager."""

    def __init__(self, base: Path, etcd: str, names: list[str], *, ttl_s: float = 1.0, min_confirm: int = 0,
                 cluster: str = "c1", durability: str = "group", hosts: "Hosts | None" = None):
        self.base, self.etcd, self.names = Path(base), etcd, list(names)
        self.ttl_s, self.min_confirm, self.cluster, self.durability = ttl_s, min_confirm, cluster, durability
        self.hosts = hosts
        self.ports: dict[str, int] = {}
        self._held: dict[str, socket.socket] = {}  # client ports of lost hosts (``_hold_port``)

    def on(self, name: str) -> contextlib.AbstractContextManager:
        """Within: the calling thread is in the member's network namespace (when it has one)."""
        return self.hosts.entered(name) if self.hosts else contextlib.nullcontext()

    def host(self, name: str) -> str:
        return self.hosts.address(name) if self.hosts else "127.0.0.1"

    # -- members ----------------------------------------------------------------------------------
    def root(self, name: str) -> Path:
        return self.base / name

    def address(self, name: str) -> str:
        return f"{self.host(name)}:{self.ports[name]}"

    @property
    def addresses(self) -> str:
        return ",".join(self.address(n) for n in self.names)

    def start(self) -> None:
        for n in self.names:
            database.create(self.root(n), n, durability=self.durability)
        for n in self.names:
            self.start_host(n)

    def start_host(self, name: str) -> None:
        """The member's server (its client port kept across restarts) and its manager."""
        port, host = self.ports.get(name, 0), self.host(name)
        held = self._held.pop(name, None)
        if held is not None:
            held.close()
        with self.on(name):  # no users: a port on a namespace's address is open to the test's hosts only
            info = start_server(self.root(name), f"{host}:{port}", insecure=self.hosts is not None)
            self.ports[name] = info["client_port"]
            start_ha(self.root(name), self.cluster, self.etcd, ttl_s=self.ttl_s, min_confirm=self.min_confirm,
                     advertise=host if self.hosts else None)

    def pids(self, name: str) -> list[int]:
        out = []
        for f in (self.root(name) / "run" / "server.json", run_file(self.root(name))):
            try:
                import json

                out.append(int(json.loads(f.read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                pass
        return out

    def lose_host(self, name: str) -> None:
        """SIGKILL the member's server and manager at once (the machine is gone)."""
        for pid in self.pids(name):
            _signal(pid, signal.SIGKILL)
        for pid in self.pids(name):
            wait_dead(pid)
        self._hold_port(name)

    def _hold_port(self, name: str) -> None:
        """Keep a lost member's client port bound (not listening) until ``start_host``: the writer's
        addresses name it, and a port nothing is bound to may be given to any outgoing connection of
        the machine meanwhile, or left in TIME_WAIT by one, and the restarted server then cannot listen
        on it (EADDRINUSE: a loaded fault round failed so). connect() never picks a port a socket is
        bound to."""
        if self.hosts is not None or name not in self.ports or name in self._held:
            return
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside the old server's TIME_WAITs
        try:
            s.bind((self.host(name), self.ports[name]))
        except OSError:
            s.close()  # taken already: the restart says so
            return
        self._held[name] = s

    def restart_host(self, name: str) -> None:
        run_file(self.root(name)).unlink(missing_ok=True)
        self.start_host(name)

    def pause_host(self, name: str) -> None:
        for pid in self.pids(name):
            _signal(pid, signal.SIGSTOP)

    def resume_host(self, name: str) -> None:
        for pid in self.pids(name):
            _signal(pid, signal.SIGCONT)

    def stop(self) -> None:
        for n in self.names:
            self.resume_host(n)
            try:
                stop_ha(self.root(n), timeout_s=5)
            except MultisiteError:
                pass
            try:
                with self.on(n):
                    if control.is_running(self.root(n)):
                        stop_server(self.root(n), 5)
            except MultisiteError:
                self.lose_host(n)
        for s in self._held.values():
            s.close()
        self._held.clear()

    # -- observing ----------------------------------------------------------------------------------
    def status(self, name: str) -> dict | None:
        try:
            with self.on(name):
                return control.call(self.root(name), "status", 5.0)
        except MultisiteError:
            return None

    def primaries(self) -> list[str]:
        """Members that take commits: primaries with no receiver and not fenced (a primary whose leader
        lease ended keeps its role until its manager demotes it, but takes no commit)."""
        out = []
        for n in self.names:
            st = self.status(n) or {}
            if st.get("role") == "primary" and st.get("receiver") is None and not st.get("fenced"):
                out.append(n)
        return out

    def primary(self) -> str:
        p = self.primaries()
        if len(p) != 1:
            raise ServerError(f"expected one primary, found {p}")
        return p[0]

    def wait_primary(self, exclude: str | None = None, timeout_s: float = 20.0) -> str:
        def one():
            p = [n for n in self.primaries() if n != exclude]
            return p[0] if len(p) == 1 else None
        return wait_until(one, timeout_s=timeout_s, what=f"one primary other than {exclude}")

    def wait_role(self, name: str, role: str, timeout_s: float = 20.0) -> None:
        wait_until(lambda: (self.status(name) or {}).get("role") == role, timeout_s=timeout_s,
                   what=f"{name} to be {role}")

    def wait_followers(self, timeout_s: float = 30.0) -> None:
        """Every running member other than the primary receives from the primary's streaming source."""
        def ready():
            prim = self.primaries()
            if len(prim) != 1:
                return False
            st = self.status(prim[0]) or {}
            for n in self.names:
                if n == prim[0] or self.status(n) is None:
                    continue
                src = (st.get("sources") or {}).get(n)
                if not src or src.get("state") != "streaming":
                    return False
            return True
        wait_until(ready, timeout_s=timeout_s, what="every member following the primary")

    def wait_identical(self, timeout_s: float = 30.0) -> None:
        """Every running member at the primary's seqno with the same rows."""
        def same():
            seqnos = {n: (self.status(n) or {}).get("seqno") for n in self.names}
            return len(set(seqnos.values())) == 1 and None not in seqnos.values()
        wait_until(same, timeout_s=timeout_s, what="members at one seqno")
        dumps = {n: self.rows(n) for n in self.names}
        first = dumps[self.names[0]]
        for n, d in dumps.items():
            if d != first:
                raise AssertionError(f"{n} differs from {self.names[0]}: {len(d)} rows vs {len(first)}")

    def rows(self, name: str) -> dict:
        with RemoteDatabase(self.address(name)) as db:
            if REGION not in db.regions():
                return {}
            return dict(db.items(REGION))

    def client(self) -> RemoteDatabase:
        return RemoteDatabase(self.addresses, failover_timeout_s=30)

    def writer(self, tag: str = "") -> Writer:
        with self.client() as db:
            db.create_region(REGION)
        return Writer(self.addresses, tag)

    def lost_rows(self) -> set[tuple]:
        """Keys of every lost-transaction file of every member."""
        keys = set()
        for n in self.names:
            for path in list_lost_files(self.root(n) / "lost"):
                for t in LostFile.read(path).transactions:
                    for u in t["updates"]:
                        keys.add(tuple(u["key"]))
        return keys

    def check_acknowledged(self, w: Writer) -> None:
        """Every acknowledged commit is on the primary or in a lost file; nothing refused is anywhere."""
        rows = self.rows(self.wait_primary())  # waited for: under load a lease may lapse at this moment
        lost = self.lost_rows()
        missing = [i for i in w.acked if w.key(i) not in rows and w.key(i) not in lost]
        assert not missing, f"acknowledged commits silently lost: {missing[:10]} (of {len(missing)})"
        present = [i for i in w.refused if w.key(i) in rows]
        assert not present, f"refused commits present: {present[:10]}"

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-c", "from multisite.cli.main import main; main()", *args],
                             capture_output=True, text=True, timeout=120)
        if check and out.returncode:
            raise ServerError(f"multisite {' '.join(args)} failed: {out.stderr.strip()}")
        return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
