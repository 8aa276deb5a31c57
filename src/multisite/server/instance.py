"""The instance server: one process that owns an instance and runs its replication components.

    python -m multisite.server.instance DIR [--listen HOST:PORT]      (normally via `multisite server start`)

It holds the instance lock and the engine, the journal pool (fed by every commit), the Source
Servers (one per secondary), the Receiver Server with its receive pool, and the Update Process.
Applications reach it through the client protocol on ``--listen``; the CLI controls it through
the control channel (``net.control``). Each component logs to its own file in ``<instance>/log/``
as well as to ``server.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from .. import engine
from ..errors import ConfigError, MultisiteError, RegionNotFound, ServerError
from ..fsutil import atomic_write, create_file
from ..journal.durability import Durability
from ..journal.records import KILL, SET, ZKILL
from ..keys import check_key, decode_key, encode_key
from ..values import decode_value, encode_value
from ..protocol.client import OPS
from ..replication.filters import DEFAULT_FILTER_TIMEOUT_S, FilterSpec
from ..replication.history import to_entries
from ..replication.resync import local_target_for_stream
from ..replication.roles import change_role, resync_instance
from ..replication.server.pools import JournalPool, ReceivePool
from ..replication.server.update import UpdateProcess
from ..net.affinity import parse_cpus
from .client import fetch_hello
from .client_auth import ClientAuth
from .clients import ClientListener
from .min_confirm import MIN_CONFIRM_TIMEOUT_S_DEFAULT, ServerMinConfirm
from .sockets import KEEPALIVE_S, check_keepalive, server_loop
from ..net.control import control_address
from ..replication.server.receiver import ReceiverConfig, ReceiverServer
from ..replication.server.source import SourceConfig, SourceServer
from ..net.tls import TLSConfig, parse_hostport

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# In DIR/run while an HA manager holds the instance's local commits to a lease (``ctl_lease``, ha/): a
# server started again with it is fenced until a manager gives it a lease again or lifts the fence once
# it has rejoined the new primary. The fence is in memory: without the file a restarted old primary (a
# stopped leader, or a lost one whose host came back) took commits beside the new one.
HA_LEASE_FILE = "ha_lease.json"


def component_logger(root: Path, name: str, filename: str, parent: str = "multisite") -> logging.Logger:
    log = logging.getLogger(f"{parent}.{name}")  # parent: the server's logger (one per instance served)
    if not any(getattr(h, "_ms_file", None) == filename for h in log.handlers):
        h = logging.FileHandler(create_file(root / "log" / filename))
        h.setFormatter(logging.Formatter(LOG_FORMAT))
        h._ms_file = filename  # type: ignore[attr-defined]
        log.addHandler(h)
    log.setLevel(logging.INFO)
    return log


class InstanceServer(ServerMinConfirm):
    def __init__(self, root: Path, listen: str | None, keepalive_s: int = KEEPALIVE_S,
                 tls: TLSConfig | None = None, insecure: bool = False, metrics: str | None = None):
        self.root = Path(root).absolute()
        self.metrics_listen, self.metrics = metrics, None  # net.metrics: /metrics on HOST:PORT
        self.client_observer = None  # server.metrics.InstanceMetrics with --metrics: the listener reports to it
        self.listen = listen
        self.client_tls, self.insecure = tls, insecure  # the client port's (issue 14: server.client_auth)
        self.client_auth: ClientAuth | None = None
        self.keepalive_s = keepalive_s
        self.log = logging.getLogger("multisite")
        self.sources: dict[str, SourceServer] = {}
        self.receiver: ReceiverServer | None = None
        self._stop = asyncio.Event()
        self._stop_timeout_s = 5.0  # how long sources may send what is pending at shutdown
        self.started_at = time.time()
        self.client_port: int | None = None
        self.clients: ClientListener | None = None
        self.ready = threading.Event()  # set once it serves (the control socket answers)
        self.in_process = False  # served inside an application (server.serve): its pid is the application's
        self.min_confirm = 0  # --min-confirm (ha start): secondaries that must confirm a commit before its answer
        self.min_confirm_timeout_s = MIN_CONFIRM_TIMEOUT_S_DEFAULT

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        if self.listen:  # before the engine opens: a refused --listen leaves nothing to close
            self.client_auth = ClientAuth(self.root, parse_hostport(self.listen)[0], self.log, tls=self.client_tls,
                                          insecure=self.insecure)
        db = self._open_engine()
        self.pool = JournalPool(db.info.journal_pool_bytes)
        self.pool.reset(db.seqno)
        db.commit_listeners.append(self.pool.extend)
        db.rollback_listeners.append(self.pool.reset)
        self.receive_pool = ReceivePool(64 * 1024 * 1024, 16 * 1024 * 1024)
        self.update = UpdateProcess(db, self.receive_pool, component_logger(self.root, "update", "update.log", self.log.name))
        self.log.info("instance server for %s (%s) started, pid %d, seqno %d; recovery: %s", db.name, self.root,
                      os.getpid(), db.seqno, db.recovery.summary())
        if self.metrics_listen:  # before the client listener: it wraps the client operation
            from .metrics import start_instance_metrics
            try:
                _m, self.metrics = await start_instance_metrics(self, self.metrics_listen)
            except BaseException:
                self.db.close()
                raise
        cli_srv = None
        if self.listen:
            host, port = parse_hostport(self.listen)
            try:
                cli_srv = ClientListener(host, port, self._client_op, self.log, self.keepalive_s, db=db,
                                         commit_ops=self._commit_ops, auth=self.client_auth,
                                         observer=self.client_observer)
            except OSError as e:
                self.db.close()
                raise ConfigError(f"cannot listen for clients on {self.listen}: {e.strerror or e}") from None
            self.client_port = cli_srv.port
            self.log.info("client protocol listening on %s:%d (keepalive %d s)", host, self.client_port,
                          self.keepalive_s)
            self.log.info("client authentication: %s", self.client_auth.status() if self.client_auth else None)
        self.clients = cli_srv
        loop = asyncio.get_running_loop()
        db.rollback_listeners.append(lambda seqno: loop.call_soon_threadsafe(self._rolled_back, seqno))
        if threading.current_thread() is threading.main_thread():  # not so when served in-process (server.serve)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        # The control socket last: once it answers, `server start` reads the run file, which must
        # then be this server's (not one left by a killed server) and the server fully up.
        self._write_runfile()
        try:
            ctl = await asyncio.start_unix_server(self._control, path=control_address(self.root))
        except BaseException:
            await self._shutdown(None, cli_srv, 0.0)
            raise
        self.ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(ctl, cli_srv, self._stop_timeout_s)

    def _open_engine(self) -> engine.Database:
        """Open the instance for serving: a group-mode primary starts a new history record, and one that
        was under an HA manager's lease starts fenced."""
        self.db = db = engine.open(self.root)
        if db.info.role == "primary" and db.durability is not Durability.FSYNC:
            # The journal pool takes a batch before its fdatasync: sources may have shipped frames that an
            # EIO or a power cut took off this journal. A new history range before any source connects
            # lets a secondary holding them find the common point at this journal's end and roll them
            # back; under the old one the next commits would reuse their seqnos (a silent divergence,
            # found by testing.sim, log shipping seed 1624).
            db.update_info(lambda info: info.add_history(db.seqno + 1, info.name, "originating"))
        if (self.root / "run" / HA_LEASE_FILE).exists():
            db.set_lease(0.0)
            self.log.warning("%s was under an HA manager's lease when its server stopped: it takes no local commit "
                             "(NOT_PRIMARY) until its manager leads it again or rejoins it to the new primary (to "
                             "leave HA for good: remove %s with the server stopped)", db.name,
                             self.root / "run" / HA_LEASE_FILE)
        return db

    def _write_runfile(self) -> None:
        info = {"pid": os.getpid(), "listen": self.listen, "client_port": self.client_port,
                "started": self.started_at, "log": str(self.root / "log" / "server.log"),
                "cpus": sorted(os.sched_getaffinity(0)), "metrics_port": self.metrics.port if self.metrics else None}
        atomic_write(self.root / "run" / "server.json", json.dumps(info).encode())

    async def _shutdown(self, ctl, cli_srv, timeout_s: float = 5.0) -> None:
        self.log.info("shutting down")
        # Together: each source sends what is pending within the one bound the caller gave.
        await asyncio.gather(*(s.stop(timeout_s) for s in list(self.sources.values())))
        if self.receiver:
            await self.receiver.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.update.stop)
        if ctl is not None:
            ctl.close()
        if self.metrics:
            await self.metrics.close()
        if cli_srv:
            await asyncio.get_running_loop().run_in_executor(None, cli_srv.close)  # transactions in flight end first
        self.db.close()
        (self.root / "run" / "server.json").unlink(missing_ok=True)
        self.log.info("instance server stopped at seqno %d", self.db.seqno)

    # -- control channel -------------------------------------------------------------------------
    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The socket is in the abstract namespace, which has no file permissions: any local user
        # could connect, so the peer's credentials are checked (this server's user, or root).
        sock = writer.get_extra_info("socket")
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid not in (os.getuid(), 0):
            self.log.warning("control connection from pid %d of uid %d refused: only uid %d (or root) may "
                             "control this server", pid, uid, os.getuid())
            reply = {"ok": False, "code": ServerError.code,
                     "error": f"refused: the instance server of {self.root} runs as uid {os.getuid()} and takes "
                              f"control commands only from that user or root, not from uid {uid}"}
            try:
                await reader.readline()  # read the request (and do nothing): the peer then gets the reply
            except (ValueError, OSError):
                pass
            writer.write((json.dumps(reply) + "\n").encode())
            try:
                await writer.drain()
                writer.close()
            except OSError:
                pass
            return
        try:
            line = await reader.readline()
            req = json.loads(line)
            handler = getattr(self, "ctl_" + req["op"].replace(".", "_"), None)
            if handler is None:
                raise ConfigError(f"unknown control operation {req['op']!r}")
            result = await handler(**req.get("args", {}))
            reply = {"ok": True, "result": result}
        except MultisiteError as e:
            reply = {"ok": False, "code": e.code, "error": e.message}
        except (TypeError, ValueError, KeyError) as e:
            reply = {"ok": False, "code": "CONFIG", "error": f"bad control request: {e}"}
        except Exception as e:  # report, never kill the server for a bad request
            self.log.exception("control request failed")
            reply = {"ok": False, "code": "SERVER", "error": f"{type(e).__name__}: {e}"}
        writer.write((json.dumps(reply, default=str) + "\n").encode())
        try:
            await writer.drain()
            writer.close()
        except OSError:
            pass

    async def ctl_lease(self, until: float | None = None) -> dict:
        """HA fencing (``ha/manager.py``): local commits only until the monotonic time ``until`` (the
        machine's clock, shared with the manager's process); None: no lease. A lease is recorded in
        DIR/run (``HA_LEASE_FILE``) before it is given, so that a restarted server starts fenced."""
        marker = self.root / "run" / HA_LEASE_FILE
        if until is None:
            self.db.set_lease(None)
            marker.unlink(missing_ok=True)
            return {"pid": os.getpid(), "until": until}
        until = float(until)
        if not marker.exists():
            atomic_write(marker, json.dumps({"since": time.time()}).encode())
        self.db.set_lease(until)
        return {"pid": os.getpid(), "until": until}

    async def ctl_ping(self) -> dict:
        return {"pid": os.getpid(), "in_process": self.in_process}

    async def ctl_shutdown(self, timeout_s: float = 5.0) -> dict:
        # ``timeout_s``, not ``timeout``: control.call keeps that name for its own socket timeout, so an
        # argument called ``timeout`` never reached the server and every stop flushed for 5 s only.
        timeout_s = float(timeout_s)
        if not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ConfigError(f"shutdown: timeout_s must be a number of seconds, 0 or more, got {timeout_s}")
        self._stop_timeout_s = timeout_s
        self._stop.set()
        return {"pid": os.getpid()}

    async def ctl_status(self) -> dict:
        backlogs = [s.backlog for s in self.sources.values()] + [len(self.receive_pool)]
        return {"pid": os.getpid(), "name": self.db.name, "state": "running", "role": self.db.info.role,
                "fenced": self.db.fenced,  # a primary whose leader lease ended: it takes no commit
                "client_auth": self.client_auth.status() if self.client_auth else None,
                "backlog": max(backlogs),
                "seqno": self.db.seqno, "group": self.db.info.group, "client_port": self.client_port,
                "clients": self.clients.connections if self.clients else 0,
                "client_commits": self.clients.stats() if self.clients else None,
                "durability": self.db.durability.value, "cpus": sorted(os.sched_getaffinity(0)),
                "pool": {"first_seqno": self.pool.first_seqno, "last_seqno": self.pool.last_seqno,
                         "bytes": self.pool.bytes, "capacity_bytes": self.pool.capacity_bytes},
                "sources": {n: s.status() for n, s in self.sources.items()},
                "receiver": self.receiver.status() if self.receiver else None,
                "update": self.update.status(), "log": str(self.root / "log" / "server.log"),
                "min_confirm": {"n": self.min_confirm, "timeout_s": self.min_confirm_timeout_s,
                                "counting": self.confirming()} if self.min_confirm else None,
                "streams": self._si_streams(),
                "metrics": f"{self.metrics_listen.rsplit(':', 1)[0]}:{self.metrics.port}" if self.metrics else None}

    def _si_streams(self) -> dict[str, dict]:
        """A supplementary instance's SI streams (1..15): source group, root primary, last stream seqno."""
        return {str(n): {"group": st.source_group, "root_primary": st.root_primary,
                         "stream_seqno": self.db.stream_seqno(n)}
                for n, st in sorted(self.db.info.streams.items())}

    def _source(self, secondary: str) -> SourceServer:
        s = self.sources.get(secondary)
        if s is None:
            raise ServerError(f"no source server for secondary {secondary!r} on {self.db.name}; start one with "
                              f"`multisite source start {self.root} --secondary {secondary} --connect HOST:PORT`")
        return s

    def _component(self, kind: str, extra: dict) -> dict:
        return {"pid": os.getpid(), "log": str(self.root / "log" / kind), **extra}

    async def ctl_source_start(self, secondary: str, connect: str, passive: bool = False, compress: int = 0,
                               tls: dict | None = None, heartbeat_interval_s: float = 1.0,
                               heartbeat_timeout_s: float = 5.0, stats_interval_s: float = 5.0,
                               filter: str | None = None, filter_format: str = "json",
                               filter_timeout_s: float = DEFAULT_FILTER_TIMEOUT_S,
                               max_batch_bytes: int = SourceConfig.max_batch_bytes) -> dict:
        if secondary in self.sources and self.sources[secondary].state != "stopped":
            raise ServerError(f"a source server for {secondary!r} is already running")
        if secondary == self.db.name:
            raise ConfigError(f"an instance cannot be its own secondary ({secondary!r})")
        host, port = parse_hostport(connect)
        if not 0 <= compress <= 22:
            raise ConfigError(f"--compress takes a zstd level 0..22, got {compress}")
        cfg = SourceConfig(secondary, host, port, passive=passive, compress_level=compress,
                           tls=TLSConfig(**tls) if tls else None, heartbeat_interval_s=heartbeat_interval_s,
                           heartbeat_timeout_s=heartbeat_timeout_s, stats_interval_s=stats_interval_s,
                           filter=FilterSpec.parse(filter, filter_format, filter_timeout_s) if filter else None,
                           max_batch_bytes=max_batch_bytes)
        if max_batch_bytes < 1:
            raise ConfigError(f"max_batch_bytes must be at least 1, got {max_batch_bytes}")
        if cfg.tls:
            cfg.tls.client_context()  # fail now on unreadable files
        fname = f"source-{secondary}.log"
        src = SourceServer(self, cfg, component_logger(self.root, f"source.{secondary}", fname, self.log.name))
        if src.filter is not None:  # fail now on a filter that cannot start
            await asyncio.get_running_loop().run_in_executor(None, src.filter.check)
        self.sources[secondary] = src
        src.start()
        return self._component(fname, src.status())

    async def ctl_source_stop(self, secondary: str, timeout_s: float = 5.0) -> dict:
        src = self._source(secondary)
        await src.stop(float(timeout_s))
        del self.sources[secondary]
        return self._component(f"source-{secondary}.log", src.status())

    async def ctl_source_activate(self, secondary: str, connect: str | None = None) -> dict:
        src = self._source(secondary)
        host, port = parse_hostport(connect) if connect else (None, None)
        src.activate(host, port)
        return self._component(f"source-{secondary}.log", src.status())

    async def ctl_source_deactivate(self, secondary: str) -> dict:
        src = self._source(secondary)
        src.deactivate()
        await src.wait_passive()
        return self._component(f"source-{secondary}.log", src.status())

    async def ctl_source_status(self, secondary: str | None = None) -> dict:
        if secondary:
            return self._component(f"source-{secondary}.log", self._source(secondary).status())
        return {n: s.status() for n, s in self.sources.items()}

    async def ctl_receiver_start(self, listen: str, tls: dict | None = None, autorollback: bool = False,
                                 noresync: bool = False, receive_pool_bytes: int = 64 * 1024 * 1024,
                                 stats_interval_s: float = 5.0, update: bool = True, filter: str | None = None,
                                 filter_format: str = "json",
                                 filter_timeout_s: float = DEFAULT_FILTER_TIMEOUT_S,
                                 progress_interval_s: float = 0.5) -> dict:
        if self.receiver is not None:
            raise ServerError(f"the receiver server of {self.db.name} is already running on "
                              f"{self.receiver.cfg.host}:{self.receiver.port}")
        if noresync and not self.db.info.supplementary:
            raise ConfigError("--noresync applies only to supplementary (SI) instances; "
                              f"{self.db.name} is a BC instance")
        host, port = parse_hostport(listen)
        cfg = ReceiverConfig(host, port, tls=TLSConfig(**tls) if tls else None, autorollback=autorollback,
                             noresync=noresync, receive_pool_high_bytes=receive_pool_bytes,
                             receive_pool_low_bytes=receive_pool_bytes // 4, stats_interval_s=stats_interval_s,
                             progress_interval_s=progress_interval_s, filter=FilterSpec.parse(filter, filter_format, filter_timeout_s) if filter else None)
        self.receive_pool.high_bytes, self.receive_pool.low_bytes = cfg.receive_pool_high_bytes, cfg.receive_pool_low_bytes
        self.update.stats_interval_s = stats_interval_s
        rcv = ReceiverServer(self, cfg, component_logger(self.root, "receiver", "receiver.log", self.log.name), self.update,
                             self.receive_pool)
        if rcv.filter is not None:  # fail now on a filter that cannot start
            await asyncio.get_running_loop().run_in_executor(None, rcv.filter.check)
        try:  # the port first: a failed bind must leave the instance as it was, not a secondary without receiver
            await rcv.start()
        except OSError as e:
            if rcv.filter is not None:
                rcv.filter.kill()
            raise ConfigError(f"cannot listen for a source on {listen}: {e.strerror or e}") from None
        try:
            if not self.db.info.supplementary and self.db.info.role != "secondary":
                await asyncio.get_running_loop().run_in_executor(None, change_role, self.db, "secondary")
        except BaseException:
            await rcv.stop()
            raise
        self.receiver = rcv
        if update:
            self.update.start()
        return self._component("receiver.log", rcv.status())

    async def ctl_receiver_stop(self) -> dict:
        if self.receiver is None:
            raise ServerError(f"no receiver server is running on {self.db.name}")
        await self.receiver.stop()
        st = self.receiver.status()
        self.receiver = None
        await asyncio.get_running_loop().run_in_executor(None, self.update.stop)
        return self._component("receiver.log", st)

    async def ctl_receiver_status(self) -> dict:
        if self.receiver is None:
            return self._component("receiver.log", {"state": "stopped", "seqno": self.db.seqno, "backlog": len(
                self.receive_pool), "update_process": self.update.status()})
        return self._component("receiver.log", self.receiver.status())

    async def ctl_update_start(self) -> dict:
        self.update.start()
        return self._component("update.log", self.update.status())

    async def ctl_update_stop(self) -> dict:
        await asyncio.get_running_loop().run_in_executor(None, self.update.stop)
        return self._component("update.log", self.update.status())

    async def ctl_update_status(self) -> dict:
        return self._component("update.log", self.update.status())

    # -- failover: roles and rollback ----------------------------------------------------------
    def rollback_to_common(self, common: int, stream: int | None, reason: str):
        """Roll back to the common point found with a source (BC: ``stream`` None, seqnos shared; SI:
        a seqno of ``stream``, the source's numbering). Runs in a worker thread; the receiver has
        emptied the receive pool and quiesced first."""
        to = common if stream is None else local_target_for_stream(self.db, stream, common)
        return self.db.rollback(to, reason=reason, common_seqno=common, common_stream=stream)

    def kick_sources(self) -> None:
        for s in self.sources.values():
            s.kick()

    def _resync_frozen(self, resync: int | None, fetchresync: str | None, fetch_tls_ca: str | None):
        """The rollback, in a worker thread, with nothing applied from the stream from before the
        source's Hello is fetched until it is done (a batch applied after the Hello makes this instance
        look ahead of that source, and the rollback cut what it had confirmed). This thread takes and
        releases ``apply_lock`` itself: a cancelled control request cannot leave it held, nor release it
        while the rollback runs. Taken with or without a receiver: one started meanwhile waits too."""
        with self.receive_pool.apply_lock:
            try:
                primary = fetch_hello(fetchresync, fetch_tls_ca) if fetchresync else None
                return resync_instance(self.db, resync, primary, fetchresync or "")
            finally:
                self.receive_pool.clear(self.db.seqno)  # what came meanwhile: sent again after the restart

    async def ctl_rollback(self, resync: int | None = None, fetchresync: str | None = None,
                           fetch_tls_ca: str | None = None) -> dict:
        loop = asyncio.get_running_loop()
        self.receive_pool.clear(self.db.seqno)
        job = loop.run_in_executor(None, self._resync_frozen, resync, fetchresync, fetch_tls_ca)

        def done(_=None) -> None:
            if self.receiver is not None:
                # The receive pool was emptied: what it held must be sent again, rolled back or not
                # (a no-op rollback left the connection up, and the frames it had delivered were lost).
                self.receiver.restart_stream()
        try:
            rep = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(done)  # the thread goes on: the stream restarts once it is done
            raise
        except BaseException:
            done()
            raise
        done()
        if rep.rolled_back:
            self.log.warning("%s", rep.summary())
            self.kick_sources()
        return {"pid": os.getpid(), **rep.__dict__}

    async def ctl_role(self, role: str) -> dict:
        if role == "primary" and self.receiver is not None:
            raise ServerError(f"{self.db.name} has a running receiver server: stop it first "
                              f"(multisite receiver stop {self.root}), then make it primary")
        before = [h.uid for h in self.db.info.history]
        info = await asyncio.get_running_loop().run_in_executor(None, change_role, self.db, role)
        self.log.info("role of %s is now %s", self.db.name, role)
        if [h.uid for h in info.history] != before:
            # A secondary learns this instance's history only in the Start of a session: end the
            # sessions before anything is committed under the new record, or a cascaded secondary
            # files the new transactions under the old root primary and can later agree with it
            # on a common point past them (a silent divergence).
            await self._restart_sources()
        return {"pid": os.getpid(), "role": info.role, "seqno": self.db.seqno,
                "history": msgspec.to_builtins(info.history)}

    async def _restart_sources(self, timeout_s: float = 5.0) -> None:
        """Kick every source in a session and wait until each has left it (kicking again: a kick
        during a handshake is forgotten when streaming starts)."""
        live = {s: s.connects for s in self.sources.values() if s.state in ("handshake", "streaming", "xoff")}
        deadline = time.monotonic() + timeout_s
        while live and time.monotonic() < deadline:
            live = {s: n for s, n in live.items() if s.connects == n and s.state in ("handshake", "streaming", "xoff")}
            for s in live:
                s.kick()
            await asyncio.sleep(0.005)

    # -- client protocol (connections are served by server.clients) ------------------------------
    def _commit_ops(self, a: dict) -> list:
        """A client's commit request checked, as the engine's updates (a primary's listener gathers
        them into group commits; otherwise ``_client_op`` commits them)."""
        db = self.db
        ops = []
        if not isinstance(a["ops"], list):
            raise ConfigError(f"commit: ops must be a list of [opcode, region, key, value], got {a['ops']!r:.80}")
        for i, u in enumerate(a["ops"]):
            if not (isinstance(u, list) and len(u) == 4):
                raise ConfigError(f"commit: update {i} must be [opcode, region, key, value], got {u!r:.80}")
            opc, region, key, value = u
            if type(opc) is not int or opc not in CLIENT_OPCODES:
                raise ConfigError(f"commit: update {i} has opcode {opc!r:.40}; the opcodes are "
                                  + ", ".join(f"{c} ({n})" for c, n in CLIENT_OPCODES.items()))
            db.region(_region_name(region))
            ops.append((opc, region, check_key(key), encode_value(value) if opc == SET else None))
        return ops

    def _client_op(self, op: str, a: dict) -> Any:
        """One client request. Every argument is checked here, with an error naming it: what the
        engine's own API trusts its caller for (an opcode, the types of a region's settings) comes
        from the wire here."""
        db = self.db
        if op == "get":
            return db.get(_region_name(a["region"]), check_key(a["key"]))
        if op == "items":
            region = db.region(_region_name(a["region"])).name  # checked first, as it always was
            lo = encode_key(check_key(a["start"])) if a.get("start") is not None else b""
            hi = encode_key(check_key(a["stop"])) if a.get("stop") is not None else None
            limit, inclusive = a.get("limit", 1000), a.get("inclusive", True)
            if type(limit) is not int or not 1 <= limit <= MAX_ITEMS_PAGE:
                raise ConfigError(f"items: limit must be an integer from 1 to {MAX_ITEMS_PAGE}, got {limit!r}")
            if type(inclusive) is not bool:
                raise ConfigError(f"items: inclusive must be true or false, got {inclusive!r}")
            rows = db.page(region, lo, hi, limit, inclusive=inclusive)
            return [[list(decode_key(k)), decode_value(v)] for k, v in rows]
        if op == "commit":
            return db.commit_updates(self._commit_ops(a))
        if op == "create_region":
            replicated, schema = a.get("replicated", True), a.get("schema")
            if type(replicated) is not bool:
                raise ConfigError(f"create_region: replicated must be true or false, got {replicated!r:.40}")
            if schema is not None and not isinstance(schema, str):
                raise ConfigError(f"create_region: schema must be a string or null, got {schema!r:.40}")
            db.create_region(a["name"], replicated, schema)
            return None
        if op in ("info", "history"):
            info = db.info
            return {"name": info.name, "group": info.group, "supplementary": info.supplementary,
                    "role": info.role, "seqno": db.seqno, "fenced": db.fenced,
                    "history": msgspec.to_builtins(to_entries(info.history))}
        if op == "regions":
            return db.regions()
        raise ConfigError(f"unknown client operation {op!r:.40}; the operations are {', '.join(OPS)}")


