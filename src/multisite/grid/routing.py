"""Which partition a key belongs to, and which container is that partition's primary.

A key's partition is a hash of its **first subscript** only, so that every key under one first
subscript (an account and all its sub-entries) lives in one partition and can be updated in one
transaction. The hash is fixed here for the grid's life, across restarts, machines and Python versions:
the first subscript is encoded with the project's key encoding (``keys.encode_key``, already the bytes
on disk and on the wire), hashed with BLAKE2b to 8 bytes, read big-endian, modulo ``partitions``.
Python's ``hash`` is salted per process and must never be used for it. ``ROUTING_HASH`` names the
scheme so that a catalog can refuse a client that routes differently; the values are pinned by a test.

The route table is the catalog's answer to "who is primary where": per partition the primary's
address and an **epoch** that grows each time the partition's primary changes. ``RouteCache`` is the
client's copy and its decisions, sans-IO: when a container answers "not primary" or cannot be reached,
it says whether to fetch a new table or to retry the same primary after a pause.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from ..errors import ConfigError, KeyTypeError, WrongPartition
from ..keys import check_key, encode_key

ROUTING_HASH = "blake2b-8/first-subscript"  # bump the name if the scheme ever changes: data would move


def partition_of_subscript(first: str | int, partitions: int) -> int:
    """The partition of every key whose first subscript is ``first``."""
    if partitions < 1:
        raise ConfigError(f"partitions must be at least 1, got {partitions}")
    (first,) = check_key((first,))
    digest = hashlib.blake2b(encode_key((first,)), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_of(key: tuple | list, partitions: int) -> int:
    """The partition of ``key`` (a tuple of str and int): that of its first subscript."""
    key = check_key(key)
    return partition_of_subscript(key[0], partitions)


def routing_partition(routing_key: str | int | tuple | list, partitions: int) -> int:
    """The partition a transaction is pinned to: a routing key is a first subscript or a whole key."""
    if isinstance(routing_key, (tuple, list)):
        return partition_of(routing_key, partitions)
    if type(routing_key) not in (str, int):
        raise KeyTypeError(f"a routing key is a str, an int or a key tuple, got {type(routing_key).__name__} "
                           f"{routing_key!r}")
    return partition_of_subscript(routing_key, partitions)


def check_in_partition(key: tuple | list, partition: int, partitions: int) -> tuple:
    """``key`` checked, or WrongPartition: a transaction pinned to ``partition`` may touch only its keys
    (a transaction over two partitions would need a two-phase commit the grid does not do)."""
    key = check_key(key)
    p = partition_of_subscript(key[0], partitions)
    if p != partition:
        raise WrongPartition(f"key {key!r} is in partition {p}, not in partition {partition} of this "
                             f"transaction: a grid transaction updates one partition; use one first subscript "
                             f"(or commit the keys in separate transactions)", key=key, partition=p,
                             expected=partition)
    return key


# -- the route table ------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Route:
    partition: int
    primary: str | None  # the primary's container address (HOST:PORT); None while it has no primary
    epoch: int = 0  # grows with every change of the partition's primary

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "primary": self.primary, "epoch": self.epoch}


@dataclass(frozen=True)
class RouteTable:
    """The catalog's routes at placement ``version`` (which only grows)."""

    grid: str
    partitions: int
    version: int
    routes: tuple[Route, ...]
    hash: str = ROUTING_HASH

    def __post_init__(self) -> None:
        if len(self.routes) != self.partitions or any(r.partition != i for i, r in enumerate(self.routes)):
            raise ConfigError(f"route table of grid {self.grid!r} must list partitions 0..{self.partitions - 1} "
                              f"in order, got {[r.partition for r in self.routes]}")

    def route(self, partition: int) -> Route:
        if not 0 <= partition < self.partitions:
            raise WrongPartition(f"grid {self.grid!r} has partitions 0..{self.partitions - 1}, not {partition}",
                                 partition=partition)
        return self.routes[partition]

    def route_for_key(self, key: tuple | list) -> Route:
        return self.routes[partition_of(key, self.partitions)]

    def primary_for(self, partition: int) -> str | None:
        return self.route(partition).primary

    def partitions_of(self, address: str) -> tuple[int, ...]:
        """Partitions whose primary is at ``address``."""
        return tuple(r.partition for r in self.routes if r.primary == address)

    def to_dict(self) -> dict[str, Any]:
        return {"grid": self.grid, "partitions": self.partitions, "version": self.version, "hash": self.hash,
                "routes": [r.to_dict() for r in self.routes]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RouteTable:
        return cls(grid=d["grid"], partitions=d["partitions"], version=d["version"], hash=d.get("hash", ROUTING_HASH),
                   routes=tuple(Route(r["partition"], r["primary"], r["epoch"]) for r in d["routes"]))


class Next(Enum):
    """What a client does after a failed request to a partition's primary."""

    REFRESH = "refresh"  # fetch a new route table from the catalog, then retry
    WAIT = "wait"  # the route is right and the container is behind: retry the same primary after a pause


class RouteCache:
    """A client's copy of the route table and its decisions (sans-IO: the client does the fetching).

    A partition is **stale** once a request to its primary failed in a way that a new table can fix.
    After "not primary" it stays stale until a table arrives whose route for it has a newer epoch or
    another address (a table fetched before the catalog noticed says the same thing again, and the
    client keeps refreshing, after a pause, within its own deadline). After a broken or refused
    connection the next table clears it whatever it says: the container may only have reset a
    connection, and trying it again (after the client's pause) is how to know."""

    def __init__(self, grid: str, table: RouteTable | None = None):
        self.grid = grid
        self.table: RouteTable | None = None
        # partition -> (epoch, address) of the route that failed, and whether only a new route clears it
        self._stale: dict[int, tuple[int, str | None, bool]] = {}
        if table is not None:
            self.install(table)

    def install(self, table: RouteTable) -> bool:
        """Take ``table`` unless it is older than the one held (answers can cross); True if taken."""
        if table.grid != self.grid:
            raise ConfigError(f"route table is for grid {table.grid!r}, this client is for grid {self.grid!r}")
        if table.hash != ROUTING_HASH:
            raise ConfigError(f"grid {table.grid!r} routes keys with {table.hash!r}, this client with "
                              f"{ROUTING_HASH!r}: upgrade the client")
        if self.table is not None:
            if table.partitions != self.table.partitions:
                raise ConfigError(f"grid {self.grid!r} changed from {self.table.partitions} to {table.partitions} "
                                  f"partitions: a grid's partition count is fixed for its life")
            if table.version < self.table.version:
                return False
        self.table = table
        for p, (epoch, address, sticky) in list(self._stale.items()):
            r = table.routes[p]
            if not sticky or r.epoch > epoch or (r.primary is not None and r.primary != address):
                del self._stale[p]  # a new primary, the same one at another address, or worth another try
        return True

    def needs_refresh(self, partition: int | None = None) -> bool:
        """No table yet, or ``partition`` (any, if None) is stale or has no primary."""
        if self.table is None:
            return True
        if partition is None:
            return bool(self._stale) or any(r.primary is None for r in self.table.routes)
        return partition in self._stale or self.table.route(partition).primary is None

    def route(self, partition: int) -> Route | None:
        """The primary to ask, or None when a refresh must come first."""
        if self.needs_refresh(partition):
            return None
        return self.table.route(partition)

    def route_for_key(self, key: tuple | list) -> Route | None:
        if self.table is None:
            return None
        return self.route(partition_of(key, self.table.partitions))

    def not_primary(self, partition: int, container_epoch: int) -> Next:
        """The container we routed to says it is not the partition's primary; ``container_epoch`` is the
        newest epoch of the partition it knows. If it knows no newer epoch than our route, it has not
        taken its assignment yet (epochs grow with every change of primary): wait. Otherwise our table
        is out of date: refresh."""
        route = self.table.route(partition)
        if container_epoch <= route.epoch:  # same epoch: the route's own primary, still taking the role over
            return Next.WAIT
        self._stale[partition] = (route.epoch, route.primary, True)
        return Next.REFRESH

    def unreachable(self, address: str) -> tuple[int, ...]:
        """The container at ``address`` is gone: every partition it was primary for is stale (the catalog
        promotes replicas for them). Returns those partitions."""
        parts = self.table.partitions_of(address) if self.table is not None else ()
        for p in parts:
            r = self.table.routes[p]
            self._stale[p] = (r.epoch, r.primary, False)
        return parts

    def stale(self) -> tuple[int, ...]:
        return tuple(sorted(self._stale))


def table_from_routes(grid: str, version: int, routes: Iterable[tuple[str | None, int]]) -> RouteTable:
    """A table from ``(primary, epoch)`` per partition, in partition order."""
    rs = tuple(Route(i, primary, epoch) for i, (primary, epoch) in enumerate(routes))
    return RouteTable(grid=grid, partitions=len(rs), version=version, routes=rs)
