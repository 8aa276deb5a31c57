"""The HA manager beside an instance server: publishes the member, keeps the leader lease, acts on ``decide``.

It is a process of its own (``multisite ha start DIR``, ``python -m multisite.ha.process``) beside the
instance server it manages, and acts through that server's control socket (``InstanceHandle``):
promote (``role``), start sources (``source.start``), follow (``receiver.start``), roll back
(``rollback`` with fetchresync against the new primary). A manager that dies leaves the server
serving; one that is paused cannot leave a primary open (below). The decisions are ``decide``'s; this
module does the I/O around them: etcd through ``Coordinator``, the control calls, the clock.

Fencing has two layers. After each renewal the manager gives the server the deadline it may commit
until (``lease``: the engine's ``Database.set_lease``, on the machine's monotonic clock, which both
processes share), so the commit path itself refuses once it passes, whatever this process is doing;
and when ``decide`` says FENCE, the manager stops the sources and gives the key up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import CoordinatorUnavailable, MultisiteError
from ..net import control
from .coordinator import Coordinator
from .decide import Action, Kind, Local, Member, Timing, View, decide, fence_deadline

CONTROL_TIMEOUT_S = 10.0  # one control call to the managed server
HANDOVER_TIMEOUT_S = 10.0  # a switchover's target must confirm everything within this, or it is called off
IDLE_TICK_S = 0.05  # how often a member without the lease looks at etcd (detection of a lost leader)
FOLLOW_KW = {"autorollback": True}  # a receiver that rolls back on its own if its history diverged


@dataclass
class HAConfig:
    """What ``ha start`` was given."""

    cluster: str
    etcd: list[str]
    ttl_s: float = 1.0
    min_confirm: int = 0
    replication_listen: str = "127.0.0.1:0"  # where this member's Receiver Server listens
    client_address: str = ""  # this member's client port as others reach it (HOST:PORT)
    advertise: str = ""  # the host of client_address (``ha start --advertise``), when not the listen host


class InstanceHandle:
    """The managed instance server, through its control socket (each call in a thread)."""

    def __init__(self, root: Path):
        self.root = root
        self.state: dict = {}  # the last ``status``

    async def call(self, op: str, **args: Any) -> Any:
        return await asyncio.to_thread(control.call, self.root, op, CONTROL_TIMEOUT_S, **args)

    async def refresh(self) -> dict:
        self.state = await self.call("status")
        return self.state

    @property
    def role(self) -> str:
        return self.state.get("role", "secondary")

    @property
    def seqno(self) -> int:
        return int(self.state.get("seqno", 0))

    def source(self, name: str) -> dict | None:
        return (self.state.get("sources") or {}).get(name)


class HAManager:
    """One member's manager; ``run`` until stopped."""

    def __init__(self, inst: InstanceHandle, cfg: HAConfig, coordinator: Coordinator, log: logging.Logger):
        self.inst, self.cfg, self.coord, self.log = inst, cfg, coordinator, log
        self.timing = Timing(ttl_s=cfg.ttl_s)
        st = inst.state
        self.name, self.group = st["name"], st["group"]
        self.local = Local(self.name, inst.role, inst.seqno)
        self.replication = cfg.replication_listen
        self.last_view = View(False)
        self.last_action = Action(Kind.WAIT, reason="starting")
        self.events: list[tuple[float, str]] = []  # (unix time, what happened): the manager's log shows them

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the cluster (its group checked); a member that is not primary listens for the leader."""
        await self.coord.join(self.group)
        if self.inst.role == "primary":  # no lease of this manager's yet: commits wait for its campaign
            await self.inst.call("lease", until=0.0)  # (or, another member leading, for its rejoin)
        if self.cfg.min_confirm or (self.inst.state.get("min_confirm") or {}).get("n"):  # 0 too: a previous
            await self.inst.call("min_confirm", n=self.cfg.min_confirm)  # manager's N stays in the server
        if self.inst.state.get("receiver") is None and self.inst.role != "primary":
            await self._follow_receiver()
        elif self.inst.state.get("receiver"):
            self.replication = self.inst.state["receiver"].get("listen", self.replication)

    async def run(self) -> None:
        while True:
            tick = self.timing.renew_every_s if self.local.leading_term is not None else IDLE_TICK_S
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except MultisiteError as e:  # one bad pass (etcd slow, a control call refused) is logged, not fatal
                self.log.warning("ha: %s: %s", e.code, e.message)
            except Exception:  # nor is an unforeseen one: a manager whose loop ended would look alive and do nothing
                self.log.exception("ha: a pass of %s's manager failed", self.name)
            await asyncio.sleep(tick)

    async def stop(self) -> None:
        """Give the key up (a planned stop: no one waits for the lease) and the member's record. A
        leader's server is fenced first and stays fenced: once the key is given up another member is
        promoted, and a server left taking commits would be a second primary (the fence was lifted here
        once, and a stopped leader cut off from etcd took commits beside the new primary). It takes
        commits again when a manager leads it again, or follows the new primary once one rejoins it."""
        if self.local.leading_term is not None:
            await self.inst.call("lease", until=0.0)
            await self._give_up("ha stopped")
        await self.coord.close()

    # -- one pass --------------------------------------------------------------------------------
    async def step(self) -> Action:
        """Read the instance, renew, publish, read etcd, decide and act once. A server that does not
        answer is not published (its record expires: it is no candidate), and its lease is given up
        at once if it led: a dead primary commits nothing, so nobody need wait for the lease."""
        try:
            await self.inst.refresh()
        except MultisiteError:
            if self.local.leading_term is not None:
                self.log.warning("ha: the instance server of %s does not answer: giving the leader key up",
                                 self.name)
                self.local = replace(self.local, leading_term=None, renewed_sent_at=None, rejoined_term=None)
                await self._give_up("the instance server does not answer")
            self.local = replace(self.local, following=None)
            raise
        await self._renew()
        try:
            await self._publish()
        except CoordinatorUnavailable as e:  # decide all the same: a leader cut off from etcd must fence
            self.log.warning("ha: %s: %s", e.code, e.message)
        view = await self.coord.view()
        now = time.monotonic()
        gone = self.local.leader_gone_since
        if view.reachable and view.leader is None:
            gone = now if gone is None else gone
        elif view.leader is not None:
            gone = None
        self.local = replace(self.local, role=self.inst.role, seqno=self.inst.seqno, leader_gone_since=gone)
        act = decide(view, self.local, now, self.timing)
        self.last_view, self.last_action = view, act
        await self._act(act, view)
        return act

    async def _renew(self) -> None:
        """As leader: renew the lease, then move the server's commit deadline with it."""
        if self.local.leading_term is None:
            return
        sent = time.monotonic()
        if await self.coord.renew():
            self.local = replace(self.local, renewed_sent_at=sent)
            await self.inst.call("lease", until=fence_deadline(sent, self.timing))

    async def _publish(self) -> None:
        listening = "" if self.replication.endswith(":0") else self.replication  # no receiver yet
        leading = self.local.leading_term is not None and self.local.renewed_sent_at is not None
        left = fence_deadline(self.local.renewed_sent_at, self.timing) - time.monotonic() if leading else None
        m = Member(self.name, self.group, self.cfg.client_address, listening, self.inst.seqno, self.inst.role,
                   links=self._links() if leading else (), lease_left_s=None if left is None else round(left, 3))
        await self.coord.publish(m)

    def _links(self) -> tuple[tuple[str, float, int, bool], ...]:
        """As leader: each secondary's lag, backlog and whether it counts for --min-confirm now."""
        st = self.inst.state
        counting = set(((st.get("min_confirm") or {}).get("counting") or {}))
        return tuple((n, float(src.get("lag_s", 0.0)), int(src.get("backlog", 0)), n in counting)
                     for n, src in sorted((st.get("sources") or {}).items()))

    async def _act(self, act: Action, view: View) -> None:
        if act.kind is Kind.WAIT:
            return
        if act.kind is not Kind.SOURCES:  # SOURCES comes every pass: _sources logs what it starts
            self._event(f"{act.kind.value} term {act.term} {act.leader} {','.join(act.targets)} {act.reason}")
        if act.kind is Kind.FENCE:
            await self._fence(act.reason)
        elif act.kind is Kind.CAMPAIGN:
            await self._campaign(act.term)
        elif act.kind is Kind.PROMOTE:
            await self._promote(view)
        elif act.kind is Kind.SOURCES:
            await self._sources(view, act.targets)
        elif act.kind is Kind.REJOIN:
            await self._rejoin(view, act)
        elif act.kind is Kind.HANDOVER:
            await self._hand_over(act.leader)
        elif act.kind is Kind.FOLLOW:
            await self._follow_receiver()
            self.local = replace(self.local, following=act.leader)

    # -- actions ---------------------------------------------------------------------------------
    async def _campaign(self, term: int) -> None:
        sent = time.monotonic()
        if not await self.coord.campaign(term, self.timing.ttl_s):
            return  # another member took it first: the next pass follows it
        await self.inst.call("lease", until=fence_deadline(sent, self.timing))
        self.local = replace(self.local, leading_term=term, renewed_sent_at=sent, following=None)
        self.log.warning("ha: %s holds the leader key of %s (term %d)", self.name, self.cfg.cluster, term)

    async def _promote(self, view: View) -> None:
        if self.inst.state.get("receiver"):
            await self.inst.call("receiver.stop")
        # the address of no receiver now: with port 0 (the default) it is published as none (``_publish``);
        # a fixed --replication address stays published, and a new leader's source retries it until it rejoins
        self.replication = self.cfg.replication_listen
        if self.inst.role != "primary":
            await self.inst.call("role", role="primary")
        await self.inst.refresh()
        self.log.warning("ha: %s is primary (term %s)", self.name, self.local.leading_term)
        if view.handover == self.name:
            await self.coord.clear_switchover()
        await self._sources(view, tuple(m.name for m in view.members if m.name != self.name))

    async def _sources(self, view: View, targets: tuple[str, ...]) -> None:
        """A source to each other member's receiver, started or pointed at its published address."""
        by_name = {m.name: m for m in view.members}
        for name in targets:
            m = by_name.get(name)
            if m is None or not m.replication:
                continue
            src = self.inst.source(name)
            if src is None or src.get("state") == "stopped":
                if src is not None:
                    await self.inst.call("source.stop", secondary=name, timeout_s=0.5)
                await self.inst.call("source.start", secondary=name, connect=m.replication,
                                     heartbeat_interval_s=0.2, heartbeat_timeout_s=max(1.0, 2 * self.timing.ttl_s))
                self._event(f"source to {name} at {m.replication}")
            elif src.get("connect") not in (None, m.replication):
                await self.inst.call("source.activate", secondary=name, connect=m.replication)

    async def _hand_over(self, target: str) -> None:
        """A switchover: stop taking commits, wait until ``target`` confirmed every transaction, then
        give the key up (``target`` is then the only candidate); nothing goes to a lost file."""
        await self.inst.call("lease", until=0.0)
        deadline = time.monotonic() + HANDOVER_TIMEOUT_S
        while True:
            await self.inst.refresh()
            src = self.inst.source(target) or {}
            if src.get("last_confirmed", -1) >= self.inst.seqno:
                break
            if time.monotonic() > deadline:
                self.log.warning("ha: switchover to %s: it did not confirm seqno %d within %g s; leading on",
                                 target, self.inst.seqno, HANDOVER_TIMEOUT_S)
                await self.coord.clear_switchover()
                await self.inst.call("lease", until=fence_deadline(self.local.renewed_sent_at or 0.0, self.timing))
                return
            sent = time.monotonic()
            if await self.coord.renew():  # keep the key while draining (commits stay closed)
                self.local = replace(self.local, renewed_sent_at=sent)
            await asyncio.sleep(0.01)
        self.log.warning("ha: switchover: %s has every transaction (seqno %d); handing the key over", target,
                         self.inst.seqno)
        await self._fence(f"switchover to {target}")

    async def _fence(self, reason: str) -> None:
        """Stop taking commits now, then stop the sources and give the key up (etcd may be gone)."""
        try:
            await self.inst.call("lease", until=0.0)
        finally:
            self.log.warning("ha: %s fenced: %s", self.name, reason)
            self.local = replace(self.local, leading_term=None, renewed_sent_at=None, rejoined_term=None)
        await self._give_up(reason)
        await self._stop_sources()

    async def _stop_sources(self) -> None:
        """Stop every source of the instance (a demoted primary feeds nobody): deactivated first, so
        the stop does not wait for a graceful close (what it had not delivered is rolled back anyway)."""
        for name in list((await self.inst.refresh()).get("sources") or {}):
            try:
                await self.inst.call("source.deactivate", secondary=name)
                await self.inst.call("source.stop", secondary=name, timeout_s=0.2)
            except MultisiteError as e:
                self.log.info("ha: source to %s: %s", name, e)

    async def _give_up(self, reason: str) -> None:
        try:
            await self.coord.resign()
        except MultisiteError as e:
            self.log.info("ha: could not give the leader key up (%s): it ends with its lease", e)

    async def _rejoin(self, view: View, act: Action) -> None:
        """Check this member's history against the new leader: roll back what it has past their
        common point into a lost-transaction file (fetchresync), then follow it."""
        leader = next((m for m in view.members if m.name == act.leader), None)
        if leader is None or not leader.client:
            return  # its record is not there yet
        await self._stop_sources()
        rep = await self.inst.call("rollback", fetchresync=leader.client)
        if rep.get("rolled_back"):
            self._event(f"rolled back against {leader.name}: {rep}")
            self.log.warning("ha: %s rolled back against the new primary %s: %s", self.name, leader.name, rep)
        await self._follow_receiver()  # a secondary now: its role refuses commits from here on
        await self.inst.call("lease", until=None)  # never lifted before, or a demoted primary takes commits
        self.local = replace(self.local, rejoined_term=act.term, following=act.leader)

    async def _follow_receiver(self) -> None:
        """A receiver for the leader's source, on the configured address (``--replication``), whose
        port 0 means a free port each time: never the port an earlier receiver of this member was
        given. That port went back to the kernel when the receiver stopped (a promotion), and an
        outgoing connection of any process may have been given it since, or left it in TIME_WAIT;
        either makes a new bind on it fail (EADDRINUSE, SO_REUSEADDR or not), at every pass: a demoted
        primary stayed a fenced primary with no receiver for good. The address bound is published,
        and the leader's source follows it (``_sources``)."""
        if not self.inst.state.get("receiver"):
            res = await self.inst.call("receiver.start", listen=self.cfg.replication_listen, **FOLLOW_KW)
            self.replication = res.get("listen", self.cfg.replication_listen)
        await self.inst.refresh()

    def _event(self, what: str) -> None:
        self.log.info("ha: %s", what.strip())
        self.events = (self.events + [(time.time(), what.strip())])[-50:]
