"""Receiver Server: accepts a Source Server's connection and fills the receive pool.

Theory of operation (GT.M seed 001, "Receiver Server"):

- One source at a time. On connect both sides exchange Hello. The receiver refuses (an Error to the
  source, an error line in its own log) a source from another LMS group, one with its own name, or
  one whose history shows this instance is ahead of it (roll back first).
- The restart point is where the Update Process stands: the receive pool is emptied and the
  Update Process's in-flight batch finishes before this instance's seqno goes into its Hello.
- Received batches (checked whole by the protocol) go into the receive pool; above
  ``receive_pool_high_bytes`` the receiver sends XOFF, and XON once the Update Process has drained
  the pool below ``receive_pool_low_bytes``.
- Once a read's batches are in the pool, the receiver applies them itself, on its loop, when the
  Update Process is idle and applies are short (``session.InlineApply``; a streamed read holds a few
  transactions), and wakes the Update Process's thread otherwise (catch-up, a slow disk): the same
  apply either way, one journal write and fdatasync before the confirmation.
- Every heartbeat is answered with the last seqno applied and hardened (``_applied_seqno``).
- With an in-filter (``--filter``) each checked batch goes through the filter before it goes into
  the receive pool, and the Update Process journals the filtered transactions. A filter failure
  (``FilterError``) puts nothing of the batch in the pool: the source gets an ``Error FILTER`` naming
  the seqno and the connection ends; the next connection starts a new filter process at the
  restart point.

The decisions (accept, refuse, roll back, continue an SI stream, the Start check, the history to
adopt, XOFF and XON) are ``replication.session``'s, sans-IO and unit-tested; this module does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass

from ...errors import ConnectionLost, FilterError, MultisiteError, ProtocolError
from ...protocol.connection import NEED_DATA, Connection, Role, State
from ...protocol.messages import (Error, Heartbeat, HeartbeatAck, Hello, RefusalCode, Start, TxnBatch, Xoff, Xon,
                                  error_for)
from ..filters import FilterSpec
from .pools import ReceivePool
from ..session import (Accept, ConfirmPacer, ContinueStream, FlowControl, Position, ReceiverHandshake, RollBack,
                       adopted_history, busy, idle_for)
from .receiver_io import Doorbell, PausedAtConnect
from .update import UpdateProcess
from .filter_process import Filter
from .source import read_event
from ...net.tls import TLSConfig


# The stream buffer holds up to twice this before the transport stops reading, and the receive loop
# takes up to RECEIVE_CHUNK_BYTES of it at a time into the protocol: large reads, few wakeups (a
# catch-up's batches are up to max_batch_bytes, 1 MiB, each).
READER_LIMIT_BYTES = 1024 * 1024
RECEIVE_CHUNK_BYTES = 1024 * 1024
CONFIRM_COALESCE_S = 0.002  # applies closer than this to the last confirmation: one answer for all, this after it


@dataclass
class ReceiverConfig:
    host: str
    port: int
    tls: TLSConfig | None = None
    autorollback: bool = False
    noresync: bool = False
    receive_pool_high_bytes: int = 64 * 1024 * 1024
    receive_pool_low_bytes: int = 16 * 1024 * 1024
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0  # no byte from the source for this long: drop it
    progress_interval_s: float = 0.5  # unsolicited answers while bytes arrive (slow links)
    stats_interval_s: float = 5.0
    filter: FilterSpec | None = None  # the in-filter

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("tls", "filter")}
        d["tls"] = self.tls.to_dict() if self.tls else None
        d["filter"] = self.filter.to_dict() if self.filter else None
        return d


class ReceiverServer:
    def __init__(self, server, cfg: ReceiverConfig, log: logging.Logger, update: UpdateProcess,
                 pool: ReceivePool):
        self.server, self.cfg, self.log = server, cfg, log
        self.db = server.db
        self.update = update
        self.pool = pool
        self.state = "listening"
        self.peer: str | None = None
        self.port = cfg.port
        self._srv: asyncio.AbstractServer | None = None
        self._tls_ctx: ssl.SSLContext | None = None
        self._active: asyncio.Task | None = None  # the task serving the current source
        self._active_peer: str | None = None
        self._flow = FlowControl(cfg.receive_pool_low_bytes)
        self._conn: Connection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.received_records = 0
        self.connections = 0
        self.refusals = 0
        self.xoffs = 0
        self.last_error: str | None = None
        self.started_at = time.time()
        self.start_seqno = self.db.seqno
        self._stats_task: asyncio.Task | None = None
        self._restart = asyncio.Event()
        self._reading: asyncio.StreamReader | None = None  # the streaming session's, while it reads
        self._read_since: float | None = None  # when the session's pending read began (None: not reading)
        self._confirms = ConfirmPacer(CONFIRM_COALESCE_S)
        self._restart_why = ""
        self.filter: Filter | None = None
        if cfg.filter is not None:
            self.filter = Filter(cfg.filter, "in-filter", log, server.root / "log" / "filter-receiver.log")

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = self._tls_ctx = self.cfg.tls.server_context() if self.cfg.tls else None
        # TLS starts inside _handle, not in start_server: there a failed handshake would only reach
        # asyncio's debug log, and a peer without a valid certificate must be refused *and logged*.
        self._srv = await self._loop.create_server(
            lambda: PausedAtConnect(asyncio.StreamReader(limit=READER_LIMIT_BYTES), self._handle),
            self.cfg.host, self.cfg.port)
        self.port = self._srv.sockets[0].getsockname()[1]
        # The Update Process applied a batch (confirm it; maybe below low-water after an XOFF: XON) or,
        # with an XOFF out, took from the pool: one coalescing doorbell, so a busy stream costs the loop
        # one wakeup per wake, and a take without an XOFF out none (a pipe write each before). A take
        # that races the XOFF is covered by the apply that follows it.
        bell = Doorbell(self._loop, self._after_update)
        self.pool.on_drained = lambda: self._flow.xoff_sent and bell.ring()
        self.update.on_gap = lambda: self._loop.call_soon_threadsafe(self._request_restart,
                                                                     "the update process found a gap")
        self.update.on_applied = bell.ring
        self._stats_task = self._loop.create_task(self._stats_loop())
        self.log.info("receiver server listening on %s:%d%s%s", self.cfg.host, self.port, " (TLS)" if ctx else "",
                      f", in-filter {self.cfg.filter.text}" if self.cfg.filter else "")

    async def stop(self) -> None:
        if self._srv:
            self._srv.close()
            if self._writer:
                self._writer.transport.abort()
            await self._srv.wait_closed()
        if self._stats_task:
            self._stats_task.cancel()
        if self.filter is not None:
            self.filter.kill()
        self.state = "stopped"
        self.log.info("receiver server stopped at seqno %d", self.db.seqno)

    # -- one connection --------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One source's connection, from TLS and its Hello to its end: the session runs only when this
        source may have the receiver (one at a time), and however it ends is logged, kept in
        ``last_error`` and leaves the receiver listening for the next one."""
        addr = writer.get_extra_info("peername")
        conn = Connection(Role.RECEIVER)
        if self._tls_ctx is None:
            writer.transport.resume_reading()
        elif not await self._start_tls(writer, addr):
            return
        peer = await self._read_hello(conn, reader, writer, addr)
        if peer is None or not await self._take_over(conn, writer, peer, addr):
            return
        self._active, self._active_peer = asyncio.current_task(), peer.name
        self.connections += 1
        try:
            await self._serve(conn, reader, writer, peer)
        except (ConnectionLost, OSError, asyncio.IncompleteReadError, ssl.SSLError) as e:
            self.log.warning("connection from %s ended: %s", peer.name, e)
            self.last_error = str(e)
        except ProtocolError as e:
            self.log.error("protocol error from %s: %s; closing the connection", peer.name, e)
            self.last_error = str(e)
            try:
                writer.write(Connection(Role.RECEIVER).send(error_for(e)))
            except MultisiteError:
                pass
        except asyncio.TimeoutError:
            self.log.warning("connection from %s timed out during the handshake", peer.name)
        except MultisiteError as e:
            self.log.error("%s", e)
            self.last_error = str(e)
        finally:
            if self._active is asyncio.current_task():
                self._active = None
                self._conn = self._writer = None
                self.state = "listening"
            await self._close(writer)

    async def _read_hello(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          addr) -> Hello | None:
        """The source's Hello, within ``handshake_timeout_s``; None, the connection logged and closed,
        if anything else came (a peer of another protocol version is told why before the close)."""
        try:
            peer = await asyncio.wait_for(read_event(conn, reader), self.cfg.handshake_timeout_s)
            if not isinstance(peer, Hello):
                raise ProtocolError(f"expected Hello, got {type(peer).__name__}")
            return peer
        except (ConnectionLost, OSError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.TimeoutError,
                MultisiteError) as e:
            self.log.warning("connection from %s failed before its Hello: %s", addr, e or type(e).__name__)
            if isinstance(e, ProtocolError):  # e.g. another protocol version: say so before closing
                try:
                    writer.write(Connection(Role.RECEIVER).send(error_for(e)))
                except (MultisiteError, OSError):
                    pass
            await self._close(writer)
            return None

    async def _take_over(self, conn: Connection, writer: asyncio.StreamWriter, peer: Hello, addr) -> bool:
        """Whether ``peer`` may have the receiver now. The source being served, connecting again, had
        its old connection cut without our seeing it: that one is dropped. Any other source while one
        is served is refused as busy (told, logged, closed): one source at a time."""
        old = self._active
        if old is not None and not old.done() and peer.name == self._active_peer:
            # The same source again: the old connection is dead on its side (a cut we never saw).
            self.log.warning("%s connected again: dropping its previous connection", peer.name)
            if self._writer is not None:
                self._writer.transport.abort()
            try:
                await asyncio.wait_for(asyncio.shield(old), 5.0)
            except (asyncio.TimeoutError, Exception):
                pass
        if self._active is not None and not self._active.done():
            self.log.warning("refusing source %s from %s: already receiving from %s", peer.name, addr,
                             self._active_peer)
            refusal = busy(self._active_peer)
            writer.write(conn.send(Error(refusal.code, refusal.message, refusal.common_seqno)))
            await self._close(writer)
            return False
        return True

    async def _start_tls(self, writer: asyncio.StreamWriter, addr) -> bool:
        try:
            await asyncio.wait_for(writer.start_tls(self._tls_ctx), self.cfg.handshake_timeout_s)
            return True
        except (ssl.SSLError, OSError, asyncio.TimeoutError) as e:
            why = f"TLS handshake failed: {str(e) or type(e).__name__}"
            self.refusals += 1
            self.last_error = why
            self.log.error("refusing a connection from %s: %s (a source needs a certificate signed by the CA in "
                           "%s)", addr, why, self.cfg.tls.ca if self.cfg.tls else "-")
            writer.transport.abort()
            return False

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        try:
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, asyncio.TimeoutError, ssl.SSLError):
            writer.transport.abort()

    async def _handshake(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: Hello) -> tuple[int | None, Start] | None:
        """Answer the source's Hello and take its Start, doing what the ``ReceiverHandshake`` decides:
        (the SI stream the source feeds, None in BC; the Start) once streaming may begin, None after a
        refusal either way."""
        loop = asyncio.get_running_loop()
        self.state = "handshake"
        # The restart point: empty the pool, let the Update Process finish its batch. A restart asked
        # for from here on (a rollback during the handshake) ends this session as soon as it receives.
        self._restart.clear()
        self.pool.clear(self.db.seqno)
        await loop.run_in_executor(None, self.pool.quiesce)
        hs = ReceiverHandshake(peer, supplementary=self.db.info.supplementary, autorollback=self.cfg.autorollback,
                               noresync=self.cfg.noresync)
        answer = hs.answer(self._here())
        if isinstance(answer, ContinueStream):
            self.log.warning("%s; --noresync: keeping this instance's transactions and continuing the SI "
                             "stream from %s's seqno %d", answer.why, peer.name, answer.seqno)
            await loop.run_in_executor(None, self.db.set_stream_seqno, answer.stream, answer.seqno)
            answer = hs.answer(self._here())
        elif isinstance(answer, RollBack):
            self.log.warning("%s; --autorollback: rolling back", answer.why)
            rep = await loop.run_in_executor(None, self.server.rollback_to_common, answer.common_seqno, answer.stream,
                                             f"autorollback for {peer.name}")
            self.log.warning("%s", rep.summary())
            self.server.kick_sources()
            answer = hs.answer(self._here())
        if not isinstance(answer, Accept):
            refusal = answer
            self.refusals += 1
            self.last_error = f"{refusal.code}: {refusal.message}"
            self.log.error("refusing source %s: %s: %s", peer.name, refusal.code, refusal.message)
            writer.write(conn.send(Error(refusal.code, refusal.message, refusal.common_seqno)))
            return None
        me = answer.hello
        # The stream's seqnos from here on are the source's: for a supplementary instance they are its
        # SI stream's, not its own (which count its own transactions too).
        self.pool.clear(me.seqno)
        writer.write(conn.send(me))
        await writer.drain()
        start = await asyncio.wait_for(read_event(conn, reader), self.cfg.handshake_timeout_s)
        if isinstance(start, Error):
            self.refusals += 1
            self.last_error = f"{start.code}: {start.message}"
            self.log.error("source %s refused: %s: %s", peer.name, start.code, start.message)
            return None
        assert isinstance(start, Start)
        hs.check_start(start)
        if await loop.run_in_executor(None, self._adopt_history, peer, start, hs.stream):
            # What this instance tells its own secondaries in their Start changed (a supplementary
            # standby learns its SI stream's history only there): make them renegotiate.
            self.server.kick_sources()
        return hs.stream, start

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: Hello) -> None:
        """Handshake with the source, then stream: its batches into the receive pool (through the
        in-filter if any, XOFF past the high-water mark), its heartbeats answered, until it ends."""
        agreed = await self._handshake(conn, reader, writer, peer)
        if agreed is None:
            return
        progress = self._begin_streaming(conn, reader, writer, peer, *agreed)
        held = False  # batches put in the pool since the last hand-over (_hand_over)
        try:
            while True:
                # Every event already in the protocol's buffer first: one large read holds many batches.
                ev = conn.next_event()
                if held and not isinstance(ev, TxnBatch):
                    held = False
                    self._hand_over()
                if ev is NEED_DATA:
                    if self._restart.is_set():
                        raise ConnectionLost(f"{self._restart_why}; restarting the connection")
                    # No timer per read: the progress task ends a read idle for idle_timeout_s.
                    self._read_since = time.monotonic()
                    data = await reader.read(RECEIVE_CHUNK_BYTES)
                    self._read_since = None
                    conn.receive_data(data)
                    continue
                if ev is State.CLOSED:
                    raise ConnectionLost("peer closed the connection")
                if self._restart.is_set():
                    raise ConnectionLost(f"{self._restart_why}; restarting the connection")
                if isinstance(ev, TxnBatch):  # checked whole by the connection: kept as it came
                    run = ev.run()
                    if self.filter is not None:
                        if held:  # what came before goes on while the filter runs
                            held = False
                            self._hand_over()
                        run = await self._filtered(run, conn, writer, peer.name)
                        if run is None:
                            return
                    self.received_records += len(run)
                    held = True
                    # Past what the loop would apply (a catch-up's read), the thread starts on it now.
                    if self._flow.xoff(self.pool.put(run, wake=len(self.pool) >= self.update.place.max_frames)):
                        held = False
                        await self._xoff(conn, writer)
                elif isinstance(ev, Heartbeat):
                    writer.write(conn.send(HeartbeatAck(ev.seq, ev.sent_at, self._applied_seqno(),
                                                           self.pool.received_seqno)))
                    await writer.drain()
                elif isinstance(ev, Error):
                    self.log.error("source %s reported %s: %s", peer.name, ev.code, ev.message)
                    return
        finally:
            self._reading = self._read_since = None
            self.pool.wake()  # whatever this session put in the pool: the Update Process applies it
            progress.cancel()
            if self.filter is not None:  # the next connection restarts the stream: a new filter process
                self.filter.kill()

    async def _xoff(self, conn: Connection, writer: asyncio.StreamWriter) -> None:
        """The receive pool is past its high-water mark: the Update Process's thread takes what is in
        it, and the source is told to pause (XOFF) until the pool drains below its low-water mark."""
        self.pool.wake()
        self.xoffs += 1
        self.log.info("receive pool at %d bytes (high-water %d): XOFF", self.pool.bytes,
                      self.cfg.receive_pool_high_bytes)
        writer.write(conn.send(Xoff(self.pool.received_seqno)))
        await writer.drain()

    def _begin_streaming(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: Hello, stream: int | None, start: Start) -> asyncio.Task:
        """Once the handshake agreed: this connection is the one the Update Process's confirmations and
        XON go to, and its progress task runs (returned, for the session to cancel at its end)."""
        self.update.si_stream = stream
        self.peer = peer.name
        self._conn, self._writer = conn, writer
        self._flow.reset()
        self.state = "receiving"
        self.last_error = None
        self.log.info("receiving from %s at seqno %d (common point %d)%s", peer.name, start.from_seqno,
                      start.common_seqno, "" if stream is None else f" on SI stream {stream} (group {peer.group})")
        progress = asyncio.get_running_loop().create_task(self._progress_loop(conn, writer, peer.name))
        # A restart asked for, or the progress task failing, ends the read in progress (the stream's
        # exception): one read awaited in this task at a time, no task and no wait on three futures
        # per read (the receive path's cost at a few transactions per batch).
        progress.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                                   or reader.set_exception(t.exception()))
        self._reading = reader
        return progress

    async def _filtered(self, run, conn: Connection, writer: asyncio.StreamWriter, peer: str):
        """``run`` through the in-filter; None (the source told, nothing of the batch kept) if it failed."""
        fut = asyncio.get_running_loop().run_in_executor(None, self.filter.apply, run)
        try:
            # Nothing reads the source's heartbeats meanwhile: say the link is alive, or a batch that
            # takes the filter longer than the source's heartbeat timeout (each answer in time) makes
            # the source give the link up, reconnect and send the batch again. A hung filter is the
            # filter's timeout's to catch.
            while not (await asyncio.wait({fut}, timeout=self.cfg.progress_interval_s))[0]:
                writer.write(conn.send(HeartbeatAck(0, 0.0, self._applied_seqno(), self.pool.received_seqno)))
                await writer.drain()
            return fut.result()
        except FilterError as e:
            why = f"{e.message}; nothing of batch {run.first_seqno}..{run.last_seqno} went into the receive pool"
            self.last_error = f"{e.code}: {why}"
            self.log.error("%s; ending the connection from %s", self.last_error, peer)
            writer.write(conn.send(Error(RefusalCode.FILTER, f"{self.db.name}: {why}")))
            await writer.drain()
            return None

    async def _progress_loop(self, conn: Connection, writer: asyncio.StreamWriter, peer: str) -> None:
        """Tell the source, on the uncongested way back, that its bytes are arriving: on a link slower
        than a batch per heartbeat timeout, heartbeat answers queue behind the batch being sent and
        would arrive too late. An unsolicited answer (``seq`` 0) goes out while bytes arrive fast
        enough to finish the frame being received within ``idle_timeout_s``. Not otherwise: on a
        stalled link, or when dropped bytes left a frame that only the source's heartbeats trickle
        into, the source must time out and reconnect. Nothing at all from the source for
        ``idle_timeout_s`` while the session waits for them ends it (this task's ConnectionLost reaches
        the session's read); checked here every ``progress_interval_s``, not with a timer per read."""
        last, last_t = conn.bytes_in, time.monotonic()
        last_byte_at = last_t
        idle_s = self.cfg.idle_timeout_s
        while True:
            await asyncio.sleep(min(self.cfg.progress_interval_s, idle_s))
            now, got = time.monotonic(), conn.bytes_in - last
            if got:
                last_byte_at = now
            elif self._read_since is not None and idle_for(now, max(last_byte_at, self._read_since), idle_s):
                raise ConnectionLost(f"nothing from {peer} for {idle_s:.0f} s (idle_timeout_s): the source or "
                                     f"the network is gone")
            pend = conn.pending()
            if got and (pend is None or (pend[0] - pend[1]) / (got / (now - last_t)) <= self.cfg.idle_timeout_s):
                writer.write(conn.send(HeartbeatAck(0, 0.0, self._applied_seqno(), self.pool.received_seqno)))
                await writer.drain()
            last, last_t = conn.bytes_in, now

    def _applied_seqno(self) -> int:
        """What this instance has applied, in the source's seqnos (what the source confirms and keeps
        its journal for), as far as its journal hardened it (written, with durability none): a
        supplementary instance's SI stream seqno as of its hardened position, else its own hardened
        seqno. An apply (the Update Process's thread or this loop's ``apply_here``) moves both before
        its journal write and fdatasync, and an answer may be sent meanwhile or after that fdatasync
        failed: confirming them would count, for --min-confirm, transactions a crash here loses."""
        if self.update.si_stream is not None:
            return self.db.hardened_stream_seqno(self.update.si_stream)
        return self.db.hardened_seqno

    def _here(self) -> Position:
        """Where this instance stands now, for the handshake's decisions."""
        return Position(self.db.info, self.db.seqno, self.db.stream_seqnos())

    def _adopt_history(self, peer: Hello, start: Start, stream: int | None) -> bool:
        """Record the source's history as this instance's own (SI: as ``stream``'s). True if anything
        changed."""
        adoption = adopted_history(self.db.info, peer, start, stream, self.db.stream_seqnos())
        if adoption is None:
            return False
        self.db.update_info(adoption.apply)
        new = adoption.history
        self.log.info("%s now follows %s (%d record(s), root primary %s)",
                      "history" if stream is None else f"SI stream {stream}'s history",
                      peer.name, len(new), new[-1].root_primary if new else "-")
        return True

    def restart_stream(self) -> None:
        """End the current connection (after a rollback); the source reconnects and renegotiates."""
        self._request_restart("this instance was rolled back")

    def _request_restart(self, why: str) -> None:
        self._restart_why = why
        self._restart.set()
        if self._reading is not None:  # wake the session's read: it ends the connection
            self._reading.set_exception(ConnectionLost(f"{why}; restarting the connection"))

    def _hand_over(self) -> None:
        """After the batches of one read went into the pool (the Update Process not woken for them):
        applied here, on the loop, when ``InlineApply`` allows it (the Update Process idle, recent
        applies short, a streamed read's few transactions), and confirmed at once; else the Update
        Process's thread is woken for them. Either way one journal write and one fdatasync for all
        the read brought; applied on the loop, no thread wake-up to the Update Process and back."""
        applied = self.update.apply_here()
        if applied is None:
            self.pool.wake()
        elif applied:
            self._after_update()

    def _after_update(self) -> None:
        self._maybe_xon()
        self._confirm_applied()

    def _confirm_applied(self) -> None:
        """After the Update Process applied a batch: confirm it to the source at once (an unsolicited
        answer, ``seq`` 0), so that its backlog, lag and slot are true now and not at the next
        heartbeat. Answers of a busy stream are gathered into one every CONFIRM_COALESCE_S
        (``ConfirmPacer``)."""
        if self._conn is None or self._writer is None:
            return
        delay = self._confirms.due(time.monotonic())
        if delay is None:
            return
        if delay:
            self._loop.call_later(delay, self._send_confirm)
        else:
            self._send_confirm()

    def _send_confirm(self) -> None:
        self._confirms.sent(time.monotonic())
        if self._conn is None or self._writer is None:
            return
        try:
            self._writer.write(self._conn.send(HeartbeatAck(0, 0.0, self._applied_seqno(), self.pool.received_seqno)))
        except MultisiteError:
            pass

    def _maybe_xon(self) -> None:
        if self._flow.xon(self.pool.bytes, connected=self._conn is not None and self._writer is not None):
            self.log.info("receive pool drained to %d bytes (low-water %d): XON", self.pool.bytes,
                          self.cfg.receive_pool_low_bytes)
            try:
                self._writer.write(self._conn.send(Xon(self.pool.received_seqno + 1)))
            except MultisiteError:
                pass

    # -- statistics ------------------------------------------------------------------------------
    def status(self) -> dict:
        return {"state": self.state, "listen": f"{self.cfg.host}:{self.port}", "source": self.peer,
                "seqno": self.db.seqno, "received_seqno": self.pool.received_seqno,
                "backlog": len(self.pool), "receive_pool_bytes": self.pool.bytes,
                "received_records": self.received_records, "connections": self.connections,
                "refusals": self.refusals, "xoffs": self.xoffs, "xoff": self._flow.xoff_sent,
                "start_seqno": self.start_seqno, "last_error": self.last_error, "tls": bool(self.cfg.tls),
                "filter": self.cfg.filter.text if self.cfg.filter else None,
                **(self.filter.status() if self.filter else {}), "update_process": self.update.status()}

    async def _stats_loop(self) -> None:
        last_t, last_n = time.monotonic(), self.received_records
        while True:
            await asyncio.sleep(self.cfg.stats_interval_s)
            now = time.monotonic()
            n = self.received_records - last_n
            self.log.info("stats: %s from %s, received %d records in %.1f s (%.0f/s), received seqno %d, "
                          "applied seqno %d (started at %d), backlog %d, pool %d bytes", self.state, self.peer, n,
                          now - last_t, n / (now - last_t), self.pool.received_seqno, self.db.seqno,
                          self.start_seqno, len(self.pool), self.pool.bytes)
            if not self.update.running:
                self.log.error("the update process is not running; received records wait in the receive pool "
                               "(start it with `multisite update start`)")
            last_t, last_n = now, self.received_records
