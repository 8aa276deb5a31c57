"""Placement of shards on containers: the catalog's decisions as one pure function.

``plan(policy, containers, current)`` takes the deployment policy, the containers up now (name, zone,
capacity in shards) and the placement in force, and returns the next placement with the moves that
lead there and the partitions it could not place fully (with the reason). The catalog process calls it
whenever a container joins, is lost, or reports a replica current; it stores the result crash-safely and
tells the containers. Same inputs, same plan: no randomness, no clock, ties broken by container name.

Rules, in the order they are applied:

1. **Drop** shards on containers that are down (or that break the rules: a second shard of a partition
   in one container, or in one zone when the policy has zones).
2. **Promote** when a partition's primary is down: a *current* synchronous replica first (it holds
   every committed transaction). With ``min_sync = 0`` any replica may be promoted, and the move says
   commits may be lost (the loss window is the replicas' lag). With ``min_sync >= 1`` and no current
   synchronous replica up, promoting would lose acknowledged commits, so the partition keeps its
   primary on the down container and is reported unavailable until that container returns. A partition
   never placed gets a fresh primary. A promotion bumps the partition's epoch (clients refresh their
   routes) and makes the other synchronous replicas not current: they re-register with the new primary.
3. **Place** missing shards: first every missing primary, then synchronous replicas, then asynchronous
   ones, each on the least loaded container that holds no shard of the partition (nor its zone) and has
   room. A synchronous slot with no container free takes an asynchronous replica of the partition over.
   A new replica is not current: it copies a checkpoint first.
4. **Rebalance** shards: while one container holds two shards more than another, move one replica
   (asynchronous first; a synchronous one only if the partition keeps ``min_sync`` current others).
   Only as many moves as balance needs: a join moves about total/containers shards, never all.
5. **Rebalance primaries** by swapping a primary with a current synchronous replica on a container with
   fewer primaries (a planned switchover: the data is already there; nobody's currency changes).

Whatever cannot be met is reported as a ``Shortfall`` per partition and role, with the reason (too few
containers, too few zones, full containers, no current replica to promote).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Mapping

from ..errors import ConfigError
from .policy import GridPolicy

CAPACITY_SHARDS_DEFAULT = 1024  # shards a container hosts when it does not say (one instance directory each)


class Role(Enum):
    PRIMARY = "primary"
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, order=True)
class Container:
    name: str  # its address (HOST:PORT), unique in the grid
    zone: str | None = None
    capacity: int = CAPACITY_SHARDS_DEFAULT  # most shards it will host


@dataclass(frozen=True)
class Shards:
    """One partition's shards: container names per role."""

    primary: str | None = None
    sync_replicas: tuple[str, ...] = ()
    async_replicas: tuple[str, ...] = ()
    current: frozenset[str] = frozenset()  # synchronous replicas known to hold every committed transaction
    epoch: int = 0  # grows with each change of primary

    def containers(self) -> tuple[str, ...]:
        return ((self.primary,) if self.primary else ()) + self.sync_replicas + self.async_replicas

    def role_of(self, container: str) -> Role | None:
        if container == self.primary:
            return Role.PRIMARY
        if container in self.sync_replicas:
            return Role.SYNC
        if container in self.async_replicas:
            return Role.ASYNC
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"primary": self.primary, "sync": list(self.sync_replicas), "async": list(self.async_replicas),
                "current": sorted(self.current), "epoch": self.epoch}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Shards:
        return cls(d["primary"], tuple(d["sync"]), tuple(d["async"]), frozenset(d["current"]), d["epoch"])


