"""A member that led rejoins the cluster as a secondary (real processes, a real 3-member etcd)."""

from __future__ import annotations

import socket

import pytest

from multisite.testing.ha import HACluster

pytestmark = pytest.mark.timeout(180)


def test_a_demoted_primary_rejoins_though_its_former_receiver_port_was_taken(tmp_path, etcd_cluster):
    """B follows A (its receiver on a free port P), is switched over to (its receiver stops, P goes back
    to the kernel), and an outgoing connection is given P, as an ephemeral port, before a switchover
    to C demotes B. B's new receiver asked for P again, at every pass of its manager, and failed
    (EADDRINUSE): B stayed a fenced primary with no receiver, and never followed C."""
    c = HACluster(tmp_path, etcd_cluster.endpoints, ["A", "B", "C"], ttl_s=1.0, cluster=f"t-{tmp_path.name}")
    c.start()
    try:
        c.wait_primary()
        c.wait_followers()
        port = int(c.status("B")["receiver"]["listen"].rsplit(":", 1)[1])
        c.cli("ha", "switchover", "--cluster", c.cluster, "--etcd", c.etcd, "--to", "B")
        assert c.wait_primary(timeout_s=20) == "B"
        with socket.socket() as peer, socket.socket() as taker:
            peer.bind(("127.0.0.1", 0))
            peer.listen()
            taker.bind(("127.0.0.1", port))  # as connect() gives an ephemeral port
            taker.connect(peer.getsockname())
            c.cli("ha", "switchover", "--cluster", c.cluster, "--etcd", c.etcd, "--to", "C")
            c.wait_role("B", "secondary", timeout_s=20)
            c.wait_followers()
        with c.client() as db:
            db.create_region("acct")
            db.set("acct", (1,), 1)
        c.wait_identical()
    finally:
        c.stop()
