"""A replica shard's follow loop (grid/server/replica.py ``ReplicaShard.run``): an error nobody expected
while following its primary is logged and the replica subscribes again. It ended the loop's task,
unobserved: the replica stopped following, its seqno frozen in its container's reports, nothing logged."""

from __future__ import annotations

import asyncio

from multisite.grid.server import replica as replica_mod
from multisite.grid.server.replica import ReplicaShard
from multisite.grid.wire import View


class Host:
    name = "c2"
    loader_maps: dict = {}


def test_an_unexpected_error_while_following_is_logged_and_the_replica_follows_again(monkeypatch, caplog):
    monkeypatch.setattr(replica_mod, "RECONNECT_S", 0.01)
    calls: list[str] = []

    async def follow(self, addr: str) -> None:
        calls.append(addr)
        if len(calls) == 1:
            raise KeyError("a field the primary did not send")
        await asyncio.sleep(60)  # following

    monkeypatch.setattr(ReplicaShard, "_follow", follow)

    async def go():
        r = ReplicaShard(Host(), 0, None, None, View(2, "c1", "127.0.0.1:9", ["c2"], [], 1), "sync", None)
        for _ in range(200):
            if len(calls) == 2:
                break
            await asyncio.sleep(0.01)
        alive = not r.task.done()
        r.stopped = True
        r.task.cancel()
        return alive, r.last_error

    alive, last_error = asyncio.run(go())
    assert calls == ["127.0.0.1:9", "127.0.0.1:9"] and alive
    assert "KeyError" in last_error and "following primary c1 failed" in caplog.text


def test_a_checkpoint_copy_given_up_ends_the_thread_installing_it(monkeypatch):
    """The installing thread read the copy's rows with a get that never timed out: when the end was
    never put (the replica's task cancelled again while it offered it), the thread waited for ever."""
    import queue
    import threading
    import time

    import pytest

    monkeypatch.setattr(replica_mod, "COPY_POLL_S", 0.01)
    q: queue.Queue = queue.Queue()
    abandoned = threading.Event()
    q.put([("m", b"k", b"v")])
    rows = replica_mod.copy_batches(q, abandoned)
    assert next(rows) == [("m", b"k", b"v")]
    abandoned.set()  # the copy is given up; no end is ever put
    t0 = time.monotonic()
    with pytest.raises(replica_mod.CopyAbandoned):
        next(rows)
    assert time.monotonic() - t0 < 1
    q.put([("m", b"k2", b"v")])
    q.put(None)
    assert list(replica_mod.copy_batches(q, threading.Event())) == [[("m", b"k2", b"v")]]
