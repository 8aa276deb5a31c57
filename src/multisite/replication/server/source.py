"""Source Server: streams this instance's transactions to one secondary's Receiver Server.

Theory of operation (GT.M seed 001, "Source Server"):

- *Active*: connect (retrying with backoff until it succeeds), exchange Hello (history records),
  agree the restart point (the receiver's seqno + 1, once history shows the receiver is not ahead),
  then send transactions in seqno order. *Passive*: hold no connection until activated.
  *Deactivate*: close the connection and sleep.
- Records come from the journal pool; when the secondary needs records the pool no longer holds,
  they are read from the journal files (through the segment back pointers) until the stream is
  back inside the pool. In steady state nothing is read from disk.
- A heartbeat goes out every ``heartbeat_interval_s``; no answer within ``heartbeat_timeout_s``
  means the connection is lost: close it and reconnect. XOFF pauses sending until XON.
- Every ``stats_interval_s`` the server logs backlog, records sent since the last log, rate, and
  the start and current seqno; the last sent/confirmed seqnos go to the instance file's slot.
- With an out-filter (``--filter``) each batch goes through the filter before it is sent: what the
  secondary receives are the filtered transactions under the same seqnos. A filter failure
  (``FilterError``: a crash, a hang, an answer out of step) sends nothing of that batch and stops
  this server in state ``error``: reconnecting would feed the same transaction to the same broken
  filter again. Fix the filter, then ``source stop`` and ``source start``.

The reconnect pause and the heartbeat timeout are ``replication.session``'s decisions (sans-IO, given
the time by this module, and unit-tested with a fake clock); this module does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ...errors import ConnectionLost, FilterError, JournalGap, MultisiteError, RemoteProtocolError
from ...journal.reader import iter_runs
from ...journal.records import FRAME_HEADER_SIZE, FrameRun, decode_payload
from ...protocol.connection import NEED_DATA, Connection, Role, State
from ...protocol.messages import Error, Heartbeat, HeartbeatAck, Hello, RefusalCode, Start, TxnBatch, Xoff, Xon
from ..filters import FilterSpec
from ..history import check_peer, check_secondary_name, common_point, hello_for, stream_entries
from ..session import HeartbeatWatch, SessionEnd, SourceBackoff, StreamCheck
from .filter_process import Filter
from ...net.tls import TLSConfig

READ_CHUNK_BYTES = 256 * 1024
STOP_WAIT_EXTRA_S = 1.0  # stop() waits for the cancelled session this long past its graceful close


@dataclass
class SourceConfig:
    secondary: str
    host: str
    port: int
    passive: bool = False
    compress_level: int = 0
    tls: TLSConfig | None = None
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    max_batch_bytes: int = 1024 * 1024
    connect_backoff_max_s: float = 2.0
    stats_interval_s: float = 5.0
    slot_save_interval_s: float = 1.0
    filter: FilterSpec | None = None  # the out-filter
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("tls", "extra", "filter")}
        d["tls"] = self.tls.to_dict() if self.tls else None
        d["filter"] = self.filter.to_dict() if self.filter else None
        return d


async def run_together(*coros) -> None:
    """Run coroutines until the first one fails; cancel the rest and raise that first error. A caller
    cancelled meanwhile gets CancelledError, even when a coroutine fails at the same moment: with a
    TaskGroup (Python 3.11) the child's error won and the cancellation was lost (``source stop``
    then waited for a session loop that went on reconnecting)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks)
    failed = [t.exception() for t in sorted(tasks, key=lambda t: t not in done)
              if not t.cancelled() and t.exception() is not None]  # each retrieved: no warning at exit
    if failed:
        raise failed[0]


class _Refused(Exception):
    """The peer refused the connection (an Error message); reconnect after a pause."""


async def read_event(conn: Connection, reader: asyncio.StreamReader):
    """Next protocol event from a stream (raises ConnectionLost at end of stream)."""
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            conn.receive_data(await reader.read(READ_CHUNK_BYTES))
            continue
        if ev is State.CLOSED:
            raise ConnectionLost("peer closed the connection")
        return ev


