"""The grid: partitioned shards with synchronous and asynchronous replicas (see DESIGN.md).

Sans-IO: the deployment policy, routing of keys to partitions, placement of shards on containers,
the synchronous replicas' commit vote, the catalog's decisions (``catalog``) and the catalog ⇄
container wire (``wire``), the data wire (``shard_wire``) and where a replica starts (``shipping``).
The catalog and container processes that drive them live in ``net`` (``grid_catalog``,
``grid_container``, ``grid_shard``) with the blocking grid client (``grid_client``), which the
package root attaches here as ``multisite.grid.connect(catalog)``.
"""

from .placement import Container, Move, MoveKind, Placement, Plan, Role, Shards, Shortfall, plan
from .policy import GridPolicy, MapPolicy, load_policy, parse_policy, policy_from_dict
from .routing import (ROUTING_HASH, Next, Route, RouteCache, RouteTable, check_in_partition, partition_of,
                      partition_of_subscript, routing_partition, table_from_routes)
from .voting import CommitVote, Decision, SyncReplicas, Vote

__all__ = ["Container", "Move", "MoveKind", "Placement", "Plan", "Role", "Shards", "Shortfall", "plan",
           "GridPolicy", "MapPolicy", "load_policy", "parse_policy", "policy_from_dict",
           "ROUTING_HASH", "Next", "Route", "RouteCache", "RouteTable", "check_in_partition", "partition_of",
           "partition_of_subscript", "routing_partition", "table_from_routes",
           "CommitVote", "Decision", "SyncReplicas", "Vote"]