MAX_ITEMS_PAGE = 100_000  # rows in one ``items`` reply
CLIENT_OPCODES = {SET: "set", KILL: "kill", ZKILL: "zkill"}


def _region_name(region: object) -> str:
    if not isinstance(region, str):
        raise RegionNotFound(f"a region is named by a string, got {region!r:.40}")
    return region


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m multisite.server.instance")
    ap.add_argument("dir")
    ap.add_argument("--listen", default=None)
    ap.add_argument("--cpus", default=None)
    ap.add_argument("--keepalive", type=int, default=KEEPALIVE_S)
    for opt in ("--tls-cert", "--tls-key", "--tls-ca"):
        ap.add_argument(opt, default=None)
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--metrics", default=None)
    a = ap.parse_args(argv)
    root = Path(a.dir).absolute()
    h = logging.FileHandler(create_file(root / "log" / "server.log"))
    h.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger("multisite").addHandler(h)
    logging.getLogger("multisite").setLevel(logging.INFO)
    try:
        if a.cpus:
            # Before any thread starts, so that every thread of the server inherits it (see affinity).
            os.sched_setaffinity(0, parse_cpus(a.cpus))
            logging.getLogger("multisite").info("running on CPUs %s", a.cpus)
        tls = TLSConfig.from_options(a.tls_cert, a.tls_key, a.tls_ca)
        server = InstanceServer(root, a.listen, check_keepalive(a.keepalive), tls, a.insecure, a.metrics)
        with asyncio.Runner(loop_factory=server_loop) as runner:
            runner.run(server.run())
    except MultisiteError as e:
        logging.getLogger("multisite").error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
