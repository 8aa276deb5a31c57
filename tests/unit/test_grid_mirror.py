"""The grid's mirror of etcd (grid/server/coordinator.py ``Mirror``) against an etcd stand-in: whatever
fails, its read, its watch and its read every second go on. A mirror task that ended on an unexpected
error left its owner (a container applying the state, a catalog answering status) on a frozen copy,
with nothing in any log."""

from __future__ import annotations

import asyncio

from multisite.grid.coordination import GridKeys
from multisite.grid.server import coordinator
from multisite.grid.server.coordinator import Mirror
from multisite.ha.etcd_values import KeyValue, PrefixRead


class Flaky:
    """Reads that fail with an error no etcd client names (a garbled answer) when ``fail`` says so,
    and watches that fail the same way at once."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.revision, self.reads, self.fail = prefix, 2, 0, {1}

    async def read_prefix(self, prefix: str) -> PrefixRead:
        self.reads += 1
        if self.reads in self.fail:
            raise ValueError("a garbled answer")
        v = b'{"version": %d}' % self.revision
        return PrefixRead([KeyValue(self.prefix + "state", v, 2, self.revision, 1, 0)], self.revision)

    def watch_prefix(self, prefix: str, start_revision: int = 0):
        return Broken()


class Broken:
    async def __aenter__(self):
        raise KeyError("an event without a kv")

    async def __aexit__(self, *exc):
        return False


def test_the_mirror_reads_on_after_errors_no_client_names(monkeypatch):
    monkeypatch.setattr(coordinator, "RETRY_S", 0.01)
    keys = GridKeys("g")
    etcd = Flaky(keys.prefix)

    async def go():
        m = Mirror(etcd, keys, resync_s=0.02)
        task = asyncio.create_task(m.run())
        try:
            await asyncio.wait_for(m.loaded.wait(), 5)  # the first read failed, the next one loaded
            etcd.fail = set(range(etcd.reads + 1, etcd.reads + 30, 2))  # every other read from now on
            etcd.revision = 9
            for _ in range(500):
                if keys.revision == 9:
                    break
                await asyncio.sleep(0.01)
            assert keys.revision == 9 and not task.done()
        finally:
            task.cancel()
        return m

    m = asyncio.run(go())
    assert etcd.reads >= 3  # a failed read, a good one, and a good one after the change
    assert m.error is None or "a garbled answer" in m.error or "an event without a kv" in m.error
