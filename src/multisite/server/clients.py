"""The client protocol's listener: one event loop reads every connection; commits gather into group commits.

Before (issue 14), a thread per connection ran its own requests and handed each commit to the
engine's group commit: under the GIL every hand-off cost thread wake-ups, and 2 connections
committed at half PostgreSQL's rate. Now one thread runs an asyncio loop over all connections
(``clients-loop``). What arrives together is gathered (``protocol.client.Gathering``): the loop
writes the commits ready in one pass as one batch (``Database.prepare`` then ``Prepared.write``: one
journal write, the commit lock held only while it runs); a thread of its own (``clients-sync``)
runs one fdatasync after another (``Database.harden``) while batches are written, each covering all
that was written when it started, so the next batches are written while the last syncs and are
answered together after the next one. When nothing else waits for the loop (no other connection has a
request unanswered or committed within ``ACTIVE_WINDOW_S``, no group is hardening) and recent
fdatasyncs were short (``INLINE_SYNC_MAX_S``),
the loop runs the group's fdatasync itself and answers at once: at 2 connections that spares each
commit two thread wake-ups (loop to sync thread, and back), the cost the issue's second pass
measured. Reads (get/items/info) run on the loop at once; they never wait behind an fdatasync but
such a short one. A connection may pipeline; its replies go out in order (``ClientSession``).
Anything else (create_region, a commit on a secondary, where the engine's own path decides) runs in
a small worker pool, one request of a connection at a time. docs/decisions.md says what was measured.
The sync thread lives in ``server.syncer``; on a TLS client port, a connection's TLS runs over memory
buffers on the loop (``server.memtls``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import AuthenticationRequired, ConfigError, MultisiteError, RemoteProtocolError, ServerError
from ..protocol.admission import AdmissionPolicy
from ..protocol.client import GATHERED, READ_OPS, ClientSession, Gathering, Request, encode
from .client_auth import PLAIN_REFUSED, TLS_HANDSHAKE_RECORD, common_name
from .memtls import MemoryTLS
from .min_confirm import ListenerMinConfirm
from .sockets import KEEPALIVE_S, check_keepalive, keepalive, listener_cpu, new_loop, pin_thread, unpin_thread
from .syncer import Syncer

# Client connections at once; more are closed at accept, with a log line. With authentication
# (``auth``) the connection slots are ``protocol.admission``'s, which also bounds those not logged in.
MAX_CONNECTIONS = AdmissionPolicy.connections_max
ACCEPT_BACKLOG = 1024  # connections the kernel queues for accept: a burst of connects must not drop a client's SYN
REFUSAL_LOG_EVERY_S = 1.0  # at most one log line a second for connections refused or closed before login
BUFFER_BYTES = 1 << 30  # request bytes all connections may hold at once (each frame up to 64 MiB)
WRITE_BUFFER_BYTES = 1 << 20  # replies held for a client that does not read them; its reading pauses past it
WORKERS = 4  # threads running requests that may block on the commit lock or an fsync (create_region, ...)
# A group's fdatasync runs on the loop itself (no hand-off to the sync thread and back) when nothing
# else waits for the loop: no other connection has a request unanswered and no earlier group is
# hardening; and only while recent fdatasyncs were this short (an EWMA of them). On a quick disk the
# two hand-offs are the cost (measured: 1.41x the rate at 2 connections); on a slow one the overlap of
# the next batch's write with the fdatasync matters more (measured: 0.75x with fdatasyncs of 0.6-2 ms),
# and a read arriving meanwhile must not wait long. docs/decisions.md, "The client commit path, second
# pass" has the figures.
INLINE_SYNC_MAX_S = 0.0005
# ... and only while no connection outside the group sent a commit within this window: one that did
# is likely to send its next during the fdatasync (2 connections alternating), and with the fdatasync
# in the sync thread the loop writes that commit meanwhile, so the two overlap instead of adding up
# (issue 27 measured it; docs/decisions.md, "The client commit path, third pass").
ACTIVE_WINDOW_S = 0.005


class _Connection(asyncio.Protocol):
    """One client connection's transport; what it means is in its ``ClientSession``."""

    def __init__(self, listener: "ClientListener"):
        self.lis = listener
        self.session = ClientSession()
        self.session.owner = self
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.held = 0  # bytes of the listener's budget this connection's partial frames hold
        self.reading = True
        self.write_paused = False
        self.failed: list | None = None  # the reply saying why it closes, sent once what is in flight is
        self.ending = False  # closes once what is in flight is answered (a refused hello)
        self.lost = False
        self.open = False  # counted among the listener's connections
        self.addr: Any = None
        self.tls: MemoryTLS | None = None  # on a TLS client port, once the first bytes said TLS
        self.tls_pending = False  # a TLS port: the first bytes decide (a plain client gets a plain error)
        self.gate: Any = None  # net.client_auth.Gate: who this client is and what it may do
        self.active_at = 0.0  # monotonic time of its last gathered commit (ACTIVE_WINDOW_S)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.lis._opened(self, transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.lis._received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lis._lost(self, exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.lis._flow(self)

    def resume_writing(self) -> None:
        self.write_paused = False
        self.lis._flow(self)


