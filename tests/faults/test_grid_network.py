"""Network faults between a grid primary and its synchronous replica (and its clients), through the fault
proxy: a delay, a stall longer than the vote timeout, a cut. The primary's container advertises the
proxy's address, so the replica's link and the clients' connections both cross it. The checker as in
the kill rounds: every acknowledged commit present, no rolled-back one in any journal, shards identical."""

from __future__ import annotations

import socket
import time

from multisite.journal.reader import iter_frames
from multisite.journal.records import decode_payload
from multisite.testing.faultproxy import ProxyProcess
from multisite.testing.grid import GridCluster
from multisite.values import decode_value

from .test_grid_writer_kills import Writer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            w = Writer(g)
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
                w.stop.set()
                w.join(30)
        assert w.counts["acked"] > before, w.counts  # commits go on after the faults
        st = g.wait("caught up", g.caught_up)
        g.stop_all()
    states = g.shard_states()
    assert states[0]["a"]["rows"] == states[0]["b"]["rows"] and states[0]["a"]["seqno"] == states[0]["b"]["seqno"]
    final = {k[0]: v for k, v in states[0]["a"]["rows"].items()}
    for k, v in w.acked.items():
        later_unknown = [u for u in w.unknown.get(k, []) if u > v]
        assert final.get(k) == v or final.get(k) in later_unknown, (k, v, final.get(k))
    for c in ("a", "b"):
        for _, payload in iter_frames(g.shard_dir(c, 0) / "journal", 1):
            for u in decode_payload(payload).updates:
                assert decode_value(u.value) not in w.rolled_back, (c, u)
    assert st["partitions"][0]["primary"] == "a"
    print(w.counts)
