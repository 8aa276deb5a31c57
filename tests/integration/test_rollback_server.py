"""Failover on running instance servers: a rollback beside a live receiver, a promotion in a cascade."""

from __future__ import annotations

import threading

import pytest

from multisite.testing.cluster import Cluster
from multisite.testing.faultproxy import ProxyProcess
from multisite.testing.scenario import commit, labels, lost_files, lost_labels, wait_for, wait_has


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, durability="group")
    yield c
    c.stop_all()


def test_a_routine_no_op_rollback_keeps_what_the_receive_pool_held(cluster):
    """Seed 000, note [b]: a secondary may routinely run rollback --fetchresync; when it is not
    ahead nothing changes. The rollback empties the receive pool first; what the pool held must then
    come again, or the secondary silently stops short of its primary."""
    a = cluster.instance("A", group="g")
    b = cluster.instance("B", group="g")
    cluster.link(a, b)
    commit(a, "A1")
    wait_has(b, "A1")
    b.call("update.stop")
    commit(a, "A2")
    wait_for(lambda: b.call("receiver.status")["backlog"] == 1, "A2 in B's receive pool")
    rep = b.call("rollback", fetchresync=f"127.0.0.1:{a.client_port}")
    assert rep["rolled_back"] == 0 and lost_files(b) == []
    b.call("update.start")
    wait_has(b, "A2", timeout_s=10)  # with nothing committed after it (a later one would reveal the gap)
    commit(a, "A3")
    wait_has(b, "A3")
    assert labels(b) == ["A1", "A2", "A3"]


def test_a_cascaded_secondary_learns_the_history_record_of_its_promoted_source(cluster):
    """A -> B -> C. B is promoted while C stays connected, and originates B1 where A had A2 (never
    replicated). C must file B1 under B's new history record, not under A's: otherwise, when A comes
    back as primary, C and A agree on a common point past B1, C keeps B1 where A has A2, and the two
    diverge silently."""
    a = cluster.instance("A", group="g")
    b = cluster.instance("B", group="g")
    c = cluster.instance("C", group="g")
    cluster.link(a, b)
    cluster.link(b, c)
    commit(a, "A1")
    wait_has(c, "A1")
    a.call("source.deactivate", secondary="B")
    commit(a, "A2")
    a.kill()
    b.call("receiver.stop")
    b.call("role", role="primary")
    commit(b, "B1")
    wait_has(c, "B1")
    b.kill()
    a.start()
    c.call("receiver.stop")
    c.start_receiver(autorollback=True)
    a.start_source(c)
    commit(a, "A3")
    wait_has(c, "A3")
    assert labels(c) == labels(a) == ["A1", "A2", "A3"]
    assert lost_labels(c) == [["B1"]]


def test_a_fetchresync_beside_a_live_stream_from_that_source_rolls_back_nothing(cluster):
    """A secondary's HA rejoin runs rollback --fetchresync against the primary whose stream it is
    already receiving. The primary's Hello was fetched first, and batches the secondary applied
    after it (and confirmed) made it look ahead of the primary: the rollback cut them, though the
    primary had them and --min-confirm had acknowledged them (a seeded HA round lost 3 so). Nothing
    is applied from the stream while a rollback is decided; here the Hello's answer is delayed (a
    fault proxy) while the primary commits on."""
    a = cluster.instance("A", group="g")
    b = cluster.instance("B", group="g")
    cluster.link(a, b)
    commit(a, "A0")
    wait_has(b, "A0")
    stop = threading.Event()

    def writer() -> None:
        i = 1
        while not stop.is_set():
            commit(a, f"A{i}")
            i += 1

    with ProxyProcess("127.0.0.1", a.client_port) as proxy:
        proxy.delay(0.3, direction="downstream")  # the Hello's answer comes 0.3 s after A read its seqno
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            for _ in range(3):
                rep = b.call("rollback", fetchresync=proxy.address)
                assert rep["rolled_back"] == 0, rep
        finally:
            stop.set()
            t.join(10)
    assert lost_files(b) == []
    last = labels(a)[-1]
    wait_has(b, last, timeout_s=10)
    assert labels(b) == labels(a)
