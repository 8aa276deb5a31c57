"""Network faults between a grid primary and its synchronous replica (and its clients), through the fault
proxy: a delay, a stall longer than the vote timeout, a cut. The primary's container advertises the
proxy's address, so the replica's link and the clients' connections both cross it. The checker as in
the kill rounds: every acknowledged commit present, no rolled-back one in any journal, shards identical."""

from __future__ import annotations

import time

from multisite.journal.reader import iter_frames
from multisite.journal.records import decode_payload
from multisite.testing.faultproxy import ProxyProcess
from multisite.testing.grid import GridCluster
from multisite.testing.ports import free_port
from multisite.values import decode_value

from multisite.testing.grid_checks import GridWriter, check_grid


def test_delay_stall_and_cut_between_primary_and_replica_lose_nothing(tmp_path):
    g = GridCluster(tmp_path, partitions=1, min_sync=1, max_sync=1, max_async=0)
    port = free_port()
    with ProxyProcess("127.0.0.1", port) as proxy:
        w = None
        try:
            g.start_catalog()
            g.start_container("a", listen=f"127.0.0.1:{port}", advertise=proxy.address)
            g.wait_settled()
            g.start_container("b")
            g.wait("b current", lambda: (s := g.settled()) and s["partitions"][0]["current"] == ["b"])
            w = GridWriter(g, timeout_s=2.0)
            w.start()
            time.sleep(0.5)
            proxy.delay(0.05)
            time.sleep(1.0)
            proxy.delay(0)
            proxy.stall()  # longer than the vote timeout: the batch in flight rolls back, b falls behind
            time.sleep(2.6)
            proxy.resume()
            time.sleep(1.0)
            proxy.cut()  # every connection through the proxy reset: b subscribes again, clients reconnect
            time.sleep(1.5)
            before = w.counts["acked"]
            g.wait("b current again", lambda: (s := g.settled()) and s["partitions"][0]["current"] == ["b"])
            time.sleep(0.5)
        finally:
            if w is not None:
                w.stop()
        assert w.counts["acked"] > before, w.counts  # commits go on after the faults
        st = g.wait("caught up", g.caught_up)
        g.stop_all()
    # a and b identical, every acknowledged commit at its seqno in both journals, nothing rolled back in
    # either, and the writer's history free of lost, phantom and stale reads
    print(check_grid(g, w, st))
    assert st["partitions"][0]["primary"] == "a"


def test_a_voter_that_timed_out_holding_a_refused_commit_is_never_promoted_with_it(tmp_path):
    """The primary's link to its only sync replica is slower than the vote timeout: the commit is
    refused (VOTED_ROLLBACK) while the replica journals it late. The replica must not count current
    again before it has cut it back, so when the primary dies it is not promoted with it; once the
    primary is back, the replica cuts back and the refused value is in no journal."""
    from multisite.grid.shard_wire import Commit, Failed, Read
    from multisite.journal.records import SET
    from multisite.grid.server.client import _Conn
    from multisite.values import encode_value

    g = GridCluster(tmp_path, partitions=1, min_sync=1, max_sync=1, max_async=0)
    port = free_port()
    with ProxyProcess("127.0.0.1", port) as proxy:
        try:
            g.start_catalog()
            g.start_container("a", listen=f"127.0.0.1:{port}", advertise=proxy.address)
            g.wait_settled()
            g.start_container("b")
            g.wait("b current", lambda: (s := g.settled()) and s["partitions"][0]["current"] == ["b"])
            conn = _Conn(f"127.0.0.1:{port}", "orders")  # straight to a; b's link crosses the proxy

            def commit(v):
                return conn.ask(lambda rid: Commit(rid, 0, 0, [(SET, "m", [1], encode_value(v))]))
            assert commit(100).seqno == 1
            proxy.delay(2.3, direction="downstream")  # the frames reach b after the 2 s vote timeout
            ans = commit(666)
            assert isinstance(ans, Failed) and ans.code == "VOTED_ROLLBACK", ans
            conn.ask(lambda rid: Read(rid, 0, "m", [1]))  # a batch boundary at the primary
            time.sleep(0.1)
            assert g.status()["partitions"][0]["current"] == []
            conn.close()
            g.kill("a")
            time.sleep(2.5)  # lost after 1 s; b is not current: no promotion, the partition waits for a
            st = g.status()["partitions"][0]
            assert st["primary"] == "a" and st["current"] == []
            proxy.delay(0)
            g.start_container("a", listen=f"127.0.0.1:{port}", advertise=proxy.address)
            g.wait("b current again", lambda: (s := g.settled()) and s["partitions"][0]["current"] == ["b"])
            with g.client() as cl:
                assert cl.get("m", 1) == 100
            g.wait("caught up", g.caught_up)
        finally:
            g.stop_all()
    for c in ("a", "b"):
        values = [decode_value(u.value) for _, payload in iter_frames(g.shard_dir(c, 0) / "journal", 1)
                  for u in decode_payload(payload).updates]
        assert values == [100], (c, values)
