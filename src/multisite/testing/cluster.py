"""A harness for real replication topologies on localhost: instances, server processes, links.

Used by the integration and fault tests and by the demo. Everything is real: each instance server is
its own process, links are TCP on 127.0.0.1 with ephemeral ports, control goes through the CLI's
own functions.

    c = Cluster(tmp_path)
    a = c.instance("A"); b = c.instance("B")
    c.link(a, b)                      # receiver on B, source on A
    with a.client() as db: db.set(...)
    c.wait_caught_up(a, b)
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import engine as database
from ..server.process import start_server, stop_server
from ..errors import ServerError
from ..net import control
from ..server.client import RemoteDatabase


@dataclass
class Node:
    name: str
    root: Path
    client_port: int | None = None
    receiver_port: int | None = None
    pid: int | None = None
    metrics_port: int | None = None
    sources: dict[str, dict] = field(default_factory=dict)

    def call(self, op: str, **args: Any) -> Any:
        return control.call(self.root, op, **args)

    def client(self) -> RemoteDatabase:
        return RemoteDatabase(f"127.0.0.1:{self.client_port}")

    def start(self, metrics: bool = False, **server_kw: Any) -> "Node":
        """Start the server; with ``metrics``, /metrics on a free port (``metrics_port``); ``server_kw``:
        start_server's (the client port's ``tls``, ``insecure``)."""
        info = start_server(self.root, "127.0.0.1:0", metrics="127.0.0.1:0" if metrics else None, **server_kw)
        self.pid, self.client_port = info["pid"], info["client_port"]
        self.metrics_port = info.get("metrics_port")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        stop_server(self.root, timeout)
        self.pid = None

    def kill(self) -> None:
        """SIGKILL the instance server (every component in it dies at once)."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            wait_dead(self.pid)
            self.pid = None

    @property
    def running(self) -> bool:
        return control.is_running(self.root)

    def start_receiver(self, port: int = 0, **kw: Any) -> int:
        res = self.call("receiver.start", listen=f"127.0.0.1:{port}", **kw)
        self.receiver_port = int(res["listen"].rsplit(":", 1)[1])
        return self.receiver_port

    def start_source(self, secondary: "Node", port: int | None = None, **kw: Any) -> dict:
        kw.setdefault("heartbeat_interval_s", 0.2)
        kw.setdefault("heartbeat_timeout_s", 2.0)
        target = f"127.0.0.1:{port if port is not None else secondary.receiver_port}"
        self.sources[secondary.name] = {"connect": target, **kw}
        return self.call("source.start", secondary=secondary.name, connect=target, **kw)

    def status(self) -> dict:
        return self.call("status")

    def seqno(self) -> int:
        return self.status()["seqno"]

    def dump(self) -> dict[str, list]:
        """Every region's content, read from the instance files (the server must be stopped)."""
        with database.open(self.root) as db:
            return {r: list(db.items(r)) for r in sorted(db.regions())}


def wait_dead(pid: int, timeout: float = 10.0) -> None:
    """Until ``pid`` (SIGKILLed) is gone, reaping it if it is this process's child; at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.01)


def thread_states(pid: int) -> str:
    """The scheduler states of ``pid``'s threads, one letter each (``T`` stopped, ``R``, ``S``, ``D`` ...)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # "tid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'
            states.append(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass  # a thread that ended meanwhile
    return "".join(states)


def pause(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped: ``kill`` returns before a
    thread busy in the kernel (an fdatasync) reaches the stop, and a test that probes the process
    must not find one still answering."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while set(thread_states(pid)) - {"T", "t"}:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"pid {pid} not stopped {timeout:g} s after SIGSTOP: thread states "
                               f"{thread_states(pid)!r}")
        time.sleep(0.01)


class Cluster:
    def __init__(self, base: Path, durability: str = "group", **create_kw: Any):
        self.base = Path(base)
        self.nodes: dict[str, Node] = {}
        self.durability = durability
        self.create_kw = create_kw

    def instance(self, name: str, *, start: bool = True, **kw: Any) -> Node:
        root = self.base / name
        opts = {"durability": self.durability, **self.create_kw, **kw}
        database.create(root, name, **opts)
        node = Node(name, root)
        self.nodes[name] = node
        return node.start() if start else node

    def link(self, primary: Node, secondary: Node, **source_kw: Any) -> None:
        if secondary.receiver_port is None:
            secondary.start_receiver()
        primary.start_source(secondary, **source_kw)

    def wait_caught_up(self, primary: Node, secondary: Node, timeout: float = 30.0) -> int:
        target = primary.seqno()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = secondary.seqno()
            if got >= target:
                return got
            time.sleep(0.05)
        raise ServerError(f"{secondary.name} did not reach seqno {target} within {timeout} s "
                          f"(at {secondary.seqno()}); {primary.name} status: "
                          f"{json.dumps(primary.status().get('sources'), default=str)}")

    def stop_all(self) -> None:
        for n in self.nodes.values():
            try:
                if n.running:
                    n.stop()
            except ServerError:
                n.kill()