class ClientListener(ListenerMinConfirm):
    """Serves the client protocol on ``host:port`` from a thread of its own (``clients-loop``).

    ``run_op(op, args)`` answers a request; with ``db`` (the instance server's Database) and
    ``commit_ops(args)`` (which checks a commit's arguments and returns the engine's updates), the
    commits of a primary are gathered into group commits instead. With ``auth``
    (``net.client_auth.ClientAuth``) the port takes TLS when it has a context (handshakes on the loop,
    over memory buffers) and every request passes the connection's gate first; a hello, which
    verifies a password hash, runs in a worker thread."""

    def __init__(self, host: str, port: int, run_op: Callable[[str, dict], Any], log: logging.Logger,
                 keepalive_s: int = KEEPALIVE_S, buffer_bytes: int = BUFFER_BYTES, *, db: Any = None,
                 commit_ops: Callable[[dict], list] | None = None, auth: Any = None, observer: Any = None):
        self._auth = auth  # net.client_auth.ClientAuth: TLS and who may do what (None: every client, all ops)
        self.keepalive_s = check_keepalive(keepalive_s)
        self.buffer_bytes = buffer_bytes
        self._buffered = 0  # bytes all connections hold in partial frames (the loop's thread only)
        self._run_op = run_op
        self._log = log
        self._db = db if commit_ops is not None else None
        self._commit_ops = commit_ops
        # with --metrics (server.metrics.InstanceMetrics): commit_done(seconds) per gathered commit answered
        # durable, error(code) per error reply; gathered commits never pass through run_op
        self._observer = observer
        self._conns: set[_Connection] = set()
        self._closing = False
        self._gathering = Gathering()
        self._write_soon = False  # a batch write is scheduled for this pass of the loop
        self.groups = 0  # fdatasyncs of gathered groups (status, benchmarks)
        self.batched = 0  # commits written in gathered batches
        self.batches = 0  # batches written
        self.inline = 0  # groups hardened on the loop itself (INLINE_SYNC_MAX_S)
        self.inline_sync_max_s = INLINE_SYNC_MAX_S
        self.active_window_s = ACTIVE_WINDOW_S
        self.min_confirm_timeout_s = 0.0
        self._confirm_why: Callable[[], str] = str
        self._deadline_timer: asyncio.TimerHandle | None = None  # the next login deadline (protocol.admission)
        self._unlogged: list = [0.0, 0]  # [when a refusal was last logged, refusals since] (REFUSAL_LOG_EVERY_S)
        cpu = listener_cpu()  # the loop and sync threads share one CPU (ConfigError for a wrong one, here)
        self._pinned = {cpu} if cpu is not None else None
        sock = socket.create_server((host, port))  # OSError here, in the caller's thread
        self.port: int = sock.getsockname()[1]
        # workers (a hello's password hash, create_region) may use every CPU: not the loop's pinning
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="clients-worker",
                                           initializer=unpin_thread if cpu is not None else None)
        self._loop = new_loop()
        self._server: asyncio.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock, started), name="clients-loop", daemon=True)
        self._thread.start()
        started.wait()
        self._syncer = Syncer(self._db, self._gathering, self._loop, self._synced, log, self._pinned)  # clients-sync
        if self._db is not None:
            self._syncer.start()
        log.info("client listener on %s:%d: one %s event loop over every connection%s%s", host, self.port,
                 type(self._loop).__module__.split(".")[0],
                 ", commits gathered into group commits" if self._db is not None else "",
                 f", its threads on CPU {cpu}" if cpu is not None else "")

    # -- the loop's thread -------------------------------------------------------------------------
    def _run(self, sock: socket.socket, started: threading.Event) -> None:
        loop = self._loop
        pin_thread(self._pinned)
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(loop.create_server(lambda: _Connection(self), sock=sock,
                                                                      backlog=ACCEPT_BACKLOG))
        finally:
            started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._conns)

    def stats(self) -> dict:
        """Commits gathered: how many, in how many written batches and fdatasync'd groups."""
        return {"commits": self.batched, "batches": self.batches, "groups": self.groups,
                "inline": self.inline, "sync_s": round(self._syncer.sync_s, 3)}

    def _opened(self, conn: _Connection, transport: asyncio.Transport) -> None:
        conn.transport = transport
        addr = transport.get_extra_info("peername")
        conn.peer = _peer(addr)
        if self._closing or (self._auth is None and len(self._conns) >= MAX_CONNECTIONS):
            self._log.warning("client connection from %s refused: %s", addr,
                              "shutting down" if self._closing else f"{MAX_CONNECTIONS} connections open")
            transport.abort()
            return
        if self._auth is not None and not self._take_slot(conn, addr):
            return
        try:
            s = transport.get_extra_info("socket")
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(s, self.keepalive_s)
        except OSError as e:  # the client is already gone: this connection only
            self._log.warning("client connection from %s dropped at accept: %s", conn.peer, e)
            if self._auth is not None:
                self._auth.admission.closed(conn)
            transport.abort()
            return
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        conn.open = True
        conn.addr = addr
        self._conns.add(conn)
        if self._auth is not None:
            if self._auth.ssl_context is not None:
                conn.tls_pending = True  # the login deadline bounds the handshake too
            else:
                self._admit(conn, None)

    # -- connection slots: protocol.admission decides, before TLS or any byte is read -----------------
    def _take_slot(self, conn: _Connection, addr: Any) -> bool:
        """Ask the admission gate for a slot; a refused connection is told why (on a plain port) and closed."""
        host = addr[0] if isinstance(addr, tuple) else str(addr)
        now = time.monotonic()
        d = self._auth.admission.admit(conn, host, now, len(self._conns))
        if not d.admitted:
            self._note_refusal(conn.peer, d.error.message)
            if self._auth.ssl_context is None:  # a TLS client could not read a plain answer
                conn.transport.write(encode([None, False, [d.error.code, d.error.message]]))
                conn.transport.close()
            else:
                conn.transport.abort()
            return False
        if d.evict is not None:  # its address holds many more waiting connections than this one's
            self._note_refusal(d.evict.peer, f"closed to make room: its address holds the most connections "
                                             f"waiting to log in, and {conn.peer} is waiting too")
            self._end_now(d.evict)
        if self._deadline_timer is None:
            self._deadline_timer = self._loop.call_later(max(0.0, d.deadline - now), self._login_deadlines)
        return True

    def _login_deadlines(self) -> None:
        """Close the connections not logged in by their deadline; wake again for the next one."""
        self._deadline_timer = None
        adm = self._auth.admission
        for conn in adm.due(time.monotonic()):
            if conn.gate is not None and conn.gate.authenticated:  # it logged in; the word is on its way
                adm.logged_in(conn)
                continue
            adm.timed_out(conn)
            self._note_refusal(conn.peer, f"{'not logged in' if conn.gate is not None else 'no TLS handshake'} "
                                          f"within {adm.policy.login_deadline_s:g} s")
            self._end_now(conn)
        nxt = adm.next_deadline()
        if nxt is not None and not self._closing:
            self._deadline_timer = self._loop.call_later(max(0.0, nxt - time.monotonic()), self._login_deadlines)

    def _note_refusal(self, peer: str, why: str) -> None:
        """Log a connection refused or closed before login: one line a second at most (a flood of
        connects must not become a flood of log lines), with the count since the last."""
        now = time.monotonic()
        last, since = self._unlogged
        if now - last < REFUSAL_LOG_EVERY_S:
            self._unlogged[1] = since + 1
            return
        self._unlogged[:] = [now, 0]
        more = f" ({since} more refused or closed before login since the last line)" if since else ""
        self._log.warning("client connection from %s refused: %s%s", peer, why, more)

    def _admit(self, conn: _Connection, cert_name: str | None) -> None:
        try:
            gate = conn.gate = self._auth.gate(conn.addr, cert_name)
        except Exception:  # noqa: BLE001 - fail closed: a connection without its gate is never served
            self._log.exception("client connection from %s closed: its authentication could not be set up", conn.peer)
            conn.ending = True
            conn.transport.abort()
            return
        conn.session.frames.max_frame_bytes = gate.max_frame_bytes  # small until authenticated
        if gate.authenticated:  # a certificate naming a user, or a server without users
            self._auth.admission.logged_in(conn)
        else:  # a hello authenticates in a worker thread: its slot is freed on the loop
            gate.on_authenticated = lambda: self._loop.call_soon_threadsafe(self._auth.admission.logged_in, conn)

    @staticmethod
    def _end_now(conn: _Connection) -> None:
        """Close ``conn`` without serving what it still asks: its waiting requests are dropped, what is
        written so far goes out."""
        conn.ending = True
        conn.session.drop_waiting()
        if conn.transport is not None:
            conn.transport.close()

    def _refuse(self, conn: _Connection, why: object) -> None:
        """A TLS client port refuses a connection before any request: logged, counted, closed."""
        if conn.lost or not conn.open:
            return
        self._auth._count_refused()
        self._log.warning("client connection from %s refused: TLS handshake failed: %s", conn.peer, why)
        self._end_now(conn)

    def _tls_received(self, conn: _Connection, data: bytes) -> bytes | None:
        """The TLS layer of a connection on a TLS port: the plain bytes received, or None (nothing yet,
        or refused)."""
        if conn.tls_pending:
            conn.tls_pending = False
            if data[:1] != TLS_HANDSHAKE_RECORD:  # a client speaking the plain protocol: told in that protocol
                conn.transport.write(encode([None, False, [AuthenticationRequired.code, PLAIN_REFUSED]]))
                self._refuse(conn, f"not TLS: {PLAIN_REFUSED}")
                return None
            conn.tls = MemoryTLS(self._auth.ssl_context)
        try:
            plain, out = conn.tls.receive(data)
        except ssl.SSLError as e:
            alert = conn.tls.pending()
            if alert:
                conn.transport.write(alert)
            self._refuse(conn, e)
            return None
        if out:
            conn.transport.write(out)
        if conn.tls.peer_closed:  # the client closed its side: answer in kind and end the connection
            conn.transport.write(conn.tls.close_notify())
            self._end_now(conn)
            return None
        if conn.gate is None and conn.tls.done:
            self._admit(conn, common_name(conn.tls.obj.getpeercert()))
        return plain or None

    def _lost(self, conn: _Connection, exc: Exception | None) -> None:
        conn.lost = True
        if self._auth is not None:
            self._auth.admission.closed(conn)
        if not conn.open:
            return
        conn.open = False
        self._conns.discard(conn)
        self._buffered -= conn.held
        conn.held = 0
        conn.session.drop_waiting()
        if exc is not None and not self._closing:
            self._log.warning("client connection from %s closed: %s", conn.peer, exc)

    def _hold(self, held: int, now: int) -> int:
        """Account for a connection holding ``now`` bytes instead of ``held``; refuse growth past the
        budget: 256 connections each filling a 64 MiB frame would otherwise take 16 GiB and the
        instance's owner with them (the kernel's OOM killer)."""
        if now > held and self._buffered + now - held > self.buffer_bytes:
            total = self._buffered
            raise RemoteProtocolError(
                f"the server holds {total / 2**20:.0f} MiB of client requests not yet received in full, "
                f"its limit is {self.buffer_bytes / 2**20:.0f} MiB; send smaller requests or retry later")
        self._buffered += now - held
        return now

    def _received(self, conn: _Connection, data: bytes) -> None:
        if not conn.open or conn.failed is not None or conn.ending:
            return
        if conn.tls is not None or conn.tls_pending:
            data = self._tls_received(conn, data)
            if data is None:
                return
        s = conn.session
        try:
            s.feed(data)
            conn.held = self._hold(conn.held, len(s.frames) + s.waiting_bytes)
            s.parse()
            conn.held = self._hold(conn.held, len(s.frames) + s.waiting_bytes)
        except RemoteProtocolError as e:
            # A frame that cannot be read leaves nothing to go on: what came before it is answered,
            # then the reason, then the connection closes.
            self._log.warning("client connection from %s closed: %s", conn.peer, e)
            conn.failed = [None, False, [e.code, e.message]]
        self._start(conn)

    def _start(self, conn: _Connection) -> None:
        """Start what the connection's order allows, then send what is answered."""
        s = conn.session
        if conn.gate is None and self._auth is not None:  # its gate could not be made (_admit): serve nothing
            return
        while (req := s.next_runnable(self._db is not None and self._db.role == "primary")) is not None:
            if conn.gate is not None:  # authentication and rights first
                if conn.gate.blocks(req.op):  # a hello verifies a password hash: in a worker
                    fut = self._loop.run_in_executor(self._workers, self._hello, conn.gate, req.op, req.args)
                    fut.add_done_callback(lambda f, req=req: self._ran(req, f))
                    continue
                try:
                    conn.gate.admit(req.op, req.args)
                except Exception as e:  # noqa: BLE001 - answered, as _call answers
                    s.answer(req, False, self._error(req.op, e))
                    continue
            if req.state is GATHERED:  # a primary's commit (elsewhere the engine's path runs it, in order)
                try:
                    ops = self._commit_ops(req.args)  # type: ignore[misc]
                except Exception as e:  # noqa: BLE001 - answered, as _call answers
                    s.answer(req, False, self._error(req.op, e))
                    continue
                if self._observer is not None:
                    req.t0 = time.perf_counter()
                conn.active_at = time.monotonic()
                self._gathering.add(req, ops)
                if not self._write_soon:
                    self._write_soon = True
                    self._loop.call_soon(self._write_batch)
            elif isinstance(req.op, str) and req.op in READ_OPS:  # an unhashable op: run_op's error
                s.answer(req, *self._call(req.op, req.args))
            else:
                fut = self._loop.run_in_executor(self._workers, self._call, req.op, req.args)
                fut.add_done_callback(lambda f, req=req: self._ran(req, f))
        if conn.open and (now := len(s.frames) + s.waiting_bytes) < conn.held:  # started: out of the budget
            conn.held = self._hold(conn.held, now)
        self._send(conn)

    def _ran(self, req: Request, fut: asyncio.Future) -> None:
        req.session.answer(req, *fut.result())
        self._after(req.session)

    def _hello(self, gate: Any, op: Any, args: dict) -> tuple[bool, Any]:
        """In a worker: a hello through the connection's gate (its answer, or the refusal)."""
        try:
            return True, gate.admit(op, args)
        except Exception as e:  # noqa: BLE001 - the refusal is the answer
            return False, self._error(op, e)

    def _call(self, op: Any, args: dict) -> tuple[bool, Any]:
        try:
            return True, self._run_op(op, args)
        except Exception as e:  # noqa: BLE001 - every failure is the request's answer
            return False, self._error(op, e)

    def _error(self, op: Any, e: Exception) -> list:
        if self._observer is not None:
            self._observer.error(getattr(e, "code", ServerError.code))
        if isinstance(e, MultisiteError):
            return [e.code, e.message]
        if isinstance(e, (KeyError, TypeError, ValueError)):  # a request missing or mistyping an argument
            return [ConfigError.code, f"malformed {op!r:.40} request: {type(e).__name__}: {e}"]
        # a bug met by this request: answer it and keep serving the connection
        self._log.error("client request %r failed", op, exc_info=e)
        return [ServerError.code, f"{op!r:.40} failed in the server: {type(e).__name__}: {e}"]

    # -- group commit ------------------------------------------------------------------------------
    def _write_batch(self) -> None:
        """Write every commit gathered in this pass of the loop as one batch (one journal write), and
        harden it here when nothing else waits for the loop (``_inline_ok``); each connection of the
        batch then starts its next requests and sends its replies once."""
        self._write_soon = False
        batch = self._gathering.take_batch()
        if not batch:
            return
        reqs = [r for r, _ in batch]
        sessions = {r.session for r in reqs}
        try:
            prep = self._db.prepare([ops for _, ops in batch])
            token = prep.write(flush_store=False)  # the store's periodic commit runs in the sync thread
        except Exception as e:  # noqa: BLE001 - nothing of the batch was committed (a full disk, a demotion)
            err = self._error("commit", e)
            for r in reqs:
                r.session.answer(r, False, err)
        else:
            self.batched += len(reqs)
            self.batches += 1
            inline = token is not None and self._inline_ok(len(reqs), sessions)
            g = self._gathering
            g.wrote(reqs, prep.results, token, publish=not inline, now=time.monotonic())
            if inline:  # fdatasync here, on the loop, and answer (as _synced, without a second pass)
                err = self._syncer.harden(token)
                if err is not None:
                    self._log.error("fdatasync of client commits failed (on the loop): %s", err)
                self.inline += 1
                self.groups += 1
                self._observe(g.synced(g.written_total, err, time.monotonic()), err)
            elif token is not None:
                self._syncer.kick()
        for session in sessions:
            self._start(session.owner)  # type: ignore[attr-defined]

    def _inline_ok(self, n: int, sessions: set) -> bool:
        """Whether this batch of ``n`` commits from ``sessions`` is hardened on the loop (see
        INLINE_SYNC_MAX_S and ACTIVE_WINDOW_S): recent fdatasyncs were short, no earlier group waits
        for one, no request but these is unanswered, and no other connection committed lately (its
        next commit would wait for this fdatasync instead of being written meanwhile)."""
        ewma = self._syncer.ewma_s
        if ewma is None or ewma > self.inline_sync_max_s or self._gathering.waiting_sync:
            return False
        since = time.monotonic() - self.active_window_s
        unanswered = 0
        for c in self._conns:
            s = c.session
            unanswered += s.in_flight
            if c.active_at > since and s not in sessions:
                return False
        return unanswered <= n

    def _synced(self, upto: int, err: BaseException | None) -> None:
        """The sync thread's fdatasync covering the first ``upto`` written commits returned (on the loop)."""
        if err is not None:
            self._log.error("fdatasync of client commits failed: %s", err)
        self.groups += 1
        answered = self._gathering.synced(upto, err, time.monotonic())
        self._answered(answered, err)

    def _answered(self, answered: list, err: BaseException | None) -> None:
        """Metrics for requests just answered, and their connections' next requests and replies."""
        self._observe(answered, err)
        for session in {r.session for r in answered}:
            self._after(session)

    def _observe(self, answered: list, err: BaseException | None) -> None:
        """With --metrics: each answered commit's time from gathered to answered, or its error."""
        if self._observer is None:
            return
        if err is None:
            now = time.perf_counter()
            for r in answered:
                self._observer.commit_done(now - r.t0)
        else:
            for _ in answered:
                self._observer.error(getattr(err, "code", ServerError.code))

    def _after(self, session: ClientSession) -> None:
        conn = session.owner  # type: ignore[attr-defined]
        self._start(conn)

    # -- sending and flow --------------------------------------------------------------------------
    def _send(self, conn: _Connection) -> None:
        replies = conn.session.replies()
        if conn.lost or conn.transport is None:
            return
        if conn.gate is not None:
            conn.session.frames.max_frame_bytes = conn.gate.max_frame_bytes
            if conn.gate.must_close and not conn.ending:  # a refused hello: answered, then closed
                conn.ending = True
                conn.session.drop_waiting()
        out = encode(replies[0]) if len(replies) == 1 else b"".join([encode(r) for r in replies])
        done = conn.session.in_flight == 0 and (conn.failed is not None or conn.ending or self._closing)
        if done and conn.failed is not None:
            out += encode(conn.failed)
        if out:
            conn.transport.write(conn.tls.send(out) if conn.tls is not None and conn.tls.done else out)
        if done:
            conn.transport.close()  # after what is buffered is sent
            return
        self._flow(conn)

    def _flow(self, conn: _Connection) -> None:
        """Read while the connection's pipeline and unsent replies stay within bounds."""
        if conn.lost or conn.transport is None:
            return
        want = (not self._closing and conn.failed is None and not conn.ending and not conn.write_paused
                and conn.session.wants_more)
        if want != conn.reading:
            conn.reading = want
            (conn.transport.resume_reading if want else conn.transport.pause_reading)()

    # -- stopping ----------------------------------------------------------------------------------
    async def _close(self, timeout_s: float) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        deadline = time.monotonic() + timeout_s  # one bound for all, not one per connection
        for conn in list(self._conns):
            conn.session.drop_waiting()  # read, not started: never done, the client sees the close
            self._flow(conn)
            self._send(conn)
        # Requests in flight finish and their replies reach the client (a commit made durable is
        # acknowledged); a client that reads no replies is cut at the deadline.
        while self._conns and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.abort()
        while self._gathering.waiting_sync and time.monotonic() < deadline + 1.0:
            await asyncio.sleep(0.01)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, end every connection, and wait for the transactions in flight."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(timeout_s), self._loop).result(timeout_s + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            self._workers.shutdown(wait=False, cancel_futures=True)
            self._syncer.stop()


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
