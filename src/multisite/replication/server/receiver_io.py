"""The receiver's event-loop plumbing: how a connection's bytes come in, and how the Update Process's
thread wakes the loop.

Why apart from ``receiver``: these are asyncio mechanics (a protocol that reads nothing until the
receiver has decided on TLS, a reusable read buffer, a coalescing cross-thread wake-up), unit-tested on
their own; ``receiver`` holds the session with the source.
"""

from __future__ import annotations

import asyncio
import threading

READ_BUFFER_BYTES = 256 * 1024  # the transport's reads (the size asyncio reads with), into one buffer


class Doorbell:
    """Runs ``fn`` on ``loop`` soon after ``ring()`` from any thread. Rings while a run is pending are
    that one run (``fn`` sees everything done before them: the flag is cleared before it runs), so a
    busy Update Process wakes the event loop once per wake, not with a pipe write per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn):
        self._loop, self._fn = loop, fn
        self._pending = False
        self._lock = threading.Lock()

    def ring(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            self._pending = False
        self._fn()


class PausedAtConnect(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """Reads nothing until ``_handle`` resumes it or starts TLS: otherwise the peer's TLS ClientHello
    can reach the plain stream first and ``start_tls`` waits for it forever.

    Buffered: the transport receives into one buffer of READ_BUFFER_BYTES kept for the connection
    (``recv_into``), and the stream takes only the bytes that came. A plain protocol gets a new
    bytes object of the transport's read size (256 KiB) for every read, allocated with mmap and
    given back with munmap even when a few hundred bytes or nothing came: 20 µs a read, measured,
    about as much as checking the batch it holds."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._rview: memoryview | None = None

    def connection_made(self, transport) -> None:
        transport.pause_reading()
        super().connection_made(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._rview is None:
            self._rview = memoryview(bytearray(READ_BUFFER_BYTES))
        return self._rview

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._rview[:nbytes])  # the stream copies them into its own buffer
