"""TLS and authentication for a grid process's port and its outgoing links (issue 24; rules: ``grid/access.py``).

``GridSecurity`` is made once per catalog or container: its TLS contexts (the listener takes clients
with or without a certificate, and verifies one presented against the grid's CA; outgoing links
present the process's member certificate), the users (``server.client_auth.ClientAuth`` over the
users file in ``users_dir``, re-read when it changes, with its pacing of failed passwords), and the
check of ``--listen``. For each connection: ``peer(writer)`` reads the verified certificate,
``member_refusal`` says whether it may register or subscribe as a name, and ``client(...)`` gives the
connection's ``Access``, whose ``refusal(op)`` is None or ``(code, message)`` per request.

``serve`` is the listener: every connection it accepts has a ``BatchedWriter`` (a loop iteration's
writes leave together); with TLS each accepted socket is peeked at first, so that a peer speaking plain grid frames to a TLS port (a container or client
started without ``--tls-*``) gets a refusal it can read (``TLS_REQUIRED``) and stops, rather than a
dropped connection it would retry forever; a TLS one is handed to asyncio's TLS with a handshake
timeout. ``certificate_refused`` tells a peer's verdict on our certificate (final) from a lost
connection (retried).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from pathlib import Path
from typing import Awaitable, Callable

import msgspec

from ...errors import AuthenticationFailed, ConfigError, MultisiteError, PermissionDenied
from ...net.tls import TLSConfig, parse_hostport
from ...server.client_auth import ClientAuth, Gate
from ...protocol.framing import encode_frame
from ..access import OPS, Peer, check_listen, member_refusal, own_certificate_refusal, peer_of
from ..shard_wire import FIRST_TYPES, Failed, encode
from ..wire import NEED_DATA, GridWire, Refused, Side, StatusRequest

TLS_HANDSHAKE_TIMEOUT_S = 5.0  # a connection that never completes its handshake gives its slot back
LISTEN_BACKLOG = 1024  # connections the kernel holds until accepted (asyncio's servers take 100)
FIRST_BYTES_TIMEOUT_S = 5.0  # a connection that sends nothing is closed after this
TLS_RECORD = b"\x16\x03"  # a TLS handshake record (a grid frame of 22 bytes starts 16 00: little-endian length)
FRAME_HEAD_BYTES = 5  # u32 length and u8 type: enough to tell a data connection from a catalog one
TLS_REQUIRED = "TLS_REQUIRED"
# With TLS 1.3 a client learns that its certificate was refused only after its handshake completed, and
# asyncio's server drops the connection without sending the alert: a grid port that completes TLS and
# closes before any answer has refused the certificate (or is stopping; a member asks again a few times).
CLOSED_AFTER_TLS = ("TLS: the peer completed the handshake and closed without an answer: it refuses this "
                    "certificate (not signed by the grid's CA?)")
CLOSES_BEFORE_REFUSED = 3
_encoder = msgspec.msgpack.Encoder()
# An alert (or our own check) that is a verdict on a certificate, not a lost connection.
_CERT_REASONS = ("CERTIFICATE", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "ACCESS_DENIED")


def certificate_refused(e: BaseException) -> bool:
    """Whether a TLS failure is a refusal of a certificate (ours by the peer, or the peer's by our CA)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return True
    return isinstance(e, ssl.SSLError) and any(r in str(e.reason or e).upper() for r in _CERT_REASONS)


class Access:
    """One connection's right to make grid requests: a member may make all; a client what its role allows."""

    def __init__(self, gate: Gate | None, who: str) -> None:
        self.gate, self.who = gate, who

    def refusal(self, op: str) -> tuple[str, str] | None:
        if self.gate is None:
            return None
        try:
            self.gate.admit(OPS[op], None)
        except PermissionDenied as e:
            return "PERMISSION_DENIED", str(e)
        except AuthenticationFailed as e:
            return "AUTHENTICATION_FAILED", str(e)
        return None


class GridSecurity:
    def __init__(self, grid: Callable[[], str], tls: TLSConfig | None, users_dir: Path, host: str, insecure: bool,
                 log: logging.Logger) -> None:
        self.grid, self.tls, self.log = grid, tls, log
        users_dir.mkdir(parents=True, exist_ok=True)
        self.auth = ClientAuth(users_dir, host, log, tls=tls, insecure=True)  # the grid's own rule, below
        check_listen(host, tls is not None, len(self.auth.users.current()), insecure)
        self.server_ssl = self.auth.ssl_context
        self.client_ssl: ssl.SSLContext | None = tls.client_context() if tls else None
        if tls is not None:
            me = peer_of(_own_certificate(tls))
            why = own_certificate_refusal(me, grid())
            if why:
                raise ConfigError(why)
            self.name = me.name
        self.refused = 0

    def status(self) -> dict:
        return {"tls": self.tls is not None, **{k: v for k, v in self.auth.status().items() if k != "admission"},
                "refused": self.refused + self.auth.refused}

    # -- a connection ------------------------------------------------------------------------------
    def peer(self, writer: asyncio.StreamWriter) -> Peer:
        return peer_of(writer.get_extra_info("peercert")) if self.tls is not None else Peer()

    def member_refusal(self, peer: Peer, as_name: str, what: str) -> str | None:
        """With TLS, whether ``peer`` may ``what`` as ``as_name`` (a member of this grid of that name)."""
        if self.tls is None:
            return None
        why = member_refusal(peer, self.grid(), as_name, what)
        if why:
            self.refused += 1
            self.log.warning("refused %s as %s: %s", what, as_name, why)
        return why

    async def client(self, writer: asyncio.StreamWriter, peer: Peer, user: str | None,
                     password: str | None) -> Access | tuple[str, str]:
        """The connection's ``Access`` (a member, or a client authenticated by certificate or password),
        or ``(code, message)`` when its user and password are refused."""
        if peer.member_of(self.grid()):
            return Access(None, f"member {peer.name}")
        addr = writer.get_extra_info("peername") or ("?", 0)
        gate = self.auth.gate(addr, peer.name if peer.grid is None else None)  # another grid's CN is no user
        if user is not None or password is not None:
            try:
                await asyncio.to_thread(gate.admit, "hello", {"user": user, "password": password})
            except AuthenticationFailed as e:
                return "AUTHENTICATION_FAILED", str(e)
            except MultisiteError as e:  # a malformed hello
                return "AUTHENTICATION_FAILED", str(e)
        return Access(gate, gate.auth.user or "anonymous")


def _own_certificate(tls: TLSConfig) -> dict:
    """This process's certificate as ``getpeercert()`` shows a peer's (its subject)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the TLS certificate {tls.cert}: {e}") from None
    names = {"commonName": NameOID.COMMON_NAME, "organizationalUnitName": NameOID.ORGANIZATIONAL_UNIT_NAME}
    subject = []
    for key, oid in names.items():
        for attr in cert.subject.get_attributes_for_oid(oid):
            subject.append(((key, attr.value),))
    return {"subject": tuple(subject)}


async def probe_catalog(address: str, security: GridSecurity, timeout_s: float = 10.0) -> str | None:
    """Whether a catalog of the grid takes this process's certificate (a member asking its status): None if
    it does, why not if it refused; OSError or TimeoutError when it cannot be reached."""
    host, port = parse_hostport(address)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=security.client_ssl),
                                                timeout_s)
    except ssl.SSLError as e:
        if certificate_refused(e):  # the catalog's certificate is not of our CA, or it refused ours
            return f"TLS: {e.reason or e}"
        raise
    try:
        wire = GridWire(Side.MEMBER)
        writer.write(wire.send(StatusRequest()))
        while True:
            ev = wire.next_event()
            if ev is None:  # TLS 1.3: a refused client certificate shows as a close after the handshake
                return CLOSED_AFTER_TLS
            if ev is not NEED_DATA:
                return f"{ev.code}: {ev.message}" if isinstance(ev, Refused) else None
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), timeout_s)
            except ssl.SSLError as e:
                if certificate_refused(e):
                    return f"TLS: {e.reason or e}"
                raise
            wire.receive_data(data)
    except ssl.SSLError as e:
        if certificate_refused(e):
            return f"TLS: {e.reason or e}"
        raise
    finally:
        writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class BatchedWriter(asyncio.StreamWriter):
    """A ``StreamWriter`` whose writes of one loop iteration leave together, at the end of it.

    asyncio sends each ``write`` at once: a ``send`` each, and with TLS a record each, encrypted by
    asyncio's TLS layer in Python. The answers of a batch of commits to one client connection (its
    threads share it: ``client_conn.py``), or a vote's outcome and the next prepare on a replica's
    link, then cost one record and one ``send`` each; joined, one for all (bench/grid.py's TLS
    figure). ``drain`` and ``close`` send what is held first."""

    def __init__(self, transport: asyncio.BaseTransport, protocol, reader, loop) -> None:
        super().__init__(transport, protocol, reader, loop)
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._send_held)
        self._held.append(data)

    def writelines(self, data) -> None:
        for d in data:
            self.write(d)

    def _send_held(self) -> None:
        if self._held:
            data, self._held = b"".join(self._held), []
            if not self.transport.is_closing():
                self.transport.write(data)

    async def drain(self) -> None:
        self._send_held()
        await super().drain()

    def close(self) -> None:
        self._send_held()
        super().close()

    def write_eof(self) -> None:
        self._send_held()
        super().write_eof()


async def open_connection(host: str, port: int, security: GridSecurity) -> tuple[asyncio.StreamReader,
                                                                                  asyncio.StreamWriter]:
    """``asyncio.open_connection`` to a grid port, with this process's TLS when it has it, and a
    ``BatchedWriter``."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
    transport, protocol = await loop.create_connection(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                       host, port, ssl=security.client_ssl)
    return reader, BatchedWriter(transport, protocol, reader, loop)


