"""The etcd harness (testing/etcd.py) and the HA coordinator on it: leases, transactions, lost members."""

from __future__ import annotations

import asyncio
import time

import pytest

from multisite.errors import ConfigError, CoordinatorUnavailable
from multisite.ha.coordinator import Coordinator
from multisite.ha.decide import Member
from multisite.testing.etcd import EtcdCluster
from multisite.testing.ports import free_port


def run(coro):
    return asyncio.run(coro)


def test_one_member_campaigns_and_the_key_ends_with_its_lease(etcd_cluster):
    a = Coordinator("lease-test", etcd_cluster.endpoints, "a", ttl_s=1)
    b = Coordinator("lease-test", etcd_cluster.endpoints, "b", ttl_s=1)
    assert run(a.campaign(1, 1)) is True
    assert run(b.campaign(1, 1)) is False  # the transaction finds the key
    assert run(b.view()).leader.name == "a"
    deadline = time.monotonic() + 5
    while run(b.view()).leader is not None:  # a does not renew: the key goes with the lease
        assert time.monotonic() < deadline, "the leader key outlived its lease"
        time.sleep(0.05)
    assert run(a.renew()) is False  # an ended lease cannot be renewed
    assert run(b.campaign(2, 1)) is True and run(b.view()).last_term == 2


def test_giving_up_a_lease_that_already_ended_is_no_error(etcd_cluster):
    """A fenced leader resigns, a stopping member revokes its record's lease: after a pause longer than the
    lease, etcd answers Not Found, which once ended the manager's loop with an uncaught exception."""
    a = Coordinator("expired-test", etcd_cluster.endpoints, "a", ttl_s=1)
    run(a.publish(Member("a", "G", "127.0.0.1:1", "127.0.0.1:2", 1, "secondary")))
    assert run(a.campaign(1, 1)) is True
    deadline = time.monotonic() + 5
    while run(a.view()).members:  # both leases end: nobody renews them
        assert time.monotonic() < deadline, "the member record outlived its lease"
        time.sleep(0.05)
    run(a.resign())
    run(a.close())


def test_a_member_of_another_group_is_refused(etcd_cluster):
    run(Coordinator("group-test", etcd_cluster.endpoints, "a", 1).join("G1"))
    with pytest.raises(ConfigError, match="replicates LMS group 'G1'.*another --cluster"):
        run(Coordinator("group-test", etcd_cluster.endpoints, "x", 1).join("G2"))


def test_members_publish_under_their_lease(etcd_cluster):
    c = Coordinator("pub-test", etcd_cluster.endpoints, "a", 1)
    run(c.publish(Member("a", "G", "127.0.0.1:1", "127.0.0.1:2", 7, "secondary")))
    (m,) = run(c.view()).members
    assert (m.name, m.seqno, m.replication) == ("a", 7, "127.0.0.1:2")


def test_one_of_three_members_lost_changes_nothing_two_lost_stop_writes(tmp_path):
    with EtcdCluster(tmp_path) as etcd:
        c = Coordinator("quorum", etcd.endpoints, "a", 1)
        etcd.kill(0)
        etcd.wait_healthy(members=[1, 2])  # if it led etcd, the others elect a leader first (~0.5 s)
        assert run(c.campaign(1, 1)) is True
        etcd.kill(1)
        t0 = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match="no etcd member answered|outcome is unknown"):
            run(c.campaign(2, 1))  # the lease grant finds no majority (the member left times out)
        assert time.monotonic() - t0 < 10
        assert run(c.view()).reachable is False
        assert run(c.renew()) is False


def test_an_unreachable_etcd_is_named():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CoordinatorUnavailable, match=url.replace(".", r"\.")):
        run(Coordinator("x", url, "a", 1).join("G"))
    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        Coordinator("x", "127.0.0.1:2379", "a", 1)
