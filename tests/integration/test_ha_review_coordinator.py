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
