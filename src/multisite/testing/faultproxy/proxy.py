"""``FaultProxy``: an in-process asyncio TCP proxy whose faults tests change while it runs.

Each accepted client gets its own connection to the target and four tasks: per direction, a
reader that stamps chunks and queues them in a bounded pipe, and a writer that takes them out
through the lane's faults (see ``lane.py``). An end of file is forwarded as a half-close (FIN),
and a reset as a reset (RST), in their place in the stream: delayed and held by a stall like the
bytes before them, so that a stalled link hides a peer's departure as a real partition would.
A failed write, a ``cut`` or ``stop`` resets both sides at once.

The listening socket is created synchronously, so ``refuse(False)`` listens again before it
returns (connections wait in the kernel's backlog until the accept task runs), and ``refuse(True)``
closes it at once: clients then get ``ECONNREFUSED``, as from a host with nothing listening.
A client accepted while the target cannot be reached is reset.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections import deque

from .lane import DIRECTIONS, DOWNSTREAM, UPSTREAM, Lane, lanes_for

#: Largest read from a socket; a fault (delay, drop) applies to each such chunk.
chunk_bytes = 64 * 1024
#: Bytes a lane may hold per connection before it stops reading (while stalled or delayed).
pipe_bytes = 4 * 1024 * 1024
#: How long to try to reach the target for a new client before resetting the client.
connect_timeout_s = 5.0


class FaultProxy:
    """A TCP proxy from ``listen_host:listen_port`` (0 = ephemeral) to ``target_host:target_port``.

    ``await start()`` before use, ``await stop()`` after (or ``async with``). The fault methods are
    plain calls, to be made from the proxy's event loop; ``direction`` is ``"upstream"`` (client to
    target), ``"downstream"`` (target to client) or ``"both"``. ``seed`` drives probabilistic drops.
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        *,
        seed: int | None = None,
    ) -> None:
        self.listen_host = listen_host
        self._listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        rng = random.Random(seed)
        self._lanes = {name: Lane(name, rng) for name in DIRECTIONS}
        self._server: asyncio.Server | None = None
        self._listen_task: asyncio.Task | None = None
        self._refusing = False
        self._stopped = False
        self._conns: set[_Connection] = set()
        self._handlers: set[asyncio.Task] = set()
        self._connecting: set[asyncio.Future] = set()
        self.connections_accepted = 0
        self.connections_cut = 0
        self.target_connect_failures = 0

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The listening port (the ephemeral one chosen at ``start`` if 0 was asked)."""
        return self._listen_port

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self._listen_port}"

    async def start(self) -> FaultProxy:
        self._listen()
        await self._listen_task
        return self

    async def stop(self) -> None:
        """Stop listening and reset every open connection."""
        self._stopped = True
        self._close_listener()
        self.cut()
        for attempt in list(self._connecting):  # handlers still reaching the target end too
            attempt.cancel()
        handlers = list(self._handlers)
        if handlers:
            await asyncio.gather(*handlers, return_exceptions=True)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _listen(self) -> None:
        sock = socket.create_server((self.listen_host, self._listen_port))  # SO_REUSEADDR on POSIX
        self._listen_port = sock.getsockname()[1]
        sock.setblocking(False)
        task = asyncio.get_running_loop().create_task(
            asyncio.start_server(self._on_client, sock=sock, limit=chunk_bytes)
        )
        task.add_done_callback(self._on_listening)
        self._listen_task = task

    def _on_listening(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        server = task.result()
        if self._refusing or self._stopped or self._server is not None:  # changed meanwhile
            server.close()
        else:
            self._server = server

    def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()  # closes the listening socket now; open connections stay
            self._server = None

    # -- faults -------------------------------------------------------------------------------

    def delay(self, delay_s: float, direction: str = "both") -> None:
        """Deliver each chunk no earlier than ``delay_s`` after it arrived (0 = no delay)."""
        for name in lanes_for(direction):
            self._lanes[name].set_delay(delay_s)

    def stall(self, direction: str = "both") -> None:
        """Hold all bytes (and ends of file) without closing anything, until ``resume``."""
        for name in lanes_for(direction):
            self._lanes[name].stall()

    def resume(self, direction: str = "both") -> None:
        for name in lanes_for(direction):
            self._lanes[name].resume()

    def drop(
        self,
        probability: float | None = None,
        *,
        next_bytes: int | None = None,
        direction: str = "both",
    ) -> None:
        """Silently discard bytes: each chunk with ``probability`` (0 = off), and/or the next
        ``next_bytes`` bytes of each lane named. The byte stream is corrupted; that is the point."""
        for name in lanes_for(direction):
            self._lanes[name].set_drop(probability, next_bytes)

    def bandwidth(self, bytes_per_s: float | None, direction: str = "both") -> None:
        """Cap each lane's throughput, over all its connections (None or 0 = no cap)."""
        for name in lanes_for(direction):
            self._lanes[name].set_bandwidth(bytes_per_s)

    def cut(self) -> int:
        """Reset (RST, SO_LINGER 0) both sides of every open connection; return how many."""
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        self.connections_cut += len(conns)
        return len(conns)

    def refuse(self, refusing: bool = True) -> None:
        """Refuse new connections (stop listening) or accept them again; open ones are untouched."""
        if refusing and not self._refusing:
            self._refusing = True
            self._close_listener()
        elif not refusing and self._refusing:
            self._listen()  # may raise (port taken meanwhile): then still refusing
            self._refusing = False

    def set_target(self, target_host: str, target_port: int) -> None:
        """Send new connections to another target (a restarted server on a new port)."""
        self.target_host, self.target_port = target_host, int(target_port)

    def heal(self) -> None:
        """Clear every fault: no delay, drop or cap, resumed, accepting."""
        for lane in self._lanes.values():
            lane.heal()
        self.refuse(False)

    def stats(self) -> dict:
        """Counters and current faults, as a JSON-ready dict with a stable shape."""
        return {
            "connections_accepted": self.connections_accepted,
            "connections_open": len(self._conns),
            "connections_cut": self.connections_cut,
            "target_connect_failures": self.target_connect_failures,
            "refusing": self._refusing,
            "target": f"{self.target_host}:{self.target_port}",
            UPSTREAM: self._lanes[UPSTREAM].describe(),
            DOWNSTREAM: self._lanes[DOWNSTREAM].describe(),
        }

    # -- forwarding ---------------------------------------------------------------------------

    async def _on_client(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._serve(c_reader, c_writer)
        finally:
            self._handlers.discard(task)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        connect = asyncio.ensure_future(
            asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port, limit=chunk_bytes),
                connect_timeout_s,
            )
        )
        self._connecting.add(connect)
        try:
            t_reader, t_writer = await connect
        except (OSError, asyncio.TimeoutError):
            self.target_connect_failures += 1
            _reset(c_writer)
            return
        except asyncio.CancelledError:
            _reset(c_writer)
            if asyncio.current_task().cancelling():
                raise
            return  # stop() cancelled the attempt; this handler ends normally
        finally:
            self._connecting.discard(connect)
        conn = _Connection(c_writer, t_writer)
        self._conns.add(conn)
        up, down = _Pipe(pipe_bytes), _Pipe(pipe_bytes)
        up_lane, down_lane = self._lanes[UPSTREAM], self._lanes[DOWNSTREAM]
        conn.tasks = [
            asyncio.create_task(_collect(c_reader, up)),
            asyncio.create_task(_deliver(up, t_writer, up_lane)),
            asyncio.create_task(_collect(t_reader, down)),
            asyncio.create_task(_deliver(down, c_writer, down_lane)),
        ]
        try:
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
            if _all_clean(conn.tasks):
                c_writer.close()
                t_writer.close()
            else:  # a reset, an error or a cut: the other side learns it by a reset too
                conn.abort()
        finally:
            for t in conn.tasks:
                t.cancel()
            self._conns.discard(conn)


