"""The catalog's decisions, sans-IO: who is a member, who is up, when to plan, what each container holds.

The catalog process (``net/grid_catalog.py``) owns the sockets, the clock and the state file; it feeds
this object what happened (a ``Register``, a ``Heartbeat``, the time passing) with ``now`` from its
clock, and after each call persists ``state_dict()`` when it changed, pushes ``assignments_for`` to
every connected container whose shards changed, and logs ``drain_log()``. Nothing here reads a clock.

How it works:

- A container is **up** from its registration until ``heartbeat_timeout_s`` passes without a word from
  it (a register or a heartbeat); then it is **lost** and ``plan`` runs without it (promotion, replicas
  placed elsewhere). A lost container that registers again is up again and ``plan`` places shards on it.
- ``plan`` (``placement.plan``) runs on every join, loss and change of a synchronous replica's
  currency, and only then; its result is the placement in force and goes into the state file.
- **Currency** (which synchronous replicas hold every committed transaction) is the primary's word:
  its heartbeats carry, per partition, the epoch and the replicas its ``voting.SyncReplicas`` counts
  current, and a primary reports a replica that fell behind (and waits for the ``HeartbeatAck``)
  before it acknowledges a commit without it. A promotion or a new primary starts with none current.
- After a restart the catalog reloads the placement and the members with their up/down state (a
  container lost before the restart stays lost: placing shards on it again would move the grid for
  nothing); every member up before counts as heard at the restart, so it gets one full
  ``heartbeat_timeout_s`` to reconnect before it is lost, and the placement is unchanged if they all
  come back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .placement import CAPACITY_SHARDS_DEFAULT, Container, Placement, Plan, Role, Shards, Shortfall, plan
from .policy import NAME_RE, GridPolicy
from .routing import RouteTable, table_from_routes
from .wire import GRID_WIRE_VERSION, Assignments, Heartbeat, Refused, RefusedCode, Register, View

HEARTBEAT_TIMEOUT_S_DEFAULT = 1.5  # failover in about 1.5 s (the issue asks < 2 s); lower loses containers falsely under load
STATE_FORMAT = 1


def heartbeat_interval_s(timeout_s: float) -> float:
    """How often containers heartbeat: four chances within the timeout."""
    return max(0.05, timeout_s / 4)


@dataclass
class Member:
    name: str
    zone: str | None
    address: str
    capacity: int = CAPACITY_SHARDS_DEFAULT
    last_heard: float = 0.0
    up: bool = True
    applied_version: int = -1
    seqnos: dict[int, int] | None = None
    loaders: dict[int, dict] | None = None  # issue 16: its shards' Loader reports (last heartbeat)
    draining: bool = False  # grid drain: it takes no shard, and gives its own away
    last_seqnos: dict[int, int] | None = None  # its shards' seqnos as last reported before it was lost

    def container(self) -> Container:
        return Container(self.name, self.zone, self.capacity)


class Catalog:
    """``mirror``: the placement and members exactly as ``state`` has them, with the shortfalls it
    recorded, and no plan run (a follower catalog or a container reading what the leader decided)."""

    def __init__(self, policy: GridPolicy, *, now: float, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S_DEFAULT,
                 state: Mapping[str, Any] | None = None, mirror: bool = False) -> None:
        if not heartbeat_timeout_s > 0:
            raise ConfigError(f"heartbeat_timeout_s must be more than 0, got {heartbeat_timeout_s}")
        self.policy = policy
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.members: dict[str, Member] = {}
        self.placement = Placement.empty(policy.partitions)
        self._log: list[str] = []
        if state is not None:
            self._restore(state, now, quiet=mirror)
        if mirror:
            self.last_plan = Plan(self.placement,
                                  shortfalls=tuple(Shortfall.from_dict(d) for d in (state or {}).get("shortfalls", ())),
                                  ignored=tuple((c, w) for c, w in (state or {}).get("ignored", ())))
        else:
            self.last_plan = self._plan("start" if state is None else "restart")

    # -- state file ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What survives a restart: the grid's name and partition count, the placement, the members."""
        return {"format": STATE_FORMAT, "grid": self.policy.name, "partitions": self.policy.partitions,
                "placement": self.placement.to_dict(),
                "members": [{"name": m.name, "zone": m.zone, "address": m.address, "capacity": m.capacity,
                             "up": m.up, **({"draining": True} if m.draining else {})}
                            for m in sorted(self.members.values(), key=lambda m: m.name)]}

    def _restore(self, state: Mapping[str, Any], now: float, quiet: bool = False) -> None:
        if state.get("grid") != self.policy.name:
            raise ConfigError(f"the catalog's state is of grid {state.get('grid')!r}, the policy names grid "
                              f"{self.policy.name!r}: start the catalog with that grid's policy, or use another "
                              f"directory for a new grid")
        if state.get("partitions") != self.policy.partitions:
            raise ConfigError(f"grid {self.policy.name!r} was placed with {state.get('partitions')} partitions, "
                              f"the policy now says {self.policy.partitions}: a grid's partition count is fixed "
                              f"for its life")
        self.placement = Placement.from_dict(state["placement"])
        for m in state.get("members", []):
            self.members[m["name"]] = Member(m["name"], m["zone"], m["address"], m["capacity"], last_heard=now,
                                             up=m.get("up", True), draining=m.get("draining", False))
        up = sum(m.up for m in self.members.values())
        if quiet:
            return
        self._log.append(f"reloaded placement version {self.placement.version} and {len(self.members)} "
                         f"container(s), {up} up before the restart: each of those has {self.heartbeat_timeout_s:g} s "
                         f"to reconnect")

    # -- events --------------------------------------------------------------------------------------
    def register(self, msg: Register, now: float, *, old_connected: bool = True) -> Refused | None:
        """A container's Register: ``None`` when accepted (it is up; the placement may have changed).
        ``old_connected``: whether a container of that name still holds a connection (if not, one at
        another address is the same container restarted, not a second one)."""
        if msg.version != GRID_WIRE_VERSION:
            return Refused(RefusedCode.VERSION, f"grid wire version {msg.version}; this catalog speaks "
                                                f"{GRID_WIRE_VERSION}")
        if msg.grid and msg.grid != self.policy.name:
            return Refused(RefusedCode.WRONG_GRID,
                           f"container {msg.container!r} belongs to grid {msg.grid!r}; this catalog serves grid "
                           f"{self.policy.name!r}: point it at its own grid's catalog (or give it a new --dir)")
        if not NAME_RE.fullmatch(msg.container or "") and ":" not in (msg.container or ""):
            return Refused(RefusedCode.BAD_REQUEST, f"container name {msg.container!r} is not a name or HOST:PORT")
        if msg.capacity < 0:
            return Refused(RefusedCode.BAD_REQUEST, f"capacity {msg.capacity} is negative")
        old = self.members.get(msg.container)
        if (old is not None and old.up and old.address != msg.address and old_connected
                and now - old.last_heard <= self.heartbeat_timeout_s):
            return Refused(RefusedCode.NAME_IN_USE,
                           f"a container named {msg.container!r} at {old.address} is up; this one is at {msg.address}: "
                           f"give it another --name, or stop the other (it is lost {self.heartbeat_timeout_s:g} s "
                           f"after its last heartbeat)")
        joined = old is None or not old.up or (old.zone, old.capacity) != (msg.zone, msg.capacity)
        m = Member(msg.container, msg.zone, msg.address, msg.capacity, last_heard=now)
        if old is not None:
            m.seqnos = old.seqnos if old.up else None
            m.draining, m.last_seqnos = old.draining, old.last_seqnos
        self.members[m.name] = m
        self._log.append(f"container {m.name} registered (zone {m.zone or '-'}, address {m.address})"
                         + ("" if old is None else " again"))
        if joined:
            self._replan(f"{m.name} joined")
        return None

    def heartbeat(self, msg: Heartbeat, now: float) -> Refused | None:
        m = self.members.get(msg.container)
        if m is None or not m.up:
            return Refused(RefusedCode.NOT_REGISTERED,
                           f"container {msg.container!r} is not registered (or was lost): register again")
        m.last_heard = now
        m.applied_version = msg.applied_version
        m.seqnos = dict(msg.seqnos)
        m.loaders = dict(msg.loaders)
        if msg.currency:
            self._update_currency(m, msg.currency)
        return None

    def tick(self, now: float) -> list[str]:
        """Time passed: the containers lost (silent for more than ``heartbeat_timeout_s``) now."""
        lost = [m.name for m in self.members.values()
                if m.up and now - m.last_heard > self.heartbeat_timeout_s]
        for name in lost:
            m = self.members[name]
            m.up, m.seqnos, m.last_seqnos = False, None, m.seqnos or m.last_seqnos
            self._log.append(f"container {name} lost: no heartbeat for {now - m.last_heard:.1f} s "
                             f"(timeout {self.heartbeat_timeout_s:g} s)")
        if lost:
            self._replan(f"{', '.join(lost)} lost")
        return lost

    def lost(self, name: str, now: float, why: str) -> bool:
        """The container ``name`` is lost for a reason the caller knows (with etcd: its lease ended):
        ``plan`` runs without it. False if it was not up."""
        m = self.members.get(name)
        if m is None or not m.up:
            return False
        m.up, m.seqnos, m.last_seqnos = False, None, m.seqnos or m.last_seqnos
        self._log.append(f"container {name} lost: {why}")
        self._replan(f"{name} lost")
        return True

    def report(self, name: str, now: float, applied_version: int, seqnos: Mapping[int, int],
               loaders: Mapping[int, dict] | None = None) -> None:
        """What a heartbeat tells besides currency (with etcd: the container's report key): for status."""
        m = self.members.get(name)
        if m is None or not m.up:
            return
        m.last_heard = now
        m.applied_version = applied_version
        m.seqnos = dict(seqnos)
        m.loaders = dict(loaders or {})

    def currency(self, container: str, currency: Mapping[int, tuple[int, list[str]]]) -> None:
        """A primary's currency report (see ``_update_currency``), from wherever it came."""
        m = self.members.get(container)
        if m is not None:
            self._update_currency(m, currency)

    # -- operator commands --------------------------------------------------------------------------
    def drain(self, name: str, on: bool, now: float) -> str:
        """``grid drain``: ``name`` takes no shard any more and gives its own away (its primaries to
        current synchronous replicas only, never by a promotion that may lose commits); ``on`` False
        undoes it. What was done, in words."""
        m = self.members.get(name)
        if m is None:
            raise ConfigError(f"no container {name!r} in grid {self.policy.name!r} (its containers: "
                              f"{', '.join(sorted(self.members)) or 'none'})")
        if m.draining == on:
            return f"container {name} is {'already' if on else 'not'} draining"
        m.draining = on
        self._log.append(f"container {name} {'draining: its shards go elsewhere' if on else 'no longer draining'}"
                         f" (operator)")
        self._replan(f"{name} {'drained' if on else 'undrained'}")
        left = len(self.assignments_for(name).shards)
        return (f"container {name} is draining; {left} shard(s) still on it (a primary waits for a current "
                f"synchronous replica); it may stop once it holds none" if on else
                f"container {name} takes shards again")

    def force_promote(self, partition: int, name: str, now: float) -> str:
        """``grid promote --force``: make replica ``name`` the primary of ``partition``, whose primary is
        lost and which waits because no synchronous replica is current. It may lose acknowledged commits:
        the returned warning says how many as far as the seqnos last reported tell."""
        parts = self.placement.partitions
        if not 0 <= partition < len(parts):
            raise ConfigError(f"grid {self.policy.name!r} has no partition {partition} (0..{len(parts) - 1})")
        s = parts[partition]
        prim = self.members.get(s.primary) if s.primary else None
        if prim is not None and prim.up:
            raise ConfigError(f"partition {partition}'s primary {s.primary} is up: a forced promotion is only for a "
                              f"partition whose primary is lost (for a planned hand-over, drain {s.primary})")
        if name not in (*s.sync_replicas, *s.async_replicas):
            raise ConfigError(f"container {name!r} holds no replica of partition {partition} (its replicas: "
                              f"{', '.join((*s.sync_replicas, *s.async_replicas)) or 'none'})")
        m = self.members.get(name)
        if m is None or not m.up:
            raise ConfigError(f"container {name!r} is not up: it cannot take partition {partition} over")
        have = (m.seqnos or {}).get(partition)
        had = (prim.last_seqnos or {}).get(partition) if prim is not None else None
        if have is not None and had is not None:
            lose = (f"it holds seqno {have}, the lost primary {s.primary} reported {had}: up to "
                    f"{max(0, had - have)} acknowledged transaction(s) may be lost")
        else:
            lose = f"how far it is behind the lost primary {s.primary or '-'} is not known"
        warning = (f"partition {partition}: {name} forced primary; {lose}, and any {s.primary or 'it'} took after "
                   f"its last report. They stay in {s.primary or 'the old primary'}'s journal and go to its "
                   f"lost-transaction file when it rejoins as a replica")
        new = Shards(name, tuple(c for c in s.sync_replicas if c != name),
                     tuple(c for c in s.async_replicas if c != name), frozenset(), s.epoch + 1)
        self.placement = Placement(tuple(new if i == partition else x for i, x in enumerate(parts)),
                                   self.placement.version + 1)
        self._log.append(f"FORCED promotion (operator): {warning} (epoch {new.epoch})")
        self._replan(f"{name} forced primary of partition {partition}")
        return warning

    def note(self, line: str) -> None:
        """A line for the catalog's log from the process around it."""
        self._log.append(line)

    # -- decisions -----------------------------------------------------------------------------------
    def _plan(self, why: str) -> Plan:
        up = [m.container() for m in self.members.values() if m.up and not m.draining]
        draining = [m.name for m in self.members.values() if m.up and m.draining]
        need = self.policy.initial_containers
        if len(up) < need and not any(s.primary for s in self.placement.partitions):
            # the first placement waits for the initial containers (numInitialContainers)
            reason = f"the first placement waits for {need} container(s) to be up ({len(up)} now: initial_containers)"
            return Plan(self.placement, shortfalls=tuple(
                Shortfall(i, Role.PRIMARY, 1, 0, reason, blocks_commits=True) for i in range(self.policy.partitions)))
        p = plan(self.policy, up, self.placement, draining)
        for mv in p.moves:
            self._log.append(f"{why}: {mv.kind.value} partition {mv.partition} {mv.role.value} on {mv.container}"
                             + (f" (from {mv.source})" if mv.source else "")
                             + (" MAY LOSE COMMITS" if mv.may_lose_commits else ""))
        self.placement = p.placement
        return p

    def _replan(self, why: str) -> None:
        before = self.placement.version
        self.last_plan = self._plan(why)
        if self.placement.version != before:
            self._log.append(f"placement version {self.placement.version}: {len(self.last_plan.moves)} move(s), "
                             f"{len(self.last_plan.under_replicated())} partition(s) under-replicated")

    def _update_currency(self, m: Member, currency: Mapping[int, tuple[int, list[str]]]) -> None:
        """A primary's report: the synchronous replicas it counts current in its epoch (it reports a
        replica that fell behind before it acknowledges any commit without it, so the catalog's set is
        never wider than the primary's). Reports of another epoch or from a container that is not the
        partition's primary (a deposed one) are ignored."""
        pl = self.placement
        for i, (epoch, names) in currency.items():
            if not 0 <= i < len(pl.partitions):
                continue
            s = pl.partitions[i]
            if s.primary != m.name or epoch != s.epoch:
                continue
            want = set(names) & set(s.sync_replicas)
            for r in s.sync_replicas:
                if (r in want) != (r in s.current):
                    pl = pl.with_current(i, r, r in want, epoch=epoch)
                    self._log.append(f"partition {i}: sync replica {r} is {'now' if r in want else 'no longer'} "
                                     f"current (reported by primary {m.name}, epoch {epoch})")
        if pl is not self.placement:
            self.placement = pl
            self._replan(f"currency reported by {m.name}")

    def stale_currency(self, container: str, currency: Mapping[int, tuple[int, list[str]]]) -> list[int]:
        """The partitions of a currency report that ``container`` no longer leads at that epoch: its
        primary there was deposed (and a replica it asked to vote may have been promoted), so it must
        not answer a commit of that partition as rolled back, nor acknowledge one without every voter."""
        parts = self.placement.partitions
        return sorted(i for i, (epoch, _) in currency.items()
                      if not 0 <= i < len(parts) or parts[i].primary != container or parts[i].epoch != epoch)

    # -- what the I/O layer reads -------------------------------------------------------------------
    def assignments_for(self, name: str) -> Assignments:
        shards = {i: s.role_of(name).value for i, s in enumerate(self.placement.partitions)
                  if s.role_of(name) is not None}
        views = {}
        for i in shards:
            s = self.placement.partitions[i]
            prim = self.members.get(s.primary) if s.primary else None
            views[i] = View(s.epoch, s.primary, prim.address if prim is not None and prim.up else None,
                            list(s.sync_replicas), list(s.async_replicas), self.policy.min_sync)
        return Assignments(self.policy.name, self.placement.version, shards,
                           heartbeat_interval_s(self.heartbeat_timeout_s), views, self.heartbeat_timeout_s,
                           self.policy.partitions,
                           {m.name: {k: v for k, v in m.to_dict().items() if k != "name"}
                            for m in self.policy.maps if m.loader})

    def route_table(self) -> RouteTable:
        """Each partition's primary by address (None while its container is down: a client waits, then
        asks again), at the placement's version; epochs tell a client a route changed."""
        def address(c: str | None) -> str | None:
            m = self.members.get(c) if c else None
            return m.address if m is not None and m.up else None
        return table_from_routes(self.policy.name, self.placement.version,
                                 [(address(p), e) for p, e in self.placement.routes()])

    def drain_log(self) -> list[str]:
        out, self._log = self._log, []
        return out

    def status(self, now: float) -> dict[str, Any]:
        """The shape of ``grid status --json`` (stable: fields are added, never renamed)."""
        parts = []
        for i, s in enumerate(self.placement.partitions):
            seqnos = {c: self.members[c].seqnos.get(i) for c in s.containers()
                      if c in self.members and self.members[c].seqnos and i in self.members[c].seqnos}
            prim = seqnos.get(s.primary) if s.primary else None
            backlog = {c: prim - seqnos[c] for c in (*s.sync_replicas, *s.async_replicas)
                       if prim is not None and c in seqnos}
            if self.policy.min_sync > 0:
                window = "none: a commit is acknowledged only once min_sync synchronous replicas hold it"
            else:
                lag = min(backlog.values(), default=None)
                window = ("min_sync is 0 and no replica reports: a loss of the primary loses what it holds alone"
                          if lag is None else
                          f"min_sync is 0: a promotion may lose the replicas' lag, now {lag} transaction(s)")
            parts.append({"partition": i, **s.to_dict(), "seqnos": seqnos, "backlog": backlog, "loss_window": window})
            if any(m.loader for m in self.policy.maps):  # issue 16: the primary's Loader, the replicas' buffers
                reports = {c: self.members[c].loaders.get(i) for c in s.containers()
                           if c in self.members and self.members[c].up and self.members[c].loaders}
                parts[-1]["loader"] = {"primary": reports.get(s.primary) if s.primary else None,
                                       "buffered": {c: r["buffered"] for c, r in reports.items()
                                                    if r and "buffered" in r}}
        counts = self.placement.shard_counts()
        prim = {s.primary: 0 for s in self.placement.partitions}
        for s in self.placement.partitions:
            prim[s.primary] += 1
        containers = [{"name": m.name, "zone": m.zone, "address": m.address, "up": m.up,
                       "last_heartbeat_age_s": round(now - m.last_heard, 3), "shards": counts.get(m.name, 0),
                       "primaries": prim.get(m.name, 0), "applied_version": m.applied_version,
                       "capacity": m.capacity, "draining": m.draining}
                      for m in sorted(self.members.values(), key=lambda m: m.name)]
        return {"grid": self.policy.name, "policy": self.policy.to_dict(), "version": self.placement.version,
                "heartbeat_timeout_s": self.heartbeat_timeout_s, "partitions": parts, "containers": containers,
                "routes": self.route_table().to_dict(),
                "under_replicated": [sf.to_dict() for sf in self.last_plan.shortfalls],
                "ignored": [{"container": c, "why": w} for c, w in self.last_plan.ignored]}
