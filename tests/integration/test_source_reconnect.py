"""A real Source Server reconnects at once after a session that streamed a while.

The pause after a failed connect doubles up to ``connect_backoff_max_s``, but it was set back only
when a session ended without an error, which never happens (a session ends by an error: a cut, a
timeout, a deactivate). So once a source had failed a few times in its life, every later cut, even
after hours of streaming, waited the longest pause before reconnecting.

The pause's rules (doubling, the refusal floor, the reset) are ``replication.session.SourceBackoff``'s
and are checked with a fake clock in ``tests/unit/test_session.py``. Here, on real TCP on 127.0.0.1, a
real Source Server (on a real instance) fails to connect until its pause is the longest, streams, is
cut, and must come back with a full handshake well before that longest pause. The receiver is played
by the test with the protocol's own Connection, so that the test sees each connection as accepted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import multisite
from multisite.errors import ConnectionLost
from multisite.replication.server.source import SourceConfig, SourceServer, read_event
from multisite.protocol.connection import Connection, Role
from multisite.protocol.messages import Heartbeat, HeartbeatAck, Hello, Start
from multisite.replication.history import hello_for
from multisite.replication.server.pools import JournalPool
from multisite.testing.ports import free_port

BACKOFF_MAX_S = 4.0


async def wait_for(probe, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (got := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return got


def test_reconnects_at_once_after_a_long_session_despite_earlier_failures(tmp_path):
    a = multisite.open(multisite.create(tmp_path / "A", "A", durability="none"))
    b = multisite.open(multisite.create(tmp_path / "B", "B", durability="none"))
    b.update_info(lambda i: setattr(i, "role", "secondary"))
    accepted: list[float] = []
    sessions: list[asyncio.StreamWriter] = []
    handshakes: list[list[str]] = []  # per connection: the handshake messages the source sent, in order

    async def receiver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        sessions.append(writer)
        seen: list[str] = []
        handshakes.append(seen)
        conn = Connection(Role.RECEIVER)
        try:
            hello = await read_event(conn, reader)
            seen.append(type(hello).__name__)
            if not isinstance(hello, Hello):
                return  # the assertion on ``handshakes`` reports it
            writer.write(conn.send(hello_for(b.info, 0)))
            start = await read_event(conn, reader)
            seen.append(type(start).__name__)
            if not isinstance(start, Start):
                return
            while True:
                ev = await read_event(conn, reader)
                if isinstance(ev, Heartbeat):
                    writer.write(conn.send(HeartbeatAck(ev.seq, ev.sent_at, 0, 0)))
        except (ConnectionLost, OSError):  # the cut, or the source stopping at the end
            pass
        finally:
            writer.transport.abort()

    async def main() -> float:
        port = free_port()  # nothing listens yet: the source fails until its pause is the longest
        cfg = SourceConfig("B", "127.0.0.1", port, heartbeat_interval_s=0.1, heartbeat_timeout_s=10.0,
                           connect_backoff_max_s=BACKOFF_MAX_S, stats_interval_s=3600, slot_save_interval_s=3600)
        pool = JournalPool(1 << 20)
        pool.reset(a.seqno)
        src = SourceServer(SimpleNamespace(db=a, pool=pool), cfg, logging.getLogger("test-source-backoff"))
        src.start()
        try:
            await asyncio.sleep(BACKOFF_MAX_S)  # failures: pauses of 0.05, 0.1, ... up to the longest
            srv = await asyncio.start_server(receiver, "127.0.0.1", port)
            await wait_for(lambda: src.state == "streaming", "the first session to stream")
            await asyncio.sleep(BACKOFF_MAX_S + 0.5)  # a session that streams a while
            assert len(accepted) == 1
            sessions[0].transport.abort()  # the link is cut
            cut = time.monotonic()
            await wait_for(lambda: len(accepted) == 2, "the reconnection")
            took = accepted[1] - cut
            await wait_for(lambda: src.state == "streaming", "the second session to stream")
            srv.close()
            return took
        finally:
            await src.stop(timeout_s=0)

    try:
        took = asyncio.run(main())
    finally:
        a.close()
        b.close()
    assert handshakes == [["Hello", "Start"], ["Hello", "Start"]], handshakes
    assert took < BACKOFF_MAX_S / 2, f"reconnected {took:.2f} s after the cut: the longest pause, not the shortest"