class _Connection:
    """Both sides of one proxied connection and the tasks that forward between them."""

    def __init__(self, client: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self.client, self.target = client, target
        self.tasks: list[asyncio.Task] = []

    def abort(self) -> None:
        _reset(self.client)
        _reset(self.target)
        for t in self.tasks:
            t.cancel()


def _all_clean(tasks: list[asyncio.Task]) -> bool:
    """Whether every task has finished without error (retrieving each error, so none is logged)."""
    clean = True
    for t in tasks:
        if not t.done() or t.cancelled() or t.exception() is not None:
            clean = False
    return clean


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close abruptly: SO_LINGER 0 makes the kernel send RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed
    writer.transport.abort()


class _Pipe:
    """A FIFO of ``(arrival_time, chunk)`` bounded near ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int) -> None:
        self._items: deque[tuple[float, bytes | None]] = deque()
        self._bytes = 0
        self._capacity_bytes = capacity_bytes
        self._changed = asyncio.Condition()

    async def put(self, arrival: float, chunk: bytes | None) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._bytes < self._capacity_bytes)
            self._items.append((arrival, chunk))
            self._bytes += len(chunk or b"")
            self._changed.notify_all()

    async def get(self) -> tuple[float, bytes | None]:
        async with self._changed:
            await self._changed.wait_for(lambda: self._items)
            arrival, chunk = self._items.popleft()
            self._bytes -= len(chunk or b"")
            self._changed.notify_all()
            return arrival, chunk


async def _collect(reader: asyncio.StreamReader, pipe: _Pipe) -> None:
    """Read chunks into ``pipe``: ``b""`` marks end of file, ``None`` a reset or read error."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = await reader.read(chunk_bytes)
        except OSError:
            await pipe.put(loop.time(), None)
            return
        await pipe.put(loop.time(), chunk)
        if not chunk:
            return


async def _deliver(pipe: _Pipe, writer: asyncio.StreamWriter, lane: Lane) -> None:
    """Write ``pipe``'s chunks through ``lane``'s faults; a FIN or a reset is delayed and held too,
    so that during a stall neither side learns that the other has gone."""
    while True:
        arrival, chunk = await pipe.get()
        await lane.release(arrival)
        if chunk is None:
            raise ConnectionResetError(f"{lane.name}: the sending side was reset")
        if not chunk:
            if writer.can_write_eof():
                writer.write_eof()
            return
        for piece in lane.slices(lane.filter(chunk)):
            await lane.pace(len(piece))
            writer.write(piece)
            await writer.drain()
            lane.bytes_forwarded += len(piece)
