"""The client protocol's listener: a thread per connection, each running its own transactions.

Why threads and not the server's asyncio loop: a commit blocks (on the commit lock and the fsync),
so the loop would hand every request to a worker thread and take the reply back, two thread
wake-ups per request on top of the network's. A connection's own thread reads a request, runs it
through the engine and writes the reply itself; concurrent connections share group commits. The
protocol (framing, ops) is ``protocol.client``; what each op does is ``InstanceServer._client_op``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable

from ..errors import ConfigError, MultisiteError, RemoteProtocolError, ServerError
from ..protocol.client import FrameBuffer, encode

MAX_CONNECTIONS = 256  # client connections at once; more are closed at accept, with a log line
KEEPALIVE_S = 30  # a client silent this long is probed (TCP keepalive); see keepalive()
KEEPALIVE_PROBES = 3
BUFFER_BYTES = 1 << 30  # request bytes all connections may hold at once (each frame up to 64 MiB)


def check_keepalive(seconds: object) -> int:
    """``--keepalive``: whole seconds from 1 to 32767 (Linux's TCP_KEEPIDLE range); ConfigError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 32767:
        raise ConfigError(f"--keepalive takes whole seconds from 1 to 32767, got {seconds!r}")
    return seconds


def keepalive(conn: socket.socket, seconds: int) -> None:
    """Drop a client whose host or network vanished without closing the connection: after ``seconds``
    of silence the kernel probes it, ``KEEPALIVE_PROBES`` times ``seconds / 3`` apart, and a client
    that answers none is reset (its thread's recv fails), so it does not hold a thread and one of the
    ``MAX_CONNECTIONS`` slots forever. A reply it never acknowledges fails as late (TCP_USER_TIMEOUT).
    An idle client that is alive answers the probes itself (its kernel does) and stays connected."""
    interval = max(1, seconds // 3)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, (seconds + KEEPALIVE_PROBES * interval) * 1000)


class ClientListener:
    def __init__(self, host: str, port: int, run_op: Callable[[str, dict], Any], log: logging.Logger,
                 keepalive_s: int = KEEPALIVE_S, buffer_bytes: int = BUFFER_BYTES, auth: Any = None):
        self._auth = auth  # net.client_auth.ClientAuth: TLS and who may do what (None: every client, all ops)
        self.keepalive_s = check_keepalive(keepalive_s)
        self.buffer_bytes = buffer_bytes
        self._buffered = 0  # bytes all connections hold in their FrameBuffers (under _lock)
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._run_op = run_op
        self._log = log
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._closing = False
        self._acceptor = threading.Thread(target=self._accept, name="client-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return  # closed
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keepalive(conn, self.keepalive_s)
            except OSError as e:  # the client is already gone: this connection only, not the acceptor
                self._log.warning("client connection from %s dropped at accept: %s", _peer(addr), e)
                conn.close()
                continue
            with self._lock:
                if self._closing or len(self._conns) >= MAX_CONNECTIONS:
                    self._log.warning("client connection from %s refused: %s", addr,
                                      "shutting down" if self._closing else f"{MAX_CONNECTIONS} connections open")
                    conn.close()
                    continue
                th = threading.Thread(target=self._serve, args=(conn, addr), name=f"client-{addr[1]}",
                                      daemon=True)
                self._conns[conn] = th
            th.start()

    @property
    def connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._conns)

    def _hold(self, held: int, now: int) -> int:
        """Account for a connection holding ``now`` bytes instead of ``held``; refuse growth past the
        budget: 256 connections each filling a 64 MiB frame would otherwise take 16 GiB and the
        instance's owner with them (the kernel's OOM killer)."""
        with self._lock:
            if now > held and self._buffered + now - held > self.buffer_bytes:
                total = self._buffered
                raise RemoteProtocolError(
                    f"the server holds {total / 2**20:.0f} MiB of client requests not yet received in full, "
                    f"its limit is {self.buffer_bytes / 2**20:.0f} MiB; send smaller requests or retry later")
            self._buffered += now - held
        return now

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        buf = FrameBuffer()
        held = 0  # of this listener's buffer budget
        gate = None
        try:
            if self._auth is not None:
                raw, accepted = conn, self._auth.accept(conn, addr)  # TLS handshake; refusals are logged
                if accepted is None:
                    return
                conn, gate = accepted
                buf.max_frame_bytes = gate.max_frame_bytes  # small until authenticated
                with self._lock:  # close() must reach the TLS socket, which now owns the descriptor
                    self._conns[conn] = self._conns.pop(raw)
                    if self._closing:
                        return
            while not self._closing:
                data = conn.recv(1 << 20)
                if not data:
                    return
                buf.feed(data)
                held = self._hold(held, len(buf))
                while (req := buf.next()) is not None:
                    held = self._hold(held, len(buf))
                    if not (isinstance(req, list) and len(req) == 3 and isinstance(req[2], dict)):
                        raise RemoteProtocolError(f"client request must be [id, op, args], got {req!r:.80}")
                    conn.sendall(encode(self._reply(*req, gate=gate)))
                    if gate is not None:
                        buf.max_frame_bytes = gate.max_frame_bytes
                    if self._closing or (gate is not None and gate.must_close):
                        return  # the request in flight was answered; take no more
        except RemoteProtocolError as e:
            # A frame that cannot be read leaves nothing to go on: say why, then close.
            self._log.warning("client connection from %s closed: %s", _peer(addr), e)
            try:
                conn.sendall(encode([None, False, [e.code, e.message]]))
            except OSError:
                pass
        except OSError as e:
            if not self._closing:
                self._log.warning("client connection from %s closed: %s", _peer(addr), e)
        finally:
            with self._lock:
                self._buffered -= held
                self._conns.pop(conn, None)
            conn.close()

    def _reply(self, rid: Any, op: Any, args: dict, gate: Any = None) -> list:
        try:
            if gate is not None and (hello := gate.admit(op, args)) is not None:
                return [rid, True, hello]
            return [rid, True, self._run_op(op, args)]
        except MultisiteError as e:
            return [rid, False, [e.code, e.message]]
        except (KeyError, TypeError, ValueError) as e:  # a request missing or mistyping an argument
            return [rid, False, [ConfigError.code, f"malformed {op!r:.40} request: {type(e).__name__}: {e}"]]
        except Exception as e:  # a bug met by this request: answer it and keep serving the connection
            self._log.exception("client request %r failed", op)
            return [rid, False, [ServerError.code, f"{op!r:.40} failed in the server: {type(e).__name__}: {e}"]]

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, end every connection, and wait for the transactions in flight."""
        with self._lock:
            self._closing = True
            conns = dict(self._conns)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (a close alone would not)
        except OSError:
            pass
        self._sock.close()
        for conn in conns:
            try:
                # The reading side only: the thread's recv returns, and a request in flight finishes
                # and its reply still reaches the client (a commit made durable is acknowledged).
                socket.socket.shutdown(conn, socket.SHUT_RD)  # TLS too: SSLSocket's own would drop its TLS state
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s  # one bound for all, not one per connection
        for th in conns.values():
            th.join(max(0.0, deadline - time.monotonic()))
        for conn, th in conns.items():
            if th.is_alive():  # blocked sending to a client that reads no replies: cut it
                try:
                    socket.socket.shutdown(conn, socket.SHUT_RDWR)
                except OSError:
                    pass
                th.join(1.0)
        self._acceptor.join(timeout_s)


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
