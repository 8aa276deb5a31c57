"""``run_together``, which runs a source session's loops: a stop (the task cancelled) is never lost to a
loop that fails at the same moment (a TaskGroup gives the child's error priority over the cancel)."""

from __future__ import annotations

import asyncio

import pytest

from multisite.errors import ConnectionLost
from multisite.replication.server.source import run_together


def test_a_cancel_that_meets_a_failing_loop_stays_a_cancel():
    async def main():
        failing = asyncio.Event()

        async def fails():
            await failing.wait()
            raise ConnectionLost("peer closed the connection")

        async def waits():
            await asyncio.Event().wait()

        task = asyncio.get_running_loop().create_task(run_together(fails(), waits()))
        await asyncio.sleep(0)
        failing.set()
        task.cancel()  # the same turn of the loop: the child fails, the parent is cancelled
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_without_a_cancel_the_first_error_is_raised():
    async def main():
        async def fails():
            raise ConnectionLost("peer closed the connection")

        async def waits():
            await asyncio.Event().wait()

        await run_together(fails(), waits())

    with pytest.raises(ConnectionLost, match="peer closed"):
        asyncio.run(main())
