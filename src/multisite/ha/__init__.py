"""High availability through etcd: leader leases, fencing, failover decisions (``decide``) and the manager."""