@dataclass(frozen=True)
class Placement:
    partitions: tuple[Shards, ...]
    version: int = 0  # grows with every plan that changed something

    @classmethod
    def empty(cls, partitions: int) -> Placement:
        return cls(tuple(Shards() for _ in range(partitions)))

    def with_current(self, partition: int, container: str, current: bool, *, epoch: int) -> Placement:
        """A synchronous replica reported caught up (or fell behind) by the partition's primary of
        ``epoch``: the catalog's record of it. A "caught up" from an earlier epoch is ignored: it was
        caught up with a primary since replaced, not with the one now taking commits."""
        s = self.partitions[partition]
        if container not in s.sync_replicas or (current and epoch != s.epoch):
            return self
        cur = s.current | {container} if current else s.current - {container}
        if cur == s.current:
            return self
        parts = list(self.partitions)
        parts[partition] = replace(s, current=frozenset(cur))
        return Placement(tuple(parts), self.version + 1)

    def routes(self) -> list[tuple[str | None, int]]:
        """``(primary, epoch)`` per partition: the input of ``routing.table_from_routes``."""
        return [(s.primary, s.epoch) for s in self.partitions]

    def shard_counts(self) -> Counter:
        return Counter(c for s in self.partitions for c in s.containers())

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "partitions": [s.to_dict() for s in self.partitions]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Placement:
        return cls(tuple(Shards.from_dict(s) for s in d["partitions"]), d["version"])


class MoveKind(Enum):
    PLACE = "place"  # a new shard: a checkpoint copy for a replica, an empty instance for a new partition
    DROP = "drop"  # a shard on a container that is down (or breaks a rule)
    PROMOTE = "promote"  # a replica becomes primary after the primary's container was lost
    TO_SYNC = "to-sync"  # an asynchronous replica becomes synchronous
    RELOCATE = "relocate"  # a replica moves to another container (placed there, dropped here)
    SWAP = "swap"  # primary and a current synchronous replica change roles


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    partition: int
    container: str  # where the shard is (now)
    role: Role
    source: str | None = None  # RELOCATE: from; SWAP: the old primary; PROMOTE: the lost primary
    may_lose_commits: bool = False  # PROMOTE of a replica that was not current (min_sync = 0 only)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "partition": self.partition, "container": self.container,
                "role": self.role.value, "source": self.source, "may_lose_commits": self.may_lose_commits}


@dataclass(frozen=True)
class Shortfall:
    """A partition that has fewer shards of ``role`` than the policy wants, and why."""

    partition: int
    role: Role
    wanted: int
    placed: int
    reason: str
    blocks_commits: bool = False  # fewer synchronous replicas than min_sync, or no primary up

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "role": self.role.value, "wanted": self.wanted,
                "placed": self.placed, "reason": self.reason, "blocks_commits": self.blocks_commits}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Shortfall:
        return cls(d["partition"], Role(d["role"]), d["wanted"], d["placed"], d["reason"], d["blocks_commits"])


