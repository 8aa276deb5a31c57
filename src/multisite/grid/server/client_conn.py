"""The grid client's connection to a container, shared by all the threads of one client.

Why shared: with one connection per thread and container, a client of 128 threads made 128 TLS
handshakes per container (about 4 ms of CPU each), and every request and answer was a TLS record of
its own, decrypted by asyncio's TLS layer in Python on the container. One connection carries every
thread's requests, pipelined: each request has its ``rid``, the container answers each as it
completes (``client_sessions.serve_client``), and answers that complete together leave in one write
(``security.BatchedWriter``): one record, one ``recv``, for many requests.

How: a thread's request is queued and sent at once, together with any queued while another thread
was sending (one ``sendall``, with TLS one record). A reader thread per connection reads the answers
and hands each to the thread waiting for its rid. When the connection breaks, every request still
waiting gets the error, marked **sent** or not: a request that was never written may go elsewhere,
one that was must be reported as of unknown outcome (``client.Grid._request``).

With TLS the socket stays a plain socket and the TLS state is an ``ssl.SSLObject`` over memory
buffers: an ``ssl.SSLSocket`` must not be read by one thread while another writes it, an
``SSLObject`` used under a lock may. Sends hold ``_send_lock`` then the TLS lock (``_TLS.lock``),
always in that order, so records leave in the order they were made.
"""

from __future__ import annotations

import socket
import ssl
import threading

from ...errors import AuthenticationFailed, MultisiteError, PermissionDenied, WrongGrid
from ...net.tls import parse_hostport
from ..shard_wire import SHARD_WIRE_VERSION, DataWire, Done, Failed, FailCode, Open, Opened, encode

CONNECT_TIMEOUT_S = 2.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a loaded container takes its time: abandoned handshakes were retried in a storm
REPLY_TIMEOUT_S = 10.0  # a commit waits at most a vote timeout and a catalog round trip
RECV_BYTES = 1 << 16
REFUSALS = ("AUTHENTICATION_FAILED", "PERMISSION_DENIED", "TLS_REQUIRED")


class NotSent(ConnectionError):
    """The connection broke before the request was written: it may be sent elsewhere."""


def refusal(code: str, message: str) -> MultisiteError:
    """A grid port's authentication refusal as the exception the application sees."""
    if code == "PERMISSION_DENIED":
        return PermissionDenied(message)
    return AuthenticationFailed(message)  # AUTHENTICATION_FAILED, TLS_REQUIRED


