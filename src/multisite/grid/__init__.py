"""The grid: partitioned shards with synchronous and asynchronous replicas (see DESIGN.md).

Sans-IO in this folder: the deployment policy, routing of keys to partitions, placement of shards on
containers, the synchronous replicas' commit vote, the catalog's decisions (``catalog``) and the
catalog ⇄ container wire (``wire``), the data wire (``shard_wire``), where a replica starts
(``shipping``) and the Loader contract (``loader``). The processes that drive them are in ``server/``:
the catalog, the containers and their shards, the Loaders' runner, the client and start/stop.

What a user writes against: ``multisite.grid.connect(catalog)`` (the client), ``Loader`` (the contract
of a database the grid writes through to) with ``SQLiteLoader`` and ``PostgresLoader``, and the
policy and routing types below.
"""

from .loader import Change, Loader, LoaderDown, LoaderError, LoaderRefused, TxnId
from .placement import Container, Move, MoveKind, Placement, Plan, Role, Shards, Shortfall, plan
from .policy import GridPolicy, MapPolicy, load_policy, parse_policy, policy_from_dict
from .routing import (ROUTING_HASH, Next, Route, RouteCache, RouteTable, check_in_partition, partition_of,
                      partition_of_subscript, routing_partition, table_from_routes)
from .voting import CommitVote, Decision, SyncReplicas, Vote

__all__ = ["connect", "Change", "Loader", "LoaderDown", "LoaderError", "LoaderRefused", "TxnId",
           "SQLiteLoader", "PostgresLoader",
           "Container", "Move", "MoveKind", "Placement", "Plan", "Role", "Shards", "Shortfall", "plan",
           "GridPolicy", "MapPolicy", "load_policy", "parse_policy", "policy_from_dict",
           "ROUTING_HASH", "Next", "Route", "RouteCache", "RouteTable", "check_in_partition", "partition_of",
           "partition_of_subscript", "routing_partition", "table_from_routes",
           "CommitVote", "Decision", "SyncReplicas", "Vote"]


def connect(catalog: str, *, timeout_s: float = 30.0, **auth):
    """A client of the grid whose catalog listens at ``catalog`` (HOST:PORT; with several catalogs,
    ``"H1:P1,H2:P2"``: whichever answers). ``auth``: ``user``, ``password``, ``tls_ca``, ``tls_cert``,
    ``tls_key`` on a grid with TLS and users (``server/client.py``)."""
    from .server.client import connect as _connect

    return _connect(catalog, timeout_s=timeout_s, **auth)


def __getattr__(name: str):
    """The Loaders that come with multisite, imported when first asked for (the package stays sans-IO)."""
    if name in ("SQLiteLoader", "PostgresLoader"):
        from .server import loader_runner

        return getattr(loader_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
