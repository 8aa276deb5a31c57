"""A harness of real document servers for tests, the demo and the bench.

    with DocCluster(tmp_path) as c:
        a = c.server("A", ["P"])            # a docserver "A" serving a new database titled P
        b = c.server("B", ["P"], replica_of=a)  # B serves a replica of A's P
        c.call(a, "replicate", server=b.address, mode="pull-push")

Each server has a home ``root/<name>`` and its databases in ``root/<name>-<title>``; ``kill`` SIGKILLs
one (the databases stay), ``restart`` starts it again on the same port.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..multimaster.server import docdb
from ..multimaster.server.process import call, start_docserver, stop_docserver


@dataclass
class DocNode:
    name: str
    home: Path
    dbs: dict[str, Path]
    listen: str
    options: dict = field(default_factory=dict)
    pid: int = 0
    process: Any = None
    address: str = ""

    def path(self, title: str) -> Path:
        return self.dbs[title]


class DocCluster:
    def __init__(self, root: Path, durability: str = "fsync") -> None:
        self.root = Path(root)
        self.durability = durability
        self.nodes: dict[str, DocNode] = {}

    def make_dbs(self, name: str, titles: list[str], replica_of: "DocNode | None" = None) -> dict[str, Path]:
        out = {}
        for t in titles:
            p = self.root / f"{name}-{t}"
            if not p.exists():
                rid = docdb.read_identity(replica_of.dbs[t])["replica_id"] if replica_of and t in replica_of.dbs else None
                docdb.create(p, t, replica_id=rid, durability=self.durability).close()
            out[t] = p
        return out

    def server(self, name: str, titles: list[str], *, replica_of: "DocNode | None" = None, start: bool = True,
               **options: Any) -> DocNode:
        node = DocNode(name, self.root / name, self.make_dbs(name, titles, replica_of), "127.0.0.1:0", options)
        self.nodes[name] = node
        if start:
            self.start(node)
        return node

    def start(self, node: DocNode) -> DocNode:
        info = start_docserver(node.home, [str(p) for p in node.dbs.values()],
                               node.name, node.listen, **node.options.get("start", {}))
        node.pid, node.process, node.address = info["pid"], info["process"], info["listen"]
        node.listen = info["listen"]  # a restart keeps the port
        return node

    def call(self, node: DocNode, op: str, **args: Any) -> Any:
        return call(node.home, op, **args)

    def replicate(self, node: DocNode, peer: DocNode, mode: str = "pull-push", db: str | None = None) -> dict:
        return call(node.home, "replicate", server=peer.address, mode=mode, db=db)

    def kill(self, node: DocNode) -> None:
        os.kill(node.pid, signal.SIGKILL)
        if node.process is not None:
            node.process.wait(timeout=10)

    def stop(self, node: DocNode) -> None:
        stop_docserver(node.home)
        if node.process is not None:
            node.process.wait(timeout=10)

    def stop_all(self) -> None:
        for n in self.nodes.values():
            if n.process is not None and n.process.poll() is None:
                try:
                    self.stop(n)
                except Exception:  # noqa: BLE001 - teardown: kill what does not stop
                    n.process.kill()
                    n.process.wait(timeout=10)

    def __enter__(self) -> "DocCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
