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
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ServerError

HEARTBEAT_MS = 50
ELECTION_MS = 500
START_TIMEOUT_S = 20.0


def etcd_binary() -> str:
    """The etcd server's path, or ServerError saying how to install it."""
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise ServerError("etcd is not installed: run `make setup` (Debian: apt-get install etcd-server)")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        self.members = [Member(f"m{i}", hosts[i], free_port() if hosts[i] == "127.0.0.1" else 2379,
                               free_port() if hosts[i] == "127.0.0.1" else 2380, self.dir / f"m{i}", prefixes[i])
                        for i in range(members)]
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

    def _spawn(self, m: Member, state: str) -> None:
        log = open(self.dir / f"{m.name}.log", "ab")
        m.proc = subprocess.Popen(self._argv(m, state), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        log.close()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "EtcdCluster":
        for m in self.members:
            self._spawn(m, "new")
        self.wait_healthy(timeout_s)
        return self

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
            os.killpg(p.pid, signal.SIGKILL)
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
            os.killpg(p.pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        p = self.members[i].proc
        if p is not None:
            os.killpg(p.pid, signal.SIGCONT)

    def stop(self) -> None:
        for i, m in enumerate(self.members):
            if m.proc is not None:
                self.resume(i)
                self.kill(i)

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
