"""aconnect's write flow control: callers waiting for a full write buffer to drain (a server that does
not read) each wait on their own; one of them cancelled (a timeout) must not cancel the others."""
from __future__ import annotations

import asyncio
import socket

import multisite


def test_cancelling_one_caller_waiting_for_the_write_buffer_leaves_the_other_callers_waiting():
    async def main() -> tuple[int, bool]:
        lsock = socket.create_server(("127.0.0.1", 0))
        conn = None
        try:
            db = await multisite.aconnect(f"127.0.0.1:{lsock.getsockname()[1]}")
            conn, _ = lsock.accept()  # a real peer that never reads: the client's write buffer fills
            big = b"x" * (512 * 1024)
            tasks = [asyncio.create_task(db.set("r", (i,), big)) for i in range(40)]
            for _ in range(100):
                await asyncio.sleep(0.02)
                if db._protocol.drained is not None:
                    break
            assert db._protocol.drained is not None, "the client's write buffer never went over its limit"
            await asyncio.sleep(0.1)
            tasks[-1].cancel()  # waiting for the buffer to drain
            await asyncio.sleep(0.1)
            others = sum(t.cancelled() for t in tasks[:-1])
            later = asyncio.create_task(db.set("r", (999,), b"y"))
            await asyncio.sleep(0.1)
            later_cancelled = later.cancelled()
            for t in [*tasks, later]:
                t.cancel()
            conn.close()  # unread bytes: a reset, and the client's connection ends
            await asyncio.wait_for(db.close(), 10)
            await asyncio.gather(*tasks, later, return_exceptions=True)
            return others, later_cancelled
        finally:
            if conn is not None:
                conn.close()
            lsock.close()

    others, later_cancelled = asyncio.run(main())
    assert others == 0, f"{others} other callers were cancelled with the one cancelled"
    assert not later_cancelled, "a call made after the cancellation was cancelled at once"


def test_a_connection_the_server_closes_at_once_fails_the_first_call_instead_of_hanging():
    # The server closes as it accepts (a limit, a gate it cannot make, a stop): the end of the
    # connection can arrive before aconnect has its database object; the calls then must fail.
    import threading

    from multisite.errors import ConnectionLost

    lsock = socket.create_server(("127.0.0.1", 0), backlog=64)

    def accept_and_close() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            c.close()

    threading.Thread(target=accept_and_close, daemon=True).start()

    async def main() -> int:
        hung = 0
        for _ in range(100):
            db = await multisite.aconnect(f"127.0.0.1:{lsock.getsockname()[1]}")
            try:
                await asyncio.wait_for(db.get("r", ("k",)), 1)
            except ConnectionLost:
                pass
            except TimeoutError:
                hung += 1
        return hung

    try:
        hung = asyncio.run(main())
    finally:
        lsock.close()
    assert hung == 0, f"{hung} of 100 first calls hung on a connection already closed"


def test_close_returns_when_the_server_never_reads_what_is_still_buffered():
    # close() fails what is pending, then lets the transport flush: against a peer that reads nothing the
    # flush never ends, so close() gives it CLOSE_FLUSH_S and then drops the connection.
    from multisite.server import aclient

    async def main() -> None:
        lsock = socket.create_server(("127.0.0.1", 0))
        conn = None
        try:
            db = await multisite.aconnect(f"127.0.0.1:{lsock.getsockname()[1]}")
            conn, _ = lsock.accept()  # never reads
            tasks = [asyncio.create_task(db.set("r", (i,), b"x" * (512 * 1024))) for i in range(40)]
            for _ in range(100):
                await asyncio.sleep(0.02)
                if db._protocol.drained is not None:
                    break
            assert db._protocol.drained is not None, "the client's write buffer never went over its limit"
            await asyncio.wait_for(db.close(), aclient.CLOSE_FLUSH_S + 5)  # before: never returned
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if conn is not None:
                conn.close()
            lsock.close()

    asyncio.run(main())
