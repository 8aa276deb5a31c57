"""The document server process (``python -m multisite.multimaster.server.docserver HOME DIR... --name N --listen H:P``).

Thin asyncio around the sans-IO session (``multimaster/session.py``): it serves a set of document
databases to other servers' Replicators (a ``Responder`` per connection), and runs its own
Replicator: ``--replicators N`` worker tasks taking session jobs from one queue (several sessions
with different servers at once; idle workers stay idle; never two sessions with one peer at once).
Jobs come from the console verbs (the control socket's ``replicate``), from a peer's pull-pull, and
from the connection documents in ``--address-book`` (a document database served like the others),
which a scheduler task reads every ``SCHEDULE_TICK_S``.

Database work runs in threads (``asyncio.to_thread``); each request of a session is one step of
the initiator generator or one ``Responder.handle``. With ``--tls-*`` every link is mutual TLS: a
peer whose certificate the CA did not sign fails the handshake (logged). HOME holds
``log/docserver.log``, ``run/docserver.json`` (pid, address) and ``run/connections.json`` (last run
and result per connection document); the control socket is named after HOME, and each database
served records HOME in its ``run/served_by.json`` while the server runs, so that the ``doc``
commands and ``multisite.documents.connect(DIR)`` find the server to edit it through (``docops.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import queue
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ConfigError, ConnectionLost, MultisiteError, ProtocolError
from ...fsutil import atomic_write
from .. import schedule
from . import docops
from .docdb import DocDB
from .docdb_files import clear_served_by, record_served_by
from ..session import Mode, Pipeline, Responder, initiate
from ..wire import NEED_DATA, DocWire, Side
from ...net.control import control_address
from ...net.process import run_logged
from ...net.tls import TLSConfig, parse_hostport

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
READ_BYTES = 1 << 20
SCHEDULE_TICK_S = 0.2
CONNECT_TIMEOUT_S = 10.0
SESSION_TIMEOUT_S = 600.0
CONNECTION_FORM = "Connection"


class _PausedAtConnect(asyncio.StreamReaderProtocol):
    """Reads nothing until ``handle`` resumes it or starts TLS (as the Receiver Server does): TLS starts
    inside ``handle`` so that a refused handshake is logged, not lost in asyncio's debug log."""

    def connection_made(self, transport) -> None:
        transport.pause_reading()
        super().connection_made(transport)


def _common_name(cert: dict | None) -> str:
    """The subject common name of a peer certificate as ``ssl`` gives it ("" if none)."""
    for rdn in (cert or {}).get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                return v
    return ""


def _reachable(listen: str, peer_ip: str) -> str:
    """The address to reach a peer that listens on ``listen``: a wildcard host is the peer's own address."""
    if not listen:
        return listen
    host, _, port = listen.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", "") and peer_ip:
        return f"[{peer_ip}]:{port}" if ":" in peer_ip else f"{peer_ip}:{port}"
    return listen


def _replies(q: "queue.Queue", n: int):
    """The replies of a pipeline as the reading task delivers them (in the generator's thread)."""
    for _ in range(n):
        r = q.get(timeout=SESSION_TIMEOUT_S)
        if isinstance(r, BaseException):
            raise ConnectionLost(f"the session was cut during a pipelined batch: {r}")
        yield r


async def _read(reader: asyncio.StreamReader, wire: DocWire, timeout_s: float) -> Any:
    while True:
        ev = wire.next_event()
        if ev is not NEED_DATA:
            return ev
        data = await asyncio.wait_for(reader.read(READ_BYTES), timeout_s)
        wire.receive_data(data)


