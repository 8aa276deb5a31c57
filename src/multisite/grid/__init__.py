"""The grid: partitioned shards with synchronous and asynchronous replicas (see DESIGN.md).

Sans-IO so far: the deployment policy, routing of keys to partitions, placement of shards on
containers, and the synchronous replicas' commit vote. The catalog, container and client processes
that drive them come next.
"""
