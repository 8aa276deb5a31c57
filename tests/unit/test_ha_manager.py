"""The HA manager's passes (ha/manager.py) against a fake instance server and a fake etcd: what it asks
the server to do, and what it publishes, as a member follows, leads and is demoted again."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from multisite.errors import ConfigError
from multisite.ha.decide import Kind, Leader, Member, View
from multisite.ha.manager import HAConfig, HAManager

LISTEN = "127.0.0.1:0"  # --replication's default: any free port


class FakeServer:
    """The instance server's control operations, as far as the manager uses them. A receiver is given
    a new port at each start, and a port once given is taken for good (an outgoing connection of
    another process may have it, or a TIME_WAIT): a bind on it fails, as the kernel's does."""

    def __init__(self, name: str, role: str = "secondary"):
        self.state = {"name": name, "group": "G", "role": role, "seqno": 10, "receiver": None, "sources": {},
                      "client_port": 7000}
        self.given: set[int] = set()
        self.calls: list[tuple[str, dict]] = []

    async def call(self, op: str, **args):
        self.calls.append((op, args))
        if op == "receiver.start":
            host, port = args["listen"].rsplit(":", 1)
            if int(port) in self.given:
                raise ConfigError(f"cannot listen for a source on {args['listen']}: address already in use")
            port = int(port) or 41000 + len(self.given)
            self.given.add(port)
            self.state.update(receiver={"listen": f"{host}:{port}"}, role="secondary")
            return {"listen": f"{host}:{port}"}
        if op == "receiver.stop":
            self.state["receiver"] = None
        elif op == "role":
            self.state["role"] = args["role"]
        elif op == "rollback":
            return {"rolled_back": 0}
        return {}

    async def refresh(self) -> dict:
        return self.state

    role = property(lambda self: self.state["role"])
    seqno = property(lambda self: self.state["seqno"])

    def source(self, name: str):
        return self.state["sources"].get(name)


class FakeEtcd:
    """The coordinator: a view the test sets, the records the manager publishes, renewals that succeed."""

    def __init__(self):
        self.next_view = View(False)
        self.published: list[Member] = []

    async def join(self, group: str) -> None: ...
    async def publish(self, member: Member) -> None: self.published.append(member)
    async def view(self) -> View: return self.next_view
    async def renew(self) -> bool: return True
    async def resign(self) -> None: ...
    async def clear_switchover(self) -> None: ...
    async def close(self) -> None: ...


def members(leader: str) -> tuple[Member, ...]:
    return tuple(Member(n, "G", f"127.0.0.1:{7000 + i}", f"127.0.0.1:{8000 + i}", 10,
                        "primary" if n == leader else "secondary") for i, n in enumerate("ABC"))


def test_a_demoted_primary_rejoins_on_a_new_receiver_port_not_on_the_one_it_had_before_its_promotion():
    """B follows (its receiver given port P), is promoted (receiver stopped: P back to the kernel, where
    any outgoing connection may take it), then a new leader demotes it. Its new receiver must not ask
    for P again: that bind failed at every pass, and the demoted primary never became a secondary."""
    server, etcd = FakeServer("B"), FakeEtcd()
    mgr = HAManager(server, HAConfig("c", ["http://e:1"], replication_listen=LISTEN), etcd, logging.getLogger("t"))

    async def run() -> None:
        await mgr.start()
        first = server.state["receiver"]["listen"]
        assert first != LISTEN
        # B leads (its campaign won): promoted
        mgr.local = replace(mgr.local, leading_term=2, renewed_sent_at=time.monotonic())
        etcd.next_view = View(True, Leader("B", 2), members("B"), last_term=2)
        assert (await mgr.step()).kind is Kind.PROMOTE
        assert server.state["receiver"] is None and server.role == "primary"
        # C took the key: B is fenced, then rejoins C as a secondary
        etcd.next_view = View(True, Leader("C", 3), members("C"), last_term=3)
        assert (await mgr.step()).kind is Kind.FENCE
        assert (await mgr.step()).kind is Kind.REJOIN
        assert server.role == "secondary" and server.state["receiver"]["listen"] not in (None, first)
        starts = [a["listen"] for op, a in server.calls if op == "receiver.start"]
        assert starts == [LISTEN, LISTEN]
        await mgr.step()
        assert etcd.published[-1].replication == server.state["receiver"]["listen"]

    asyncio.run(run())


def test_a_primary_publishes_no_receiver_address():
    """While it leads, a member has no receiver: its record must not name the one it had (a leader
    started a source to that dead address after a switchover)."""
    server, etcd = FakeServer("B"), FakeEtcd()
    mgr = HAManager(server, HAConfig("c", ["http://e:1"], replication_listen=LISTEN), etcd, logging.getLogger("t"))

    async def run() -> None:
        await mgr.start()
        mgr.local = replace(mgr.local, leading_term=2, renewed_sent_at=time.monotonic())
        etcd.next_view = View(True, Leader("B", 2), members("B"), last_term=2)
        await mgr.step()
        await mgr.step()
        assert etcd.published[-1].role == "primary" and etcd.published[-1].replication == ""

    asyncio.run(run())
