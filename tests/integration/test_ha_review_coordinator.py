"""Review of issue 25: the leader key's terms, on a real 3-member etcd."""

from __future__ import annotations

import asyncio

import pytest

from multisite.ha.coordinator import Coordinator

pytestmark = pytest.mark.timeout(60)


def test_ha_review_a_campaign_on_a_stale_term_does_not_take_the_key(etcd_cluster, tmp_path):
    # X read last term 0 and chose term 1; meanwhile Y took term 1 and gave it up (its server died).
    # X's transaction only checked that the key was absent: two leaders of term 1, and a follower that
    # had rejoined Y's term 1 followed X without checking its history against X
    async def run() -> tuple[bool, bool]:
        cluster = f"r-{tmp_path.name}"
        x = Coordinator(cluster, etcd_cluster.endpoints, "X", 1.0)
        y = Coordinator(cluster, etcd_cluster.endpoints, "Y", 1.0)
        seen = await x.view()
        assert seen.reachable and seen.leader is None and seen.last_term == 0
        assert await y.campaign(1, 1.0)
        await y.resign()
        got = await x.campaign(seen.last_term + 1, 1.0)
        await x.resign()
        return got, (await x.view()).last_term

    got, last_term = asyncio.run(run())
    assert not got and last_term == 1


def test_a_manager_joining_while_etcd_has_no_majority_waits_for_it_instead_of_failing(etcd_cluster, tmp_path):
    """A fresh-clone run at load had an HA manager exit at start: etcd did not answer its join's write
    in time (COORDINATOR_UNAVAILABLE). The join is safe to repeat, so it is asked again until etcd
    answers (here: two of three members paused, then resumed)."""
    import threading
    import time

    etcd_cluster.pause(1)
    etcd_cluster.pause(2)
    resumed = threading.Timer(3.0, lambda: (etcd_cluster.resume(1), etcd_cluster.resume(2)))
    resumed.start()
    try:
        c = Coordinator(f"j-{tmp_path.name}", etcd_cluster.endpoints, "X", 1.0)
        t0 = time.monotonic()
        asyncio.run(c.join("G", timeout_s=30))
        assert c.group == "G" and time.monotonic() - t0 >= 2.5  # it waited for the majority, then joined
    finally:
        resumed.join()
        etcd_cluster.resume(1)
        etcd_cluster.resume(2)
        etcd_cluster.wait_healthy(30, [0, 1, 2])  # the cluster is shared by the file's other tests
