"""The fault proxy in process, between an asyncio client and an echo server on 127.0.0.1.

Each fault is shown by what a client sees: bytes late, held, missing or throttled, a reset, a
refusal. What must happen is waited for up to seconds (a busy machine is slow, not wrong); what
must not happen is watched for a fraction of a second.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from multisite.testing.faultproxy import FaultProxy
from multisite.testing.faultproxy.control import dispatch, parse_hostport

test_timeout_s = 10.0
#: How long a test waits for something that must happen (well within test_timeout_s).
eventually_s = 5.0


class Echo:
    """An asyncio server that sends back what it reads (through ``transform``), then closes."""

    def __init__(self, transform=lambda data: data) -> None:
        self.transform = transform
        self.errors: list[Exception] = []
        self.finished = 0  # connections whose handler has ended (end of file or error)

    async def __aenter__(self) -> Echo:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(self.transform(data))
                await writer.drain()
        except ConnectionError as e:
            self.errors.append(e)
        finally:
            self.finished += 1
            writer.close()


def abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed or timed-out peer might."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def run(test):
    """Run an ``async def test(echo, proxy)`` against a fresh echo server and proxy."""

    async def main():
        async with Echo() as echo, FaultProxy("127.0.0.1", 0, "127.0.0.1", echo.port, seed=1) as proxy:
            await test(echo, proxy)

    asyncio.run(asyncio.wait_for(main(), test_timeout_s))


async def connect(proxy: FaultProxy):
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def eventually(condition, timeout_s: float = eventually_s) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` has passed; whether it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return condition()


async def round_trip(reader, writer, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await reader.readexactly(len(data))


def test_forwards_both_ways_and_counts():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        data = bytes(range(256)) * 1000  # several chunks each way
        assert await round_trip(reader, writer, data) == data
        stats = proxy.stats()
        assert stats["connections_accepted"] == 1
        assert stats["connections_open"] == 1
        assert stats["upstream"]["bytes_forwarded"] == len(data)
        assert stats["downstream"]["bytes_forwarded"] == len(data)
        assert stats["upstream"]["bytes_dropped"] == stats["downstream"]["bytes_dropped"] == 0
        writer.close()

    run(test)


def test_end_of_file_is_forwarded_as_a_half_close():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        writer.write(b"last words")
        writer.write_eof()
        assert await reader.read() == b"last words"  # the server saw our FIN, answered, closed
        writer.close()

    run(test)


def test_delay_adds_latency_without_serialising_chunks():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        delay_s = 0.25
        proxy.delay(delay_s, direction="upstream")
        t0 = time.monotonic()
        assert await round_trip(reader, writer, b"x") == b"x"
        assert time.monotonic() - t0 >= delay_s

        # Ten chunks 10 ms apart, each held delay_s from its own arrival: all are back about delay_s
        # after the last was sent. Serialised, the last would be held at least ten delays after the
        # first was sent: that is the bound (not the ~0.35 s of an idle machine, which a busy one
        # overshoots by scheduling alone).
        t0 = time.monotonic()
        for i in range(10):
            writer.write(b"%d" % i)
            await writer.drain()
            await asyncio.sleep(0.01)
        assert await reader.readexactly(10) == b"0123456789"
        assert delay_s <= time.monotonic() - t0 < 10 * delay_s

        proxy.delay(0)
        t0 = time.monotonic()
        await round_trip(reader, writer, b"y")
        assert time.monotonic() - t0 < delay_s  # a delay left in place would add at least delay_s
        writer.close()

    run(test)


def test_stall_holds_bytes_on_an_open_connection_until_resume():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        await round_trip(reader, writer, b"warm")
        proxy.stall()
        writer.write(b"ping")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.2)
        assert proxy.stats()["connections_open"] == 1
        assert proxy.stats()["upstream"]["stalled"] and proxy.stats()["downstream"]["stalled"]
        proxy.resume()
        assert await asyncio.wait_for(reader.readexactly(4), 1.0) == b"ping"
        writer.close()

    run(test)


def test_stall_of_one_direction_holds_only_that_direction():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        proxy.stall(direction="downstream")
        writer.write(b"ping")
        await writer.drain()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.2)
        assert proxy.stats()["upstream"]["bytes_forwarded"] == 4  # reached the server
        assert proxy.stats()["downstream"]["bytes_forwarded"] == 0
        proxy.resume(direction="downstream")
        assert await asyncio.wait_for(reader.readexactly(4), 1.0) == b"ping"
        writer.close()

    run(test)


def test_a_stall_hides_a_close_or_a_reset_until_resume():
    async def test(echo, proxy):
        closed_r, closed_w = await connect(proxy)
        reset_r, reset_w = await connect(proxy)
        await round_trip(closed_r, closed_w, b"a")
        await round_trip(reset_r, reset_w, b"b")
        proxy.stall()
        closed_w.close()  # FIN
        abort(reset_w)  # RST
        await asyncio.sleep(0.2)
        assert echo.errors == [] and echo.finished == 0  # the server has not noticed either
        proxy.resume()
        assert await eventually(lambda: echo.finished == 2), echo.finished
        assert [type(e) for e in echo.errors] == [ConnectionResetError]

    run(test)


def test_cut_resets_both_sides_of_every_connection():
    async def test(echo, proxy):
        conns = [await connect(proxy) for _ in range(2)]
        for reader, writer in conns:
            await round_trip(reader, writer, b"hi")
        assert proxy.cut() == 2
        for reader, writer in conns:
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(10), 1.0)
            writer.close()
        assert await eventually(lambda: len(echo.errors) == 2), echo.errors  # the server sees the reset too
        assert all(isinstance(e, ConnectionResetError) for e in echo.errors) and len(echo.errors) == 2
        stats = proxy.stats()
        assert stats["connections_cut"] == 2 and stats["connections_open"] == 0
        reader, writer = await connect(proxy)  # new connections still work
        assert await round_trip(reader, writer, b"again") == b"again"
        writer.close()

    run(test)


def test_refuse_stops_new_connections_but_keeps_open_ones():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        port = proxy.port
        proxy.refuse(True)
        with pytest.raises(ConnectionRefusedError):
            await connect(proxy)
        assert await round_trip(reader, writer, b"still here") == b"still here"
        proxy.refuse(False)
        assert proxy.port == port
        reader2, writer2 = await connect(proxy)
        assert await round_trip(reader2, writer2, b"back") == b"back"
        assert proxy.stats()["connections_accepted"] == 2
        writer.close()
        writer2.close()

    run(test)


def test_drop_next_bytes_corrupts_the_stream_then_passes_bytes_again():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        proxy.drop(next_bytes=5, direction="upstream")
        writer.write(b"helloworld")
        assert await reader.readexactly(5) == b"world"
        assert await round_trip(reader, writer, b"intact") == b"intact"
        stats = proxy.stats()
        assert stats["upstream"]["bytes_dropped"] == 5 and stats["upstream"]["drop_next_bytes"] == 0
        assert stats["downstream"]["bytes_dropped"] == 0
        writer.close()

    run(test)


def test_drop_probability_discards_chunks_silently():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        proxy.drop(1.0, direction="downstream")
        writer.write(b"lost")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.2)
        stats = proxy.stats()
        assert stats["upstream"]["bytes_forwarded"] == 4
        assert stats["downstream"]["bytes_dropped"] == 4 and stats["connections_open"] == 1
        proxy.drop(0)
        assert await round_trip(reader, writer, b"kept") == b"kept"
        writer.close()

    run(test)


def test_bandwidth_caps_throughput():
    async def test(echo, proxy):
        reader, writer = await connect(proxy)
        proxy.bandwidth(100_000, direction="upstream")
        t0 = time.monotonic()
        data = b"b" * 20_000  # 0.2 s at 100 kB/s
        assert await round_trip(reader, writer, data) == data
        assert 0.15 <= time.monotonic() - t0 < 1.0
        proxy.bandwidth(None)
        data = b"u" * 200_000  # 2 s at the cap just removed; milliseconds uncapped
        t0 = time.monotonic()
        assert await round_trip(reader, writer, data) == data
        assert time.monotonic() - t0 < 1.0  # a cap left in place takes at least 2 s
        writer.close()

    run(test)


def test_heal_clears_every_fault():
    async def test(echo, proxy):
        proxy.delay(5)
        proxy.stall()
        proxy.drop(1.0)
        proxy.bandwidth(10)
        proxy.refuse(True)
        proxy.heal()
        reader, writer = await connect(proxy)
        assert await round_trip(reader, writer, b"healthy") == b"healthy"
        writer.close()

    run(test)


def test_set_target_sends_new_connections_elsewhere():
    async def test(echo, proxy):
        async with Echo(transform=bytes.upper) as other:
            old_reader, old_writer = await connect(proxy)
            proxy.set_target("127.0.0.1", other.port)
            reader, writer = await connect(proxy)
            assert await round_trip(reader, writer, b"moved") == b"MOVED"
            assert await round_trip(old_reader, old_writer, b"stayed") == b"stayed"
            writer.close()
            old_writer.close()

    run(test)


def test_a_client_is_reset_when_the_target_is_down():
    async def test(echo, proxy):
        echo.server.close()
        await echo.server.wait_closed()
        reader, writer = await connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), 1.0)
        assert proxy.stats()["target_connect_failures"] == 1
        writer.close()

    run(test)


def test_bad_arguments_are_refused():
    async def test(echo, proxy):
        with pytest.raises(ValueError):
            proxy.delay(-1)
        with pytest.raises(ValueError):
            proxy.drop(1.5)
        with pytest.raises(ValueError):
            proxy.stall(direction="sideways")
        with pytest.raises(ValueError):
            dispatch(proxy, {"op": "stop_the_world"})
        dispatch(proxy, {"op": "delay", "delay_s": 0.25, "direction": "upstream"})
        assert dispatch(proxy, {"op": "stats"})["upstream"]["delay_s"] == 0.25

    run(test)


def test_parse_hostport():
    assert parse_hostport("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_hostport("[::1]:7000") == ("::1", 7000)
    assert parse_hostport(":7000") == ("127.0.0.1", 7000)
