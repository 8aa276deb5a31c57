"""A throwaway etcd cluster on loopback for tests, the bench and the demo (real ``etcd`` processes).

    with EtcdCluster(tmp_path) as etcd:      # 3 members, data under tmp_path/etcd
        etcd.endpoints                       # "http://127.0.0.1:P1,http://127.0.0.1:P2,http://127.0.0.1:P3"
        etcd.kill(0); etcd.restart(0)        # SIGKILL a member, start it again on its data
        etcd.pause(1); etcd.resume(1)        # SIGSTOP / SIGCONT

The members run Debian's ``etcd-server`` (``make setup`` installs it) with short Raft timings
(``HEARTBEAT_MS``, ``ELECTION_MS``) so that a lost leader is replaced in about a second; leases
still have whole-second TTLs. ``prefix`` runs a member's command through another one (``ip netns
exec NS``), and ``host`` binds it to another address: members can live in network namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ServerError
from .ports import free_port

HEARTBEAT_MS = 50
ELECTION_MS = 500
START_TIMEOUT_S = 20.0
# A loopback member's ports are found free (``free_port``) and then bound by etcd: another process
# may take one in between (a fresh-clone ``make test`` lost a peer port so). ``start`` then begins
# again on new ports, this many times in all.
START_ATTEMPTS = 3
PORT_TAKEN = b"address already in use"


def etcd_binary() -> str:
    """The etcd server's path, or ServerError saying how to install it."""
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise ServerError("etcd is not installed: run `make setup` (Debian: apt-get install etcd-server)")
    return path


def _signal(p: subprocess.Popen, sig: int) -> None:
    """``sig`` to a member's process group; one that already exited (a member that could not start) has none."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Member:
    name: str
    host: str
    client_port: int
    peer_port: int
    data: Path
    prefix: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class EtcdCluster:
    """``members`` etcd processes forming one cluster, their data and logs under ``base/etcd``."""

    def __init__(self, base: Path, members: int = 3, *, hosts: list[str] | None = None,
                 prefixes: list[list[str]] | None = None, token: str | None = None):
        self.dir = Path(base) / "etcd"
        self.dir.mkdir(parents=True, exist_ok=True)
        hosts = hosts or ["127.0.0.1"] * members
        prefixes = prefixes or [[] for _ in range(members)]
        self.members = [Member(f"m{i}", hosts[i], 2379, 2380, self.dir / f"m{i}", prefixes[i]) for i in range(members)]
        self._new_ports()
        self.token = token or f"ms-{os.getpid()}-{id(self)}"

    @property
    def endpoints(self) -> str:
        return ",".join(m.client_url for m in self.members)

    @property
    def client_urls(self) -> list[str]:
        return [m.client_url for m in self.members]

    def _argv(self, m: Member, state: str) -> list[str]:
        cluster = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [*m.prefix, etcd_binary(), "--name", m.name, "--data-dir", str(m.data),
                "--listen-client-urls", m.client_url, "--advertise-client-urls", m.client_url,
                "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
                "--initial-cluster", cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", self.token, "--heartbeat-interval", str(HEARTBEAT_MS),
                "--election-timeout", str(ELECTION_MS), "--logger", "zap", "--log-outputs", "stderr"]

    def _new_ports(self) -> None:
        """Free loopback ports for every loopback member (a member at another address keeps etcd's own)."""
        for m in self.members:
            if m.host == "127.0.0.1":
                m.client_port, m.peer_port = free_port(), free_port()

    def _spawn(self, m: Member, state: str) -> int:
        """Start member ``m``; returns where this start's lines begin in its log."""
        with open(self.dir / f"{m.name}.log", "ab") as log:
            start = log.tell()
            m.proc = subprocess.Popen(self._argv(m, state), stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        return start

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "EtcdCluster":
        """Start every member as a new cluster and wait until all are healthy; a member that could not
        bind a loopback port another process took meanwhile makes it begin again on new ports."""
        attempt = 1
        while True:
            starts = [self._spawn(m, "new") for m in self.members]
            try:
                self.wait_healthy(timeout_s)
                return self
            except ServerError:
                if attempt == START_ATTEMPTS or not self._lost_a_port(starts):
                    raise
            self.stop()
            for m in self.members:
                shutil.rmtree(m.data, ignore_errors=True)  # it names the old peer URLs
            self._new_ports()
            attempt += 1

    def _lost_a_port(self, starts: list[int]) -> bool:
        """Whether a loopback member exited, since its log offset in ``starts``, because its port was taken."""
        for m, start in zip(self.members, starts):
            if m.host == "127.0.0.1" and m.proc is not None and m.proc.poll() is not None:
                with open(self.dir / f"{m.name}.log", "rb") as log:
                    log.seek(start)
                    if PORT_TAKEN in log.read():
                        return True
        return False

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S, members: list[int] | None = None) -> None:
        """Until every listed member (default all running ones) answers /health with a leader."""
        idx = members if members is not None else [i for i, m in enumerate(self.members) if m.proc]
        deadline = time.monotonic() + timeout_s
        while True:
            if all(self.healthy(i) for i in idx):
                return
            for i in idx:
                p = self.members[i].proc
                if p is not None and p.poll() is not None:
                    raise ServerError(f"etcd member {self.members[i].name} exited with {p.returncode}: see "
                                      f"{self.dir / (self.members[i].name + '.log')}")
            if time.monotonic() > deadline:
                raise ServerError(f"etcd at {self.endpoints} not healthy within {timeout_s} s: see {self.dir}")
            time.sleep(0.05)

    def healthy(self, i: int) -> bool:
        try:
            with urllib.request.urlopen(self.members[i].client_url + "/health", timeout=1) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def kill(self, i: int) -> None:
        """SIGKILL member ``i``."""
        p = self.members[i].proc
        if p is not None:
            _signal(p, signal.SIGKILL)
            p.wait()
            self.members[i].proc = None

    def restart(self, i: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start member ``i`` again on its data (it rejoins the cluster)."""
        if self.members[i].proc is None:
            self._spawn(self.members[i], "existing")
        self.wait_healthy(timeout_s, [i])

    def pause(self, i: int) -> None:
        p = self.members[i].proc
        if p is not None:
            _signal(p, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        p = self.members[i].proc
        if p is not None:
            _signal(p, signal.SIGCONT)

    def stop(self) -> None:
        for i, m in enumerate(self.members):
            if m.proc is not None:
                self.resume(i)
                self.kill(i)

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
