"""A harness of real document servers for tests, the demo and the bench.

    with DocCluster(tmp_path) as c:
        a = c.server("A", ["P"])            # a docserver "A" serving a new database titled P
        b = c.server("B", ["P"], replica_of=a)  # B serves a replica of A's P
        c.call(a, "replicate", server=b.address, mode="pull-push")

Each server has a home ``root/<name>`` and its databases in ``root/<name>-<title>``; ``kill`` SIGKILLs
one (the databases stay), ``restart`` starts it again on the same port.

For the history checker (``testing/history``): ``call_outcome`` says what a failed control call means
for its operation (never sent, refused, or unknown), and ``doc_state`` turns a server's documents into
the state the writers' histories are checked against.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MultisiteError
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


# How a control call that raised ended: the request never left, or the server answered with a refusal
# (``fail``); the connection broke or timed out after the request was sent (``unknown``).
_NOT_SENT = ("no document server is running", "cannot reach the document server")
_NO_ANSWER = ("closed the control connection", "did not answer", "control connection to the document server")


def call_outcome(e: MultisiteError) -> str:
    """``fail`` or ``unknown`` for a control call that raised ``e`` (see above)."""
    text = str(e)
    if any(m in text for m in _NOT_SENT):
        return "fail"
    return "unknown" if any(m in text for m in _NO_ANSWER) else "fail"


def doc_state(docs: dict, tag_fields: tuple[str, str] = ("w", "j"), value_field: str = "v") -> tuple[dict, list]:
    """From a server's documents (UNID -> ``doc.list`` entry): the final state as the writer records it
    (``("new", w, j") -> (w, j)`` for a document its create ``w`` made as the ``j``-th, and
    ``("v", unid) -> fields[value_field]``) and the created documents as a log (each must appear once)."""
    final, made = {}, []
    for unid, d in docs.items():
        f = d["fields"]
        if tag_fields[0] in f:
            key = ("new", f[tag_fields[0]], f[tag_fields[1]])
            final[key] = (f[tag_fields[0]], f[tag_fields[1]])
            made.append((key, final[key]))
        if value_field in f:
            final[("v", unid)] = f[value_field]
    return final, made
