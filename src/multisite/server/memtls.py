"""Server-side TLS over memory buffers, for the client listener (``server.clients``).

The listener's connections stay plain asyncio transports on its one loop; TLS runs over two memory
BIOs (``ssl.SSLObject``), so the listener sees a connection's first bytes before any handshake and
can answer a client speaking the plain protocol in that protocol, and handshakes cost no task or
thread of their own. The listener feeds what it receives to ``receive`` and writes out what
``receive``, ``send``, ``pending`` and ``close_notify`` return.
"""

from __future__ import annotations

import ssl


class MemoryTLS:
    """Server-side TLS over memory buffers (``ssl.SSLObject``): the connection's bytes stay on the
    loop's transport, and the first bytes can be looked at before any handshake."""

    def __init__(self, ctx: ssl.SSLContext):
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_side=True)
        self.done = False
        self.peer_closed = False  # the client sent its close_notify: it is done with this connection

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Received bytes in; (plain bytes for the protocol, TLS bytes to send). ssl.SSLError when the
        handshake fails (the alert to send is left in ``pending()``)."""
        self._in.write(data)
        if not self.done:
            try:
                self.obj.do_handshake()
                self.done = True
            except ssl.SSLWantReadError:
                return b"", self._out.read()
        chunks = []
        while True:
            try:
                chunk = self.obj.read(1 << 17)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not chunk:  # what an SSLObject's read gives once the peer's close_notify has come
                self.peer_closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks), self._out.read()

    def pending(self) -> bytes:
        """TLS bytes waiting to be sent (the alert of a failed handshake)."""
        return self._out.read()

    def close_notify(self) -> bytes:
        """Our close_notify, answering the client's (its TLS close waits for it, else for its timeout)."""
        try:
            self.obj.unwrap()
        except ssl.SSLError:
            pass
        return self._out.read()

    def send(self, data: bytes) -> bytes:
        """Plain bytes out; the TLS bytes to write to the transport."""
        self.obj.write(data)
        return self._out.read()
