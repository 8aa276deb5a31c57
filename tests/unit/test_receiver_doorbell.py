"""The receiver's doorbell: the Update Process rings it after every batch from its thread; the event
loop runs the callback once per wake however many rings came meanwhile, and never misses the last."""

from __future__ import annotations

import asyncio
import threading

from multisite.replication.server.receiver_io import Doorbell


def test_many_rings_while_pending_are_one_run():
    loop = asyncio.new_event_loop()
    try:
        runs = []
        bell = Doorbell(loop, lambda: runs.append(1))
        for _ in range(1000):
            bell.ring()
        loop.run_until_complete(asyncio.sleep(0))
        assert len(runs) == 1
        bell.ring()  # after the run: a new ring is a new run
        loop.run_until_complete(asyncio.sleep(0))
        assert len(runs) == 2
    finally:
        loop.close()


def test_the_run_after_the_last_ring_sees_what_was_done_before_it():
    """Rings from another thread while the loop runs the callback: the callback always runs again
    after the last ring, and sees the state that ring announced."""
    loop = asyncio.new_event_loop()
    try:
        state = {"done": 0, "seen": 0}
        bell = Doorbell(loop, lambda: state.__setitem__("seen", state["done"]))

        def update_process() -> None:
            for i in range(1, 5001):
                state["done"] = i
                bell.ring()

        async def main() -> None:
            t = threading.Thread(target=update_process)
            t.start()
            while t.is_alive():
                await asyncio.sleep(0)
            t.join()
            for _ in range(3):  # let the last scheduled run happen
                await asyncio.sleep(0)

        loop.run_until_complete(main())
        assert state["seen"] == 5000
    finally:
        loop.close()


# -- confirming applied batches: at once, or one answer per interval ---------------------------------

def test_an_apply_long_after_the_last_confirmation_is_confirmed_at_once():
    from multisite.replication.session import ConfirmPacer

    p = ConfirmPacer(0.002)
    assert p.due(100.0) == 0.0  # the first one: no wait, no timer
    p.sent(100.0)
    assert p.due(100.5) == 0.0
    p.sent(100.5)


def test_applies_close_together_share_one_confirmation_at_the_interval():
    from multisite.replication.session import ConfirmPacer

    p = ConfirmPacer(0.002)
    assert p.due(10.0) == 0.0
    p.sent(10.0)
    assert abs(p.due(10.0005) - 0.0015) < 1e-9  # scheduled 2 ms after the last one went out
    assert p.due(10.001) is None  # already due: the scheduled answer carries this apply too
    assert p.due(10.0019) is None
    p.sent(10.002)
    assert p.due(10.0021) > 0  # again inside the interval: scheduled, not sent


def test_a_read_is_idle_only_after_the_whole_timeout():
    from multisite.replication.session import idle_for

    assert not idle_for(129.9, 100.0, 30.0)
    assert idle_for(130.0, 100.0, 30.0)