class DocServer:
    def __init__(self, home: Path, dirs: list[str], name: str, listen: str, replicators: int,
                 tls: TLSConfig | None, peers: dict[str, str], address_book: str | None,
                 client_tls: TLSConfig | None = None, tls_names: bool = False, metrics: str | None = None,
                 couch: str | None = None, couch_cors: tuple[str, ...] = ()) -> None:
        self.metrics_listen, self.metrics = metrics, None  # net.metrics: /metrics on HOST:PORT
        self.couch_listen, self.couch = couch, None  # couch_http.py: CouchDB's replication protocol on HOST:PORT
        self.couch_cors = couch_cors  # the browser origins its answers may go to (couch_cors.py)
        self.home, self.name, self.listen, self.tls, self.peers = home, name, listen, tls, peers
        self.client_tls = client_tls or tls  # the initiator's certificate (a client-auth one), if different
        if tls_names and not tls:
            raise ConfigError("--tls-names needs TLS (--tls-cert, --tls-key, --tls-ca)")
        self.tls_names = tls_names  # a peer is the server its certificate names, whatever its Hello says
        self.log = logging.getLogger("multisite.docserver")
        if replicators < 1:
            raise ConfigError(f"--replicators must be 1 or more, got {replicators}")
        self.replicators = replicators
        self.dbs: dict[str, DocDB] = {}
        paths = list(dirs) + ([address_book] if address_book and address_book not in dirs else [])
        for d in paths:
            db = DocDB(d)
            if db.replica_id in self.dbs:
                other = self.dbs[db.replica_id]
                db.close()
                raise ConfigError(f"{d} and {other.path} are replicas of one database ({other.replica_id}): a "
                                  f"server serves one replica of each")
            self.dbs[db.replica_id] = db
        self.address_book = next((db for db in self.dbs.values() if address_book and
                                  db.path == Path(address_book).absolute()), None)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.busy_peers: set[str] = set()
        self.active: dict[int, str] = {}  # worker -> what it runs
        self.conn_state: dict[str, dict] = self._load_conn_state()
        self.armed: dict[str, float] = {}  # connection -> when first seen (a connection that never ran)
        self.sessions_done = 0
        self._stop = asyncio.Event()
        self.port = 0

    # -- serving other servers' Replicators ------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_addr = writer.get_extra_info("peername")
        if self._tls_ctx is not None:
            try:
                await asyncio.wait_for(writer.start_tls(self._tls_ctx), CONNECT_TIMEOUT_S)
            except (ssl.SSLError, OSError, asyncio.TimeoutError) as e:
                self.log.error("refused a replicator connection from %s: TLS handshake failed: %s (a server needs "
                               "a certificate signed by the CA %s)", peer_addr, str(e) or type(e).__name__,
                               self.tls.ca if self.tls else "-")
                writer.transport.abort()
                return
        else:
            writer.transport.resume_reading()
        wire = DocWire(Side.RESPONDER)
        peer_ip = peer_addr[0] if isinstance(peer_addr, tuple) else ""
        cert_name = _common_name(writer.get_extra_info("peercert")) if self.tls_names else None
        resp = Responder(self.name, self.dbs, log=lambda s: self.log.warning("%s", s),
                         on_pull_back=lambda p, listen, ids: self._pull_back(p, _reachable(listen, peer_ip), ids),
                         certified_name=cert_name)
        try:
            while True:
                req = await _read(reader, wire, SESSION_TIMEOUT_S)
                if req is None:
                    break
                reply = await asyncio.to_thread(resp.handle, req)
                writer.write(wire.send(reply))
                await writer.drain()
        except (ProtocolError, ssl.SSLError) as e:
            self.log.warning("replicator connection from %s (%s) refused: %s", peer_addr, resp.peer or "?", e)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            self.log.info("replicator connection from %s (%s) ended: %s", peer_addr, resp.peer or "?", e or "timeout")
        finally:
            writer.close()

    def _pull_back(self, peer: str, listen: str, replica_ids: list[str]) -> None:
        address = self.peers.get(peer) or listen  # a configured address first: a Hello may name any
        if not address:
            self.log.warning("pull-pull from %s: it gave no address to pull from; its half is not run", peer)
            return
        self.log.info("pull-pull: %s asked for our half; pulling %d database(s) from %s", peer, len(replica_ids),
                      address)
        ids = set(replica_ids)
        self.loop.call_soon_threadsafe(self.queue.put_nowait,
                                       (address, Mode.PULL_ONLY, ids, None, "pull-pull", peer))

    # -- the Replicator -------------------------------------------------------------------------------
    def _client_ctx(self) -> ssl.SSLContext | None:
        return self.client_tls.client_context() if self.client_tls else None

    async def session(self, address: str, mode: Mode, only: set[str] | None, expect: str | None = None) -> dict:
        """One session with the docserver at ``address`` (HOST:PORT or a --peer name), this server initiating."""
        address = self.peers.get(address, address)
        t0, started_at = time.perf_counter(), time.time()
        reader, writer = await self._connect(address)
        wire = DocWire(Side.INITIATOR)

        def pick(db: DocDB) -> bool:
            return only is None or bool({db.title, db.replica_id, str(db.path), db.path.name} & only)

        if self.tls_names:  # the responder is the server its certificate names, whatever its Hello says
            expect = _common_name(writer.get_extra_info("peercert")) or expect
        gen = initiate(self.dbs, self.name, mode, only=pick, listen=f"{self.host}:{self.port}", expect_peer=expect)
        done: list = []

        def step(reply: Any) -> Any:  # StopIteration cannot cross a thread's future: the report goes in ``done``
            try:
                return gen.send(reply)
            except StopIteration as stop:
                done.append(stop.value)
                return None

        try:
            await self._exchange(step, done, reader, writer, wire, address)
            report = done[0]
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError) as e:
            raise ConnectionLost(f"the session with {address} was cut: {e or 'timeout'}; the next session repeats "
                                 f"what was not yet applied") from None
        finally:
            gen.close()
            writer.close()
        out = report.to_dict()
        out["seconds"] = round(time.perf_counter() - t0, 3)
        out["address"] = address
        out["started_at"], out["ended_at"] = started_at, time.time()
        self.log.info("session %s with %s (%s): %s in %.3f s%s", mode.value, report.peer, address,
                      ", ".join(f"{k} {v}" for k, v in out["totals"].items()), out["seconds"],
                      "".join(f"; {d['title']}: refused: {'; '.join(d['refused'])}" for d in out["dbs"] if d["refused"]))
        self.sessions_done += 1
        return out

    async def _connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the document server at ``address`` (HOST:PORT), TLS with --tls-*, within
        CONNECT_TIMEOUT_S; ConnectionLost naming it if it cannot be reached."""
        host, port = parse_hostport(address)
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self._client_ctx()), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:
            raise ConnectionLost(f"cannot reach the document server at {address}: {e or 'timeout'}") from None

    async def _exchange(self, step: Callable[[Any], Any], done: list, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, wire: DocWire, address: str) -> None:
        """Drive the initiator until it is done (its report in ``done``): each request it yields is
        sent and its reply fed back, the generator's steps in a thread (they are database work). A
        ``Pipeline`` of requests is sent at once while a task reads their replies, which the
        generator takes as they come: one round trip for the batch, not one per request."""
        req = await asyncio.to_thread(step, None)
        while not done:
            if isinstance(req, Pipeline):  # send them all; the generator takes the replies as they come
                replies: queue.Queue = queue.Queue()
                reading = asyncio.create_task(self._read_n(reader, wire, len(req), replies, address))
                for r in req:
                    writer.write(wire.send(r))
                await writer.drain()
                req = await asyncio.to_thread(step, _replies(replies, len(req)))
                await reading
                continue
            writer.write(wire.send(req))
            await writer.drain()
            reply = await _read(reader, wire, SESSION_TIMEOUT_S)
            if reply is None:
                raise ConnectionLost(f"the document server at {address} closed the session")
            req = await asyncio.to_thread(step, reply)

    async def _read_n(self, reader, wire, n: int, out: "queue.Queue", address: str) -> None:
        """Read ``n`` replies into ``out``; a failure goes in too, for the generator's thread to raise."""
        try:
            for _ in range(n):
                reply = await _read(reader, wire, SESSION_TIMEOUT_S)
                if reply is None:
                    raise ConnectionLost(f"the document server at {address} closed the session")
                out.put(reply)
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread
            out.put(e)
            raise

    async def worker(self, i: int) -> None:
        while True:
            address, mode, only, fut, why, *expect = await self.queue.get()
            key = self.peers.get(address, address)
            while key in self.busy_peers:  # one session per peer at a time
                await asyncio.sleep(0.05)
            self.busy_peers.add(key)
            self.active[i] = f"{mode.value} with {address} ({why})"
            try:
                result = await self.session(address, mode, only, expect[0] if expect else None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
            except MultisiteError as e:
                self.log.warning("session %s with %s (%s) failed: %s", mode.value, address, why, e)
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            except Exception as e:  # noqa: BLE001 - a bug in one session must not stop the Replicator
                self.log.exception("session %s with %s failed", mode.value, address)
                if fut is not None and not fut.done():
                    fut.set_exception(MultisiteError(f"internal error: {e!r}"))
            finally:
                self.busy_peers.discard(key)
                self.active.pop(i, None)

    # -- connection documents -------------------------------------------------------------------------
    def _load_conn_state(self) -> dict:
        p = self.home / "run" / "connections.json"
        try:
            return json.loads(p.read_text()) if p.exists() else {}
        except ValueError:
            return {}

    def _save_conn_state(self) -> None:
        atomic_write(self.home / "run" / "connections.json", json.dumps(self.conn_state).encode())

    def connections(self, now: float | None = None) -> list[dict]:
        """Every connection document in the address book, with its last and next run and result."""
        if self.address_book is None:
            return []
        now = time.time() if now is None else now
        out = []
        for d in self.address_book.documents():
            if d.form != CONNECTION_FORM:
                continue
            st = self.conn_state.get(d.unid, {})
            try:
                c = schedule.parse(d.unid, d.fields)
            except ConfigError as e:
                out.append({"unid": d.unid, "error": e.message, "mine": False})
                continue
            row = c.to_dict()
            # Counted from the last run, or from when this server first saw the document.
            ref = st.get("last_run") or self.armed.setdefault(d.unid, now)
            row.update(mine=c.source == self.name, last_run=st.get("last_run"), last_result=st.get("result"),
                       runs=st.get("runs", 0),
                       next_run=schedule.next_run(c, ref, ref) if c.source == self.name else None)
            out.append(row)
        return out

    async def scheduler(self) -> None:
        while True:
            await asyncio.sleep(SCHEDULE_TICK_S)
            now = time.time()
            rows = await asyncio.to_thread(self.connections, now)
            for row in rows:
                if not row.get("mine") or row.get("next_run") is None or row["next_run"] > now:
                    continue
                unid = row["unid"]
                if self.conn_state.get(unid, {}).get("running"):
                    continue
                self.conn_state[unid] = {**self.conn_state.get(unid, {}), "running": True, "last_run": now}
                only = None if row["databases"] == "*" else set(row["databases"])
                fut = self.loop.create_future()
                self.queue.put_nowait((row["address"], Mode.parse(row["mode"]), only, fut, f"connection {unid}"))
                fut.add_done_callback(lambda f, u=unid: self._conn_done(u, f))
                self.log.info("connection %s fired: %s with %s", unid, row["mode"], row["destination"])

    def _conn_done(self, unid: str, fut: asyncio.Future) -> None:
        st = self.conn_state.setdefault(unid, {})
        st["running"] = False
        if fut.exception() is not None:
            st["result"] = f"failed: {fut.exception()}"
        else:
            st["result"] = "ok: " + ", ".join(f"{k} {v}" for k, v in fut.result()["totals"].items())
        st["runs"] = st.get("runs", 0) + 1
        self._save_conn_state()

    # -- control ----------------------------------------------------------------------------------------
    def status(self) -> dict:
        return {"name": self.name, "pid": os.getpid(), "listen": f"{self.host}:{self.port}",
                "couch_listen": f"{self.host}:{self.couch.port}" if self.couch else None,
                "replicators": self.replicators, "active": dict(self.active), "queued": self.queue.qsize(),
                "sessions_done": self.sessions_done,
                "databases": [{"title": db.title, "replica_id": rid, "db_id": db.db_id, "path": str(db.path),
                               "changeno": db.changeno} for rid, db in sorted(self.dbs.items())]}

    def _db_by(self, which: str) -> DocDB:
        for db in self.dbs.values():
            if which in (db.title, db.replica_id, str(db.path), db.path.name):
                return db
        raise ConfigError(f"server {self.name} serves no database {which!r}")

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = json.loads(await reader.readline())
            op, args = req["op"], req.get("args", {})
            result = await self._control_op(op, args)
            reply = {"ok": True, "result": result}
        except MultisiteError as e:
            reply = {"ok": False, "code": e.code, "error": e.message}
        except (ValueError, KeyError, TypeError) as e:
            reply = {"ok": False, "code": ConfigError.code, "error": f"bad control request: {e!r}"}
        writer.write((json.dumps(reply, default=str) + "\n").encode())
        try:
            await writer.drain()
            writer.close()
        except OSError:
            pass

    async def _control_op(self, op: str, args: dict) -> Any:
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "status":
            return self.status()
        if op == "shutdown":
            self._stop.set()
            return {"pid": os.getpid()}
        if op == "replicate":
            mode = Mode.parse(args.get("mode", "pull-push"))
            only = {args["db"]} if args.get("db") else None
            fut = self.loop.create_future()
            self.queue.put_nowait((args["server"], mode, only, fut, "console"))
            return await fut
        if op == "connections":
            return await asyncio.to_thread(self.connections)
        if op in docops.OPS:  # a served database's documents, edited through the server (docops.py)
            return await asyncio.to_thread(docops.run, self._db_by(args["db"]), op, args)
        raise ConfigError(f"unknown control operation {op!r}")

    # -- life -------------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, port = parse_hostport(self.listen)
        self._tls_ctx = self.tls.server_context() if self.tls else None
        try:
            srv = await self.loop.create_server(
                lambda: _PausedAtConnect(asyncio.StreamReader(limit=READ_BYTES), self.handle), self.host, port)
        except OSError as e:
            raise ConfigError(f"the document server cannot listen on {self.listen}: {e.strerror or e}") from None
        self.port = srv.sockets[0].getsockname()[1]
        if self.metrics_listen:
            from ...net.metrics import start_collector_metrics
            from .metrics import DocServerCollector
            self.metrics = await start_collector_metrics(DocServerCollector(self), self.metrics_listen, self.log)
        if self.couch_listen:
            from .couch_http import CouchServer
            self.couch = CouchServer(self, self.couch_listen, self.tls, self.couch_cors)
            await self.couch.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._stop.set)
        tasks = [asyncio.create_task(self.worker(i)) for i in range(self.replicators)]
        tasks.append(asyncio.create_task(self.scheduler()))
        self.log.info("document server %s listening on %s:%d%s, %d replicator(s), databases: %s", self.name,
                      self.host, self.port, " (mutual TLS)" if self.tls else "", self.replicators,
                      ", ".join(f"{db.title} [{rid}]" for rid, db in sorted(self.dbs.items())))
        info = {"pid": os.getpid(), "name": self.name, "listen": f"{self.host}:{self.port}",
                "log": str(self.home / "log" / "docserver.log"),
                "metrics_port": self.metrics.port if self.metrics else None,
                "couch_port": self.couch.port if self.couch else None}
        atomic_write(self.home / "run" / "docserver.json", json.dumps(info).encode())
        ctl = await asyncio.start_unix_server(self.control, path=control_address(self.home))
        for db in self.dbs.values():  # once the control socket answers: the doc commands find the server here
            record_served_by(db.path, self.home, self.name)
        try:
            await self._stop.wait()
        finally:
            for db in self.dbs.values():
                clear_served_by(db.path, self.home)
            for t in tasks:
                t.cancel()
            ctl.close()
            srv.close()
            if self.metrics:
                await self.metrics.close()
            if self.couch:
                await self.couch.close()
            for db in self.dbs.values():
                await asyncio.to_thread(db.close)
            (self.home / "run" / "docserver.json").unlink(missing_ok=True)
            self.log.info("document server %s stopped", self.name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="multisite-docserver")
    ap.add_argument("home")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--name", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--replicators", type=int, default=1)
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--address-book", default=None)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-ca")
    ap.add_argument("--tls-client-cert")
    ap.add_argument("--tls-client-key")
    ap.add_argument("--tls-names", action="store_true")
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--couch-listen", default=None)
    ap.add_argument("--couch-cors-origin", action="append", default=[])
    a = ap.parse_args(argv)
    home = Path(a.home).absolute()

    async def serve() -> None:
        peers = {}
        for p in a.peer:
            name, sep, addr = p.partition("=")
            if not sep:
                raise ConfigError(f"--peer takes NAME=HOST:PORT, got {p!r}")
            parse_hostport(addr)
            peers[name] = addr
        tls = TLSConfig.from_options(a.tls_cert, a.tls_key, a.tls_ca)
        client_tls = (TLSConfig.from_options(a.tls_client_cert, a.tls_client_key, a.tls_ca)
                      if a.tls_client_cert or a.tls_client_key else None)
        await DocServer(home, a.dirs, a.name, a.listen, a.replicators, tls, peers, a.address_book,
                        client_tls, a.tls_names, a.metrics, a.couch_listen, tuple(a.couch_cors_origin)).run()

    run_logged(home, "docserver.log", LOG_FORMAT, serve)


if __name__ == "__main__":
    main()
