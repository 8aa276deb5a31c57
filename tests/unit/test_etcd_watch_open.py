"""Opening an etcd watch (ha/etcd_watch.py ``Watch``) without the network: the reading thread is replaced,
so that the moment etcd's "created" arrives can be chosen."""

from __future__ import annotations

import asyncio

from multisite.ha.etcd_client import EtcdClient
from multisite.ha.etcd_watch import Watch


def test_a_watch_cancelled_as_its_created_arrives_is_cancelled(monkeypatch):
    """asyncio.wait_for returns the result of what it waits for when a cancel lands as it completes
    (Python 3.11): a grid container refused at start had its mirror's watch opening then, and its mirror
    went on after the cancel, holding asyncio.run's end, so the refused process never exited."""
    delivered = []
    monkeypatch.setattr(Watch, "_read", lambda self, deliver: delivered.append(deliver))

    async def go():
        w = EtcdClient("http://127.0.0.1:9").watch_prefix("p/")

        async def opener():
            async with w:
                await asyncio.sleep(30)
        t = asyncio.create_task(opener())
        while not delivered:
            await asyncio.sleep(0.01)
        delivered[0]("created", "http://127.0.0.1:9")  # etcd's answer and the cancel in one turn of the loop
        t.cancel()
        done, _ = await asyncio.wait({t}, timeout=2)
        if not done:
            t.cancel()
        return t in done and t.cancelled()

    assert asyncio.run(go())
