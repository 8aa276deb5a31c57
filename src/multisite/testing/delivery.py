"""A delivery topology for tests, the demo and the benchmark: one consolidated instance and remote
sites, set up through the public API with the file transport, and helpers to run an agent poll (in
this process or as a real ``multisite delivery agent`` process) and to read an instance's rows."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import engine
from ..delivery.server import api
from ..delivery.server.agent import Agent, PollReport

REGION = "orders"
PUBLICATION = "sales"
FIELD = "site"


@dataclass
class Topology:
    root: Path
    hq: Path
    remotes: dict[str, Path] = field(default_factory=dict)  # name -> instance folder
    values: dict[str, str] = field(default_factory=dict)  # name -> subscribe-by value

    def inbox(self, name: str) -> Path:
        return self.root / "inbox" / name

    @property
    def sites(self) -> dict[str, Path]:
        return {"HQ": self.hq, **self.remotes}


def make_topology(root: Path, remotes: dict[str, str], *, durability: str = "fsync", key: str = "",
                  subscribe_by: str | None = FIELD, hq_durability: str | None = None,
                  addresses: dict[str, str] | None = None) -> Topology:
    """HQ publishing ``orders`` subscribed by ``site``; each remote ``name`` subscribed with its value.
    ``addresses``: where messages to a site go (default: its inbox folder, the file transport)."""
    root = Path(root)
    top = Topology(root, root / "HQ", values=dict(remotes))
    addr = {n: (addresses or {}).get(n) or str(top.inbox(n)) for n in ["HQ", *remotes]}
    engine.create(top.hq, "HQ", durability=hq_durability or durability)
    with engine.open(top.hq) as db:
        api.publish(db, PUBLICATION, [REGION], subscribe_by, inbox=str(top.inbox("HQ")))
        for name, value in remotes.items():
            api.subscribe(db, PUBLICATION, name, addr[name], value if subscribe_by else None, key)
    for name in remotes:
        path = root / name
        engine.create(path, name, durability=durability)
        with engine.open(path) as db:
            api.remote_setup(db, "HQ", addr["HQ"], PUBLICATION, [REGION], inbox=str(top.inbox(name)),
                             key=key)
        top.remotes[name] = path
    return top


def poll(path: Path, **kwargs) -> PollReport:
    """One agent poll on the instance at ``path``, in this process."""
    with engine.open(path) as db:
        agent = Agent(db, **kwargs)
        try:
            return agent.poll()
        finally:
            agent.close()


def agent_process(path: Path, *args: str, **popen) -> subprocess.Popen:
    """A real ``multisite delivery agent PATH ARGS...`` process."""
    return subprocess.Popen([sys.executable, "-c", "from multisite.cli.main import main; main()", "delivery",
                             "agent", str(path), *args], **popen)


def run_agent(path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from multisite.cli.main import main; main()", "delivery",
                           "agent", str(path), *args], capture_output=True, text=True, timeout=timeout)


def rows(path: Path, region: str = REGION) -> dict[tuple, object]:
    with engine.open(path) as db:
        if region not in db.regions():
            return {}
        return dict(db.items(region))


def settle(top: Topology, rounds: int = 12, **kwargs) -> int:
    """Poll every site in turn until a whole round does nothing and nothing waits; the rounds it took."""
    for n in range(1, rounds + 1):
        busy = False
        for path in top.sites.values():
            rep = poll(path, **kwargs)
            busy |= rep.busy or bool(rep.waiting or rep.resend_requests)
        if not busy:
            return n
    return rounds