@dataclass(frozen=True)
class Plan:
    placement: Placement
    moves: tuple[Move, ...] = ()
    shortfalls: tuple[Shortfall, ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()  # (container, why it takes no shards)

    @property
    def changed(self) -> bool:
        return bool(self.moves)

    def under_replicated(self) -> tuple[int, ...]:
        return tuple(sorted({s.partition for s in self.shortfalls}))

    def to_dict(self) -> dict[str, Any]:
        return {"placement": self.placement.to_dict(), "moves": [m.to_dict() for m in self.moves],
                "shortfalls": [s.to_dict() for s in self.shortfalls],
                "ignored": [{"container": c, "why": w} for c, w in self.ignored]}


@dataclass
class _Part:
    primary: str | None
    sync: list[str]
    asyn: list[str]
    current: set[str]
    epoch: int
    primary_down: bool = False

    def members(self) -> list[str]:
        return ([self.primary] if self.primary and not self.primary_down else []) + self.sync + self.asyn


@dataclass
class _Planner:
    policy: GridPolicy
    live: dict[str, Container]
    parts: list[_Part]
    moves: list[Move] = field(default_factory=list)
    load: Counter = field(default_factory=Counter)
    prim: Counter = field(default_factory=Counter)
    draining: frozenset[str] = frozenset()

    def zone(self, c: str) -> str | None:
        return self.live[c].zone if self.policy.zones else None

    def fits(self, p: _Part, c: str, *, leaving: str | None = None) -> bool:
        """May ``c`` take a shard of ``p`` (``leaving``: the member it would replace)?"""
        others = [m for m in p.members() if m != leaving]
        if c in others or self.load[c] >= self.live[c].capacity:
            return False
        return not self.policy.zones or self.zone(c) not in {self.zone(m) for m in others}

    def best(self, p: _Part, role: Role) -> str | None:
        cands = [c for c in self.live if self.fits(p, c)]
        if role is Role.PRIMARY:
            return min(cands, key=lambda c: (self.prim[c], self.load[c], c), default=None)
        return min(cands, key=lambda c: (self.load[c], self.prim[c], c), default=None)

    # -- 1. drop --------------------------------------------------------------------------------------
    def drop(self, i: int, s: Shards) -> _Part:
        p = _Part(s.primary, [], [], set(), s.epoch)
        p.primary_down = s.primary is not None and s.primary not in self.live
        seen_c: set[str] = set()
        seen_z: set[str | None] = set()
        if s.primary and not p.primary_down:
            seen_c.add(s.primary)
            seen_z.add(self.zone(s.primary))
            self.load[s.primary] += 1
            self.prim[s.primary] += 1
        for role, names, out in ((Role.SYNC, s.sync_replicas, p.sync), (Role.ASYNC, s.async_replicas, p.asyn)):
            for c in names:
                ok = c in self.live and c not in seen_c and not (self.policy.zones and self.zone(c) in seen_z)
                if not ok:
                    self.moves.append(Move(MoveKind.DROP, i, c, role))
                    continue
                seen_c.add(c)
                seen_z.add(self.zone(c))
                self.load[c] += 1
                out.append(c)
        p.current = set(s.current) & set(p.sync)
        # More replicas than the policy allows (max_sync or max_async lowered in grid.toml): drop the
        # extras, keeping current synchronous replicas first (they are the ones a promotion may use).
        pol = self.policy
        for role, names, want in ((Role.SYNC, p.sync, pol.max_sync), (Role.ASYNC, p.asyn, pol.max_async)):
            keep = sorted(names, key=lambda c: c not in p.current)[:want]  # stable: in their order otherwise
            for c in [c for c in names if c not in keep]:
                names.remove(c)
                p.current.discard(c)
                self.load[c] -= 1
                self.moves.append(Move(MoveKind.DROP, i, c, role))
        return p

    # -- 2. promote -----------------------------------------------------------------------------------
    def promote(self, i: int, p: _Part) -> None:
        if not (p.primary is None or p.primary_down) or not (p.sync or p.asyn):
            return
        lost = p.primary
        by_prim = lambda c: (self.prim[c], c)  # noqa: E731
        current = sorted((c for c in p.sync if c in p.current), key=by_prim)
        lossy = False
        if current:
            new = current[0]
        elif lost in self.draining:
            return  # a planned hand-over waits for a current synchronous replica: the primary is alive
        elif self.policy.min_sync == 0 or lost is None:
            new = sorted(p.sync, key=by_prim)[0] if p.sync else sorted(p.asyn, key=by_prim)[0]
            lossy = True
        else:
            return  # waits for the lost primary's container: every acknowledged commit is there
        if new in p.sync:
            p.sync.remove(new)
        else:
            p.asyn.remove(new)
        p.primary, p.primary_down = new, False
        p.current = set()  # the others re-register with the new primary
        p.epoch += 1
        self.prim[new] += 1
        self.moves.append(Move(MoveKind.PROMOTE, i, new, Role.PRIMARY, source=lost, may_lose_commits=lossy))

    # -- 3. place -------------------------------------------------------------------------------------
    def place_primary(self, i: int, p: _Part) -> None:
        if p.primary is not None:
            return
        c = self.best(p, Role.PRIMARY)
        if c is not None:
            p.primary = c
            p.epoch += 1
            self.load[c] += 1
            self.prim[c] += 1
            self.moves.append(Move(MoveKind.PLACE, i, c, Role.PRIMARY))

    def place_replicas(self, i: int, p: _Part, role: Role) -> None:
        if p.primary is None or p.primary_down:
            return  # a replica copies its primary: none to copy from
        names, want = (p.sync, self.policy.max_sync) if role is Role.SYNC else (p.asyn, self.policy.max_async)
        while len(names) < want:
            c = self.best(p, role)
            if c is not None:
                self.load[c] += 1
                names.append(c)
                self.moves.append(Move(MoveKind.PLACE, i, c, role))
            elif role is Role.SYNC and p.asyn:
                c = p.asyn.pop(0)
                names.append(c)
                self.moves.append(Move(MoveKind.TO_SYNC, i, c, Role.SYNC))
            else:
                return

    # -- 4. rebalance shards --------------------------------------------------------------------------
    def rebalance_shards(self) -> None:
        while True:
            order = sorted(self.live, key=lambda c: (self.load[c], c))
            if not order or self.load[order[-1]] - self.load[order[0]] <= 1:
                return
            if not self._relocate_one(order):
                return

    def _relocate_one(self, order: list[str]) -> bool:
        for hi in reversed(order):
            for lo in order:
                if self.load[hi] - self.load[lo] <= 1:
                    break
                for role in (Role.ASYNC, Role.SYNC):
                    for i, p in enumerate(self.parts):
                        names = p.asyn if role is Role.ASYNC else p.sync
                        if hi not in names or not self.fits(p, lo, leaving=hi):
                            continue
                        if role is Role.SYNC and len(p.current - {hi}) < self.policy.min_sync:
                            continue  # moving it would leave commits short of votes
                        names[names.index(hi)] = lo
                        p.current.discard(hi)
                        self.load[hi] -= 1
                        self.load[lo] += 1
                        self.moves.append(Move(MoveKind.RELOCATE, i, lo, role, source=hi))
                        return True
        return False

    # -- 5. rebalance primaries -----------------------------------------------------------------------
    def rebalance_primaries(self) -> None:
        while self._swap_one():
            pass

    def _swap_one(self) -> bool:
        for hi in sorted(self.live, key=lambda c: (-self.prim[c], c)):
            for i, p in enumerate(self.parts):
                if p.primary != hi or p.primary_down:
                    continue
                cands = sorted((c for c in p.current if self.prim[c] + 1 < self.prim[hi]),
                               key=lambda c: (self.prim[c], c))
                if not cands:
                    continue
                new = cands[0]
                p.sync[p.sync.index(new)] = hi
                p.current = (p.current - {new}) | {hi}
                p.primary = new
                p.epoch += 1
                self.prim[hi] -= 1
                self.prim[new] += 1
                self.moves.append(Move(MoveKind.SWAP, i, new, Role.PRIMARY, source=hi))
                return True
        return False

    # -- shortfalls -----------------------------------------------------------------------------------
    def shortfalls(self, i: int, p: _Part) -> list[Shortfall]:
        pol = self.policy
        out = []
        if p.primary is None or p.primary_down:
            if p.primary in self.draining:
                why = (f"primary container {p.primary} is draining and no current synchronous replica can take "
                       f"the partition over: it stays primary until one is current (with max_sync = 0, "
                       f"`grid promote --force` a replica)")
            elif p.primary_down and not (p.sync or p.asyn):
                why = (f"primary container {p.primary} is down and holds the only copy of the partition: "
                       f"waiting for {p.primary} to return")
            elif p.primary_down:
                why = (f"primary container {p.primary} is down and no current synchronous replica is up; "
                       f"promoting another would lose acknowledged commits (min_sync = {pol.min_sync}): "
                       f"waiting for {p.primary} to return")
            elif not self.live:
                why = "no container is up"
            else:
                why = "every container that could take the shard is full (capacity)"
            out.append(Shortfall(i, Role.PRIMARY, 1, 0, why, blocks_commits=p.primary not in self.draining))
        for role, have, want in ((Role.SYNC, len(p.sync), pol.max_sync), (Role.ASYNC, len(p.asyn), pol.max_async)):
            if have < want:
                why = self._why_short()
                blocks = role is Role.SYNC and have < pol.min_sync
                if blocks:
                    why += (f"; commits are refused (ReplicationVotedToRollback) with fewer than min_sync = "
                            f"{pol.min_sync} synchronous replicas")
                out.append(Shortfall(i, role, want, have, why, blocks_commits=blocks))
        return out

    def _why_short(self) -> str:
        pol = self.policy
        need = pol.shards_per_partition
        if not self.live:
            return "no container is up"
        if pol.zones:
            zones = {c.zone for c in self.live.values()}
            if len(zones) < need:
                return (f"only {len(zones)} zone(s) have containers up ({', '.join(sorted(zones))}); a partition "
                        f"needs {need} shards (1 primary + {pol.max_sync} sync + {pol.max_async} async), each in "
                        f"its own zone")
        if len(self.live) < need:
            return (f"only {len(self.live)} container(s) are up; a partition needs {need} shards (1 primary + "
                    f"{pol.max_sync} sync + {pol.max_async} async), each in its own container")
        return "every container that could take the shard is full (capacity)"


def plan(policy: GridPolicy, containers: Iterable[Container], current: Placement | None = None,
         draining: Iterable[str] = ()) -> Plan:
    """The next placement for ``containers`` (those up now) from ``current`` (None: nothing placed yet).
    ``draining``: containers up but to be emptied (``grid drain``): they take no shard, their replicas
    are placed elsewhere, and each of their primaries goes to a current synchronous replica only, never
    by a promotion that may lose commits; until one is current it stays where it is."""
    current = current or Placement.empty(policy.partitions)
    if len(current.partitions) != policy.partitions:
        raise ConfigError(f"placement has {len(current.partitions)} partitions, grid {policy.name!r} has "
                          f"{policy.partitions}: a grid's partition count is fixed for its life")
    live: dict[str, Container] = {}
    ignored: list[tuple[str, str]] = []
    for c in sorted(containers):
        if c.name in live:
            raise ConfigError(f"container {c.name!r} is listed twice")
        if policy.zones and c.zone not in policy.zones:
            ignored.append((c.name, f"zone {c.zone!r} is not one of the policy's zones ({', '.join(policy.zones)})"))
        elif c.capacity < 1:
            ignored.append((c.name, f"capacity {c.capacity}: it takes no shards"))
        else:
            live[c.name] = c
    pl = _Planner(policy, live, [], draining=frozenset(draining) - set(live))
    pl.parts = [pl.drop(i, s) for i, s in enumerate(current.partitions)]
    for i, p in enumerate(pl.parts):
        pl.promote(i, p)
    for i, p in enumerate(pl.parts):
        pl.place_primary(i, p)
    for role in (Role.SYNC, Role.ASYNC):
        for i, p in enumerate(pl.parts):
            pl.place_replicas(i, p, role)
    pl.rebalance_shards()
    pl.rebalance_primaries()
    shards = tuple(Shards(p.primary, tuple(p.sync), tuple(p.asyn), frozenset(p.current & set(p.sync)), p.epoch)
                   for p in pl.parts)
    version = current.version + 1 if pl.moves else current.version
    short = [s for i, p in enumerate(pl.parts) for s in pl.shortfalls(i, p)]
    return Plan(Placement(shards, version), tuple(pl.moves), tuple(short), tuple(ignored))
