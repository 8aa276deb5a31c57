"""A rollback on a receiving instance server holds the receive pool's apply lock while it fetches the
source's Hello and rolls back (``InstanceServer._resync_frozen``): its own worker thread takes and
releases it, so a control request cancelled meanwhile can neither leave it held (the Update Process
would stop for good) nor release it while the rollback still runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import types

from multisite.replication.server.pools import ReceivePool
from multisite.server.instance import InstanceServer


class _Receiver:
    def __init__(self) -> None:
        self.restarts = 0

    def restart_stream(self) -> None:
        self.restarts += 1


def _server(pool: ReceivePool) -> types.SimpleNamespace:
    """The parts of an instance server ``ctl_rollback`` uses, around a real receive pool."""
    db = types.SimpleNamespace(seqno=0, rollback=lambda *a, **k: types.SimpleNamespace(rolled_back=0))
    me = types.SimpleNamespace(receiver=_Receiver(), receive_pool=pool, db=db, log=logging.getLogger("test-rollback"),
                               kick_sources=lambda: None)
    me._resync_frozen = types.MethodType(InstanceServer._resync_frozen, me)
    return me


def test_a_rollback_cancelled_while_it_waits_for_the_apply_lock_leaves_it_free_and_restarts_the_stream():
    pool = ReceivePool(1 << 20, 1 << 19)
    me = _server(pool)

    async def scenario() -> None:
        applying = threading.Thread(target=lambda: (pool.apply_lock.acquire(), time.sleep(0.3),
                                                    pool.apply_lock.release()))
        applying.start()  # the Update Process applies a batch meanwhile
        await asyncio.sleep(0.05)
        task = asyncio.create_task(InstanceServer.ctl_rollback(me, resync=0))
        await asyncio.sleep(0.05)  # waiting for the apply lock, in a worker
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        applying.join()
        deadline = time.monotonic() + 5
        while me.receiver.restarts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert pool.apply_lock.acquire(timeout=2.0), "the apply lock was left held: the Update Process stops for good"
    pool.apply_lock.release()
    assert me.receiver.restarts == 1  # once the cancelled rollback's thread was done


def test_a_rollback_holds_the_apply_lock_until_it_is_done():
    pool = ReceivePool(1 << 20, 1 << 19)
    me = _server(pool)
    seen = []
    me.db.rollback = lambda *a, **k: (seen.append(pool.apply_lock.locked()), types.SimpleNamespace(rolled_back=0))[1]
    rep = asyncio.run(InstanceServer.ctl_rollback(me, resync=0))
    assert rep["rolled_back"] == 0 and seen == [True] and not pool.apply_lock.locked()
    assert me.receiver.restarts == 1