class _TLS:
    """A client TLS session over memory buffers, its handshake done on ``sock`` (blocking)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, host: str, session: ssl.SSLSession | None) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname=host, session=session)
        self.lock = threading.Lock()
        sock.settimeout(TLS_HANDSHAKE_TIMEOUT_S)  # abandoning a slow handshake only starts another one
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(self.outgoing.read())
                data = sock.recv(RECV_BYTES)
                if not data:
                    raise ConnectionError("the container closed the connection during the TLS handshake")
                self.incoming.write(data)
        sock.sendall(self.outgoing.read())

    def encrypt(self, data: bytes) -> bytes:
        with self.lock:
            self.obj.write(data)
            return self.outgoing.read()

    def decrypt(self, data: bytes) -> tuple[bytes, bool]:
        """The plaintext in ``data`` (and what came before it), and whether the peer ended TLS."""
        out, ended = [], False
        with self.lock:
            self.incoming.write(data)
            while True:
                try:
                    out.append(self.obj.read(RECV_BYTES))
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    ended = True
                    break
        return b"".join(out), ended

    def pending(self) -> bytes:
        """Bytes TLS made while reading (a key update's answer): sent under the send lock."""
        with self.lock:
            return self.outgoing.read()


class _Waiting:
    """One request waiting for its answer: ``done`` is released when it came, or the connection broke."""

    __slots__ = ("done", "answer", "error", "sent")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.answer: Done | Failed | None = None
        self.error: BaseException | None = None
        self.sent = False


class _Conn:
    """One connection to a container, for any number of threads (see the module docstring)."""

    def __init__(self, address: str, grid: str, tls: ssl.SSLContext | None = None, user: str | None = None,
                 password: str | None = None, session: ssl.SSLSession | None = None) -> None:
        self.address = address
        host, port = parse_hostport(address)
        self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.tls = _TLS(self.sock, tls, host, session) if tls is not None else None
            self.sock.settimeout(REPLY_TIMEOUT_S)
            self.wire = DataWire(server=False)
            self._send_lock = threading.Lock()  # one sender at a time: the bytes of a request stay together
            self.sock.sendall(self._seal(encode(Open(SHARD_WIRE_VERSION, grid, user, password))))
            self._opened(self._first(), address)
        except BaseException:
            self.sock.close()
            raise
        self.session = self.tls.obj.session if self.tls is not None else None  # (TLS 1.3: its ticket came by now)
        self.sock.settimeout(None)  # the reader waits for answers as long as the connection lives
        self.rid = 0
        self.broken: BaseException | None = None
        self._lock = threading.Lock()  # the rids, the waiting requests, the queue
        self._waiting: dict[int, _Waiting] = {}
        self._queue: list[tuple[bytes, _Waiting]] = []
        threading.Thread(target=self._read_answers, name=f"grid-client-{address}", daemon=True).start()

    def _seal(self, data: bytes) -> bytes:
        return self.tls.encrypt(data) if self.tls is not None else data

    def _first(self):
        """The container's answer to Open, read before the reader thread starts."""
        while True:
            msg = self.wire.next_event()
            if msg is not None:
                return msg
            data = self._receive()
            if data:  # (b"" would tell the wire the stream ended)
                self.wire.receive_data(data)

    def _receive(self) -> bytes:
        """The next bytes from the container (with TLS, what they decrypt to: maybe none, as for a
        session ticket); ConnectionError at the end of the connection."""
        data = self.sock.recv(RECV_BYTES)
        ended = not data
        if self.tls is not None and data:
            data, ended = self.tls.decrypt(data)
            if self.tls.outgoing.pending:
                with self._send_lock:
                    self.sock.sendall(self.tls.pending())
        if ended:
            raise ConnectionError(f"container {self.address} closed the connection")
        return data

    @staticmethod
    def _opened(first, address: str) -> None:
        if isinstance(first, Failed):
            if first.code == FailCode.WRONG_GRID:
                raise WrongGrid(first.message)
            if first.code in REFUSALS:
                raise refusal(first.code, f"container {address}: {first.message}")
            raise MultisiteError(f"container {address}: {first.code}: {first.message}")
        if not isinstance(first, Opened):
            raise MultisiteError(f"container {address} answered {type(first).__name__} to Open")

    def closed_by_peer(self) -> bool:
        """Whether this connection broke (then a new request was never sent on it)."""
        return self.broken is not None

    def ask(self, make) -> Done | Failed:
        """Send ``make(rid)`` and wait for its answer. ``NotSent`` if the connection broke before it was
        written; another ``OSError`` (a ConnectionError, a timeout) once it may have been."""
        w = _Waiting()
        with self._lock:
            if self.broken is not None:
                raise NotSent(f"container {self.address}: {self.broken}")
            self.rid += 1
            rid = self.rid
            self._waiting[rid] = w
            self._queue.append((encode(make(rid)), w))
        self._send()
        if not w.done.acquire(timeout=REPLY_TIMEOUT_S):
            with self._lock:
                self._waiting.pop(rid, None)
            raise TimeoutError(f"container {self.address}: no answer within {REPLY_TIMEOUT_S:g} s")
        if w.error is not None:
            raise (ConnectionError if w.sent else NotSent)(f"container {self.address}: {w.error}")
        return w.answer

    def _send(self) -> None:
        """Send every queued request (this thread's, unless another sender took it along)."""
        with self._send_lock:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch or self.broken is not None:
                    return
                for _, w in batch:
                    w.sent = True
            try:
                self.sock.sendall(self._seal(b"".join(frame for frame, _ in batch)))
            except (OSError, ValueError) as e:  # ValueError: closed meanwhile
                self._break(e)

    def _read_answers(self) -> None:
        """The reader thread: each answer to the thread waiting for its rid, until the connection ends."""
        try:
            while True:
                data = self._receive()
                if data:  # (b"" would tell the wire the stream ended)
                    self.wire.receive_data(data)
                    self._hand_out()
        except (OSError, ValueError, MultisiteError) as e:
            self._break(e)

    def _hand_out(self) -> None:
        while (msg := self.wire.next_event()) is not None:
            rid = getattr(msg, "rid", None)
            with self._lock:
                w = self._waiting.pop(rid, None)
            if w is not None:
                w.answer = msg
                w.done.release()
            elif isinstance(msg, Failed) and msg.rid == 0:
                raise ConnectionError(f"{msg.code}: {msg.message}")

    def _break(self, e: BaseException) -> None:
        """The connection is over: every waiting request gets ``e``, and the socket closes."""
        with self._lock:
            if self.broken is None:
                self.broken = e
            waiting, self._waiting, self._queue = self._waiting, {}, []
        for w in waiting.values():
            w.error = e
            w.done.release()
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread, which then closes it
        except OSError:
            pass
        self._break(ConnectionError("closed by the client"))

