"""The grid: partitioned shards with synchronous and asynchronous replicas (see DESIGN.md).

Sans-IO so far: the deployment policy, routing of keys to partitions, placement of shards on
containers, and the synchronous replicas' commit vote. The catalog, container and client processes
that drive them come next.
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