async def serve(handler: Handler, host: str, port: int, security: GridSecurity) -> Listener:
    """Listen on ``host:port`` for ``handler`` (see the module docstring)."""
    sock = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
    sock.setblocking(False)
    lst = Listener(sock)
    lst.task = asyncio.create_task(lst.accept(handler, security))
    return lst


class Listener:
    """A grid port: ``port``, ``close()`` (see ``serve``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.task: asyncio.Task | None = None
        self.conns: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        for t in self.conns:
            t.cancel()
        self.sock.close()

    async def accept(self, handler: Handler, security: GridSecurity) -> None:
        """Every connection waiting, at each wake-up (as asyncio's own servers do): one accept per loop
        iteration let a burst of clients overflow the backlog, and their SYNs waited a second to be resent."""
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.sock)
            waiting = [conn]
            for _ in range(LISTEN_BACKLOG):
                try:
                    waiting.append(self.sock.accept()[0])
                except (BlockingIOError, InterruptedError):
                    break
            for c in waiting:
                t = asyncio.create_task(self._one(c, handler, security))
                self.conns.add(t)
                t.add_done_callback(self.conns.discard)

    async def _one(self, conn: socket.socket, handler: Handler, security: GridSecurity) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        # asyncio disables Nagle only on sockets whose proto is IPPROTO_TCP; one from create_server has 0:
        # without this, a vote's answer waited for a delayed ACK (45 ms a commit with min_sync 1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if security.server_ssl is not None:
            try:
                head = await asyncio.wait_for(_peek(loop, conn), FIRST_BYTES_TIMEOUT_S)
            except (TimeoutError, OSError):
                conn.close()
                return
            if not head.startswith(TLS_RECORD):
                await _refuse_plain(loop, conn, head, security)
                return
        reader = asyncio.StreamReader(limit=2 ** 16)
        try:
            transport, protocol = await loop.connect_accepted_socket(
                lambda: asyncio.StreamReaderProtocol(reader), conn, ssl=security.server_ssl,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if security.server_ssl is not None else None)
        except (OSError, TimeoutError) as e:  # a refused certificate, a handshake that never ends
            security.refused += 1
            security.log.warning("TLS handshake from %s refused: %s", _addr(conn), getattr(e, "reason", None) or e)
            conn.close()
            return
        writer = BatchedWriter(transport, protocol, reader, loop)
        await handler(reader, writer)


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first bytes the peer sent, left in the socket (b"": it closed)."""
    ready = loop.create_future()
    loop.add_reader(conn.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(FRAME_HEAD_BYTES, socket.MSG_PEEK)


async def _refuse_plain(loop: asyncio.AbstractEventLoop, conn: socket.socket, head: bytes,
                        security: GridSecurity) -> None:
    """A peer speaking plain frames to a TLS port: one refusal frame it understands, then close."""
    why = ("this grid port takes TLS only: give --tls-cert, --tls-key and --tls-ca (the grid's CA), or "
           "tls_ca= and a user to multisite.grid.connect")
    security.refused += 1
    security.log.warning("plain connection from %s refused: TLS only", _addr(conn))
    frame = encode(Failed(0, TLS_REQUIRED, why)) if len(head) == FRAME_HEAD_BYTES and head[4] in FIRST_TYPES \
        else encode_frame(_encoder, Refused(TLS_REQUIRED, why))
    try:
        if head:
            try:
                conn.recv(1 << 16)  # what it sent: a close with unread bytes is a reset, which can discard our answer
            except BlockingIOError:
                pass
            await asyncio.wait_for(loop.sock_sendall(conn, frame), 2.0)
            conn.shutdown(socket.SHUT_WR)
    except (OSError, TimeoutError):
        pass
    finally:
        conn.close()


def _addr(conn: socket.socket) -> str:
    try:
        h, p = conn.getpeername()[:2]
        return f"{h}:{p}"
    except OSError:
        return "?"