async def _read_until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(READ_CHUNK_BYTES):
        pass


class SourceServer:
    def __init__(self, server, cfg: SourceConfig, log: logging.Logger):
        self.server, self.cfg, self.log = server, cfg, log
        # the instance server's --min-confirm count: told each time this secondary confirms more
        self._on_confirmed = getattr(server, "source_confirmed", None)
        self.db = server.db
        self.pool = server.pool
        self.state = "passive" if cfg.passive else "starting"
        self.active = not cfg.passive
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._xon = asyncio.Event()
        self._xon.set()
        self._next = 0
        self.last_sent = 0
        self.last_confirmed = 0
        self.peer_received = 0
        self.sent_records = 0
        self.sent_batches = 0
        self.bytes_sent = 0  # replication messages written to secondaries, every session (bytes on the wire)
        self.compression = "none"  # this session's: none, per batch (an older receiver), or streamed
        self.reading_from = "pool"
        self.file_reads = 0
        self.connects = 0
        self.xoff_s, self.xoff_since = 0.0, None
        self.last_error: str | None = None
        self.started_at = time.time()
        self.start_seqno = self.db.seqno
        self._fiter = None
        self._fnext = -1
        self._heartbeats = HeartbeatWatch(cfg.heartbeat_timeout_s, 0.0)
        self._stream_check = StreamCheck()
        self._lag_s = 0.0
        self._rtt_s = 0.0
        self._kicked = False
        self._stopping = False
        self._backoff = SourceBackoff(cfg.connect_backoff_max_s)
        self._misaddressed = False  # the last receiver reached is another instance (WRONG_NAME)
        self.filter: Filter | None = None
        if cfg.filter is not None:
            self.filter = Filter(cfg.filter, f"out-filter for {cfg.secondary}", log,
                                 server.root / "log" / f"filter-source-{cfg.secondary}.log")
        slot = self.db.info.slots.get(cfg.secondary)
        if slot is not None:
            self.last_sent, self.last_confirmed = slot.last_sent, slot.last_confirmed

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"source-{self.cfg.secondary}")
        self.log.info("source server for %s started (%s), connect to %s:%d%s%s%s", self.cfg.secondary,
                      "passive" if self.cfg.passive else "active", self.cfg.host, self.cfg.port,
                      f", zstd level {self.cfg.compress_level}" if self.cfg.compress_level else "",
                      ", TLS" if self.cfg.tls else "",
                      f", out-filter {self.cfg.filter.text}" if self.cfg.filter else "")

    def activate(self, host: str | None = None, port: int | None = None) -> None:
        if host:
            self.cfg.host, self.cfg.port = host, port or self.cfg.port
        self.active = True
        self._wake.set()
        self.log.info("activated: connecting to %s:%d", self.cfg.host, self.cfg.port)

    def kick(self) -> None:
        """End the current session (after a rollback): reconnect and agree a new restart point."""
        self._kicked = True
        self._wake.set()

    def deactivate(self) -> None:
        self.active = False
        self._wake.set()
        self.log.info("deactivated: closing the connection and going passive")

    async def wait_passive(self, timeout_s: float = 5.0) -> None:
        """Wait (up to ``timeout_s``) until a deactivate has closed the session."""
        deadline = time.monotonic() + timeout_s
        while self.state not in ("passive", "stopped", "error") and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is pending (up to ``timeout_s``), then close and exit."""
        deadline = time.monotonic() + timeout_s
        while (self.state == "streaming" and self.last_sent < self.db.seqno and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        self._stopping = True
        if self._task:
            self._task.cancel()
            # bounded: a session stuck in a close that never completes (a peer that stopped reading)
            # must not hold the stop, or the control call that asked for it, for ever
            wait_s = self.cfg.heartbeat_timeout_s + STOP_WAIT_EXTRA_S  # the graceful close is bounded by the first
            done, _ = await asyncio.wait({self._task}, timeout=wait_s)
            if not done:
                self.log.warning("source server for %s: its session did not end within %g s of the stop; "
                                 "left to end on its own", self.cfg.secondary, wait_s)
            elif not self._task.cancelled():
                self._task.exception()  # retrieved: an error after the cancel needs nothing more
        self.state = "stopped"
        if self.filter is not None:
            self.filter.kill()
        self._save_slot()
        self.log.info("source server for %s stopped at last sent seqno %d", self.cfg.secondary, self.last_sent)

    # -- main loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        self._backoff = backoff = SourceBackoff(self.cfg.connect_backoff_max_s)
        stats = asyncio.get_running_loop().create_task(self._stats_loop())
        try:
            while True:
                if not self.active:
                    self.state = "passive"
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self.state = "connecting"
                backoff.connecting()
                try:
                    await self._connect_and_stream()
                    end = SessionEnd.CLEAN
                except asyncio.CancelledError:
                    raise
                except _Refused as e:
                    self.last_error = str(e)
                    end = SessionEnd.REFUSED
                except (OSError, ConnectionLost, MultisiteError, asyncio.IncompleteReadError) as e:
                    if isinstance(e, (JournalGap, FilterError)):
                        self.last_error = str(e)
                        self.state = "error"
                        self.log.error("%s; this source server cannot continue%s", e,
                                       ": fix the filter, then `multisite source stop` and `source start`"
                                       if isinstance(e, FilterError) else "")
                        self._save_slot()
                        return
                    what = str(e)
                    if isinstance(e, ConnectionRefusedError):
                        what = (f"connection refused by {self.cfg.host}:{self.cfg.port} (is {self.cfg.secondary}'s "
                                f"receiver server running?)")
                    if self.state != "connecting" or self.connects == 0 or self.last_error != what:
                        self.log.warning("connection to %s lost: %s; reconnecting", self.cfg.secondary, what)
                    self.last_error = what
                    end = SessionEnd.LOST
                except Exception as e:  # a bug here must not end replication to this secondary for good
                    self.log.exception("unexpected error in the session with %s; reconnecting", self.cfg.secondary)
                    self.last_error = f"internal error: {e!r}"
                    end = SessionEnd.FAILED
                backoff.ended(end, time.monotonic())
                self._save_slot()
                if self._stopping:  # a stop whose cancellation something swallowed: it still stops
                    return
                if self.active:
                    self.state = "connecting"
                    try:
                        await asyncio.wait_for(self._wake.wait(), backoff.next_pause())
                    except asyncio.TimeoutError:
                        pass
                    self._wake.clear()
        finally:
            stats.cancel()

    async def _connect_and_stream(self) -> None:
        cfg = self.cfg
        ssl_ctx = cfg.tls.client_context() if cfg.tls else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(cfg.host, cfg.port, ssl=ssl_ctx), timeout=cfg.heartbeat_timeout_s)
        self.connects += 1
        try:
            await self._session(reader, writer)
        finally:
            if self.filter is not None:  # a new session restarts the stream: a new filter process too
                self.filter.kill()
            if self.state == "lost":
                writer.transport.abort()
            elif self._stopping:  # nothing will send the rest again: it must arrive
                await self._close_gracefully(reader, writer)
            else:  # a deactivate, a kick or an error: the next session starts at the receiver's seqno
                writer.close()

    async def _close_gracefully(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """End the last session (``stop``) so that what was sent arrives: a FIN after the last batch,
        then read (and drop) until the receiver closes its end too, for at most ``heartbeat_timeout_s``.

        A plain close is not enough. Closing a socket with unread bytes in it (a heartbeat answer that
        came in meanwhile), or one the receiver then writes to (its answers while it still reads the
        backlog), makes the kernel send RST, and an RST discards what the receiver has not read yet:
        after a stop, the secondary lost the tail of what this server had logged as sent."""
        try:
            if writer.can_write_eof():  # TLS cannot half-close: there the close alone must do
                writer.write_eof()  # goes out once the transport's buffer is flushed
                await asyncio.wait_for(_read_until_eof(reader), self.cfg.heartbeat_timeout_s)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cfg = self.cfg
        conn = Connection(Role.SOURCE, compress_level=cfg.compress_level)
        self.state = "handshake"
        self._kicked = False  # a kick from here on ends this session: its Hello may predate the change
        me = hello_for(self.db.info, self.db.seqno, secondary=self.cfg.secondary)  # the receiver checks it too
        writer.write(conn.send(me))
        await writer.drain()
        peer = await asyncio.wait_for(read_event(conn, reader), cfg.heartbeat_timeout_s)
        if isinstance(peer, Error):
            self.log.error("receiver %s:%d refused: %s: %s", cfg.host, cfg.port, peer.code, peer.message)
            self._misaddressed = peer.code == RefusalCode.WRONG_NAME  # another instance answered there
            where = f" (the receiver at {cfg.host}:{cfg.port})" if self._misaddressed else ""
            raise _Refused(f"{peer.code}: {peer.message}{where}")
        assert isinstance(peer, Hello)
        refusal = (check_secondary_name(peer, cfg.secondary, source=me.name, address=f"{cfg.host}:{cfg.port}")
                   or check_peer(me, peer, i_am="source"))
        self._misaddressed = refusal is not None and refusal.code is RefusalCode.WRONG_NAME
        if refusal is not None:
            self.log.error("refusing %s: %s: %s", peer.name, refusal.code, refusal.message)
            writer.write(conn.send(Error(refusal.code, refusal.message, refusal.common_seqno)))
            await writer.drain()
            raise _Refused(f"{refusal.code}: {refusal.message}")
        common = common_point(me.history, me.seqno, peer.history, peer.seqno)
        self._next = peer.seqno + 1
        writer.write(conn.send(Start(self._next, common, me.history, stream_entries(self.db.info))))
        await writer.drain()
        self.compression = ("streamed" if conn.streamed_compression else "per batch" if cfg.compress_level
                            else "none")
        self.log.info("connected to %s (seqno %d); common point %d; streaming from seqno %d%s",
                      peer.name, peer.seqno, common, self._next,
                      f"; zstd level {cfg.compress_level}, {self.compression}" if cfg.compress_level else "")
        self.last_confirmed = peer.seqno
        self.state = "streaming"
        self._backoff.streaming(time.monotonic())
        self.last_error = None
        self._fiter = None
        self._xon.set()
        self._heartbeats = HeartbeatWatch(cfg.heartbeat_timeout_s, time.monotonic())
        self._stream_check = StreamCheck()  # this connection's: batches lost between heartbeats
        lock = asyncio.Lock()
        await run_together(self._send_loop(conn, writer, lock), self._recv_loop(conn, reader),
                           self._heartbeat_loop(conn, writer, lock), self._deactivate_watch())

    async def _deactivate_watch(self) -> None:
        while self.active and not self._kicked:
            self._wake.clear()
            await self._wake.wait()
        raise ConnectionLost("deactivated" if not self.active else "restarting after a rollback")

    async def _send_loop(self, conn: Connection, writer: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._xon.is_set():
                self.state, self.xoff_since = "xoff", time.monotonic()  # xoff_s, xoff_since: for net.metrics
                await self._xon.wait()
                self.state, self.xoff_s, self.xoff_since = "streaming", self.xoff_s + time.monotonic() - self.xoff_since, None
            start = self._next
            frames = self.pool.read(start, self.cfg.max_batch_bytes)
            if frames is None:
                run = await loop.run_in_executor(None, self._read_files, start)
                if run is None:
                    raise JournalGap(f"seqno {start} is neither in the journal pool nor in the journal files")
                if self.reading_from != "files":
                    self.log.info("seqno %d is older than the journal pool (starts at %d): reading journal files",
                                  start, self.pool.first_seqno)
                self.reading_from = "files"
            elif not frames:
                if self.reading_from != "pool":
                    self.log.info("caught up: back to the journal pool at seqno %d", start)
                    self.reading_from = "pool"
                    self._fiter = None
                await self.pool.wait_beyond(start - 1, self.cfg.heartbeat_interval_s)
                continue
            else:
                if self.reading_from != "pool":
                    self.log.info("caught up: back to the journal pool at seqno %d", start)
                    self.reading_from = "pool"
                    self._fiter = None
                run = None
            if self.filter is not None:  # nothing of a batch the filter fails on is sent
                if run is None:
                    run = FrameRun.of(list(enumerate(frames, start)))
                try:
                    run = await loop.run_in_executor(None, self.filter.apply, run)
                except FilterError as e:
                    raise FilterError(f"{e.message}; nothing of batch {run.first_seqno}..{run.last_seqno} was "
                                      f"sent") from None
            if run is None:  # from the pool, unfiltered: the hot path builds no per-frame ends
                n, data = len(frames), b"".join(frames)
            else:
                n, data = len(run), run.data
            last = start + n - 1
            data = conn.send(TxnBatch(start, last, data))
            async with lock:
                # Checked with no await before the write: nothing committed after a deactivate (which
                # runs on this loop) is sent, even if the watch task has not ended the session yet.
                if not self.active or self._kicked:
                    raise ConnectionLost("deactivated" if not self.active else "restarting after a rollback")
                writer.write(data)
                await writer.drain()
            self._next = last + 1
            self.last_sent = last
            self.sent_records += n
            self.sent_batches += 1
            self.bytes_sent += len(data)

    def _read_files(self, start: int) -> FrameRun | None:
        """The next run of frames from ``start`` in the journal files (one slice of a segment), or None."""
        # Bounded by what the writer has written whole: a write that fails (a full disk) is undone, and
        # frames of it that a reader saw in the file meanwhile must never reach a secondary.
        fresh = self._fiter is None or self._fnext != start
        if fresh:
            self._fiter = iter_runs(self.db.layout.journal, start, self.cfg.max_batch_bytes,
                                    self.db.journal.written_seqno)
        run = next(self._fiter, None)
        if run is None and not fresh:
            # The iterator ended at what the newest segment held when it got there (a map of its size
            # then; a segment sealed since reads as the newest): records written later are in the
            # files, and the pool may no longer hold them. Look again before calling it a gap.
            self._fiter = iter_runs(self.db.layout.journal, start, self.cfg.max_batch_bytes,
                                    self.db.journal.written_seqno)
            run = next(self._fiter, None)
        if run is None:
            self._fiter = None
            return None
        self._fnext = run.last_seqno + 1
        self.file_reads += 1
        return run

    async def _recv_loop(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        while True:
            ev = await read_event(conn, reader)
            if isinstance(ev, HeartbeatAck):  # seq 0: unsolicited, "your bytes are arriving"
                self._heartbeats.answered(time.monotonic())
                if ev.seq:
                    self._rtt_s = max(0.0, time.time() - ev.sent_at)
                    lost = self._stream_check.answered(ev.seq, ev.received_seqno)
                    if lost is not None:
                        raise RemoteProtocolError(lost)
                # Never past what this instance has: the slot's confirmed seqno decides what prune keeps.
                confirmed = min(ev.applied_seqno, self.db.seqno)
                if confirmed > self.last_confirmed and self._on_confirmed is not None:
                    self.last_confirmed = confirmed
                    self._on_confirmed()
                self.last_confirmed = confirmed
                self.peer_received = ev.received_seqno
            elif isinstance(ev, Xoff):
                self.log.info("XOFF from %s at received seqno %d: pausing", self.cfg.secondary, ev.received_seqno)
                self._xon.clear()
            elif isinstance(ev, Xon):
                self.log.info("XON from %s: resuming at seqno %d", self.cfg.secondary, self._next)
                self._xon.set()
            elif isinstance(ev, Error):
                self.log.error("receiver %s reported %s: %s", self.cfg.secondary, ev.code, ev.message)
                raise _Refused(f"{ev.code}: {ev.message}")
            else:
                raise RemoteProtocolError(f"unexpected {type(ev).__name__} from the receiver")

    async def _heartbeat_loop(self, conn: Connection, writer: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        seq = 0
        while True:
            await asyncio.sleep(self.cfg.heartbeat_interval_s)
            now = time.monotonic()
            if self._heartbeats.lost(now):
                silent = self._heartbeats.silent_s(now)
                self.state = "lost"
                raise ConnectionLost(f"no heartbeat answer from {self.cfg.secondary} for {silent:.1f} s "
                                     f"(heartbeat_timeout_s={self.cfg.heartbeat_timeout_s})")
            seq += 1
            data = conn.send(Heartbeat(seq, time.time(), self.db.seqno))
            if lock.locked():  # the sender is blocked on a full socket: don't queue behind it
                continue
            async with lock:
                self._stream_check.sent(seq, self._next - 1)  # every batch before it is written
                writer.write(data)
                self.bytes_sent += len(data)
                await asyncio.wait_for(writer.drain(), self.cfg.heartbeat_timeout_s)

    # -- statistics ------------------------------------------------------------------------------
    @property
    def backlog(self) -> int:
        return max(0, self.db.seqno - self.last_confirmed)

    def lag_s(self) -> float:
        """Replication lag in time: how long ago the oldest transaction the secondary has not yet
        applied was committed (0 when it has everything). Read from the journal pool; when that
        transaction has left the pool, the last known figure stands."""
        if self.last_confirmed >= self.db.seqno:
            self._lag_s = 0.0
        else:
            frames = self.pool.read(self.last_confirmed + 1, 1)
            if frames:
                rec = decode_payload(memoryview(frames[0])[FRAME_HEADER_SIZE:])
                self._lag_s = max(0.0, time.time() - rec.time)
        return self._lag_s

    def status(self) -> dict:
        return {"secondary": self.cfg.secondary, "state": self.state, "mode": "active" if self.active else "passive",
                "connect": f"{self.cfg.host}:{self.cfg.port}", "seqno": self.db.seqno, "last_sent": self.last_sent,
                "last_confirmed": self.last_confirmed, "backlog": self.backlog,
                "backlog_unsent": max(0, self.db.seqno - self.last_sent), "reading_from": self.reading_from,
                "file_reads": self.file_reads, "pool_first_seqno": self.pool.first_seqno,
                "pool_last_seqno": self.pool.last_seqno, "sent_records": self.sent_records,
                "connects": self.connects, "lag_s": round(self.lag_s(), 3),
                "rtt_s": round(self._rtt_s, 4), "start_seqno": self.start_seqno,
                "last_error": self.last_error, "compress_level": self.cfg.compress_level,
                "compression": self.compression, "bytes_sent": self.bytes_sent, "sent_batches": self.sent_batches,
                "tls": bool(self.cfg.tls),
                "filter": self.cfg.filter.text if self.cfg.filter else None,
                **(self.filter.status() if self.filter else {})}

    def _save_slot(self) -> None:
        if self._misaddressed and self.cfg.secondary not in self.db.info.slots:
            # Only another instance answered at the address: a new slot would pin the journal (prune)
            # for a secondary this server has never reached.
            return

        def upd(info) -> None:
            s = info.slot(self.cfg.secondary)
            s.last_sent, s.last_confirmed = self.last_sent, self.last_confirmed
            s.mode, s.updated = ("active" if self.active else "passive"), time.time()
        try:
            self.db.update_info(upd)
        except MultisiteError as e:
            self.log.warning("could not save the slot for %s: %s", self.cfg.secondary, e)

    async def _stats_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last_t, last_sent = time.monotonic(), self.sent_records
        next_save = time.monotonic()
        while True:
            await asyncio.sleep(min(self.cfg.stats_interval_s, self.cfg.slot_save_interval_s))
            now = time.monotonic()
            if now >= next_save:
                await loop.run_in_executor(None, self._save_slot)
                next_save = now + self.cfg.slot_save_interval_s
            if now - last_t >= self.cfg.stats_interval_s:
                n = self.sent_records - last_sent
                self.log.info("stats: state %s, backlog %d, sent %d records in %.1f s (%.0f/s), seqno start %d "
                              "current %d, last sent %d, confirmed %d, reading from %s, filter %s", self.state,
                              self.backlog, n, now - last_t, n / (now - last_t), self.start_seqno, self.db.seqno,
                              self.last_sent, self.last_confirmed, self.reading_from,
                              self.cfg.filter.text if self.cfg.filter else "none")
                last_t, last_sent = now, self.sent_records
