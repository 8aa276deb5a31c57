"""The container process (``python -m multisite.grid.server.container DIR --catalog HOST:PORT --listen HOST:PORT``).

One process hosting many shards, each a multisite instance under DIR named ``<grid>-p<partition>``,
opened in-process with ``multisite.engine`` and driven by ``primary.PrimaryShard`` (a primary takes
commits and ships them) or ``replica.ReplicaShard`` (a replica follows its primary). It registers
with the catalog, heartbeats (each open shard's seqno, and for each primary the synchronous replicas
it counts current), and applies every ``Assignments`` in a task of its own: creates or opens each
assigned shard's instance, hands roles over (a primary finishes its batch first), and closes those
no longer assigned (their directories stay: a shard that comes back reopens its data). Every heartbeat is answered (``HeartbeatAck``); the
lease on this container's primaries runs from the sending of the last answered one.

A lost connection is retried every ``RECONNECT_S`` (the catalog may be restarting), at the next
address of ``--catalog`` when it lists several; a catalog that lost this container
(``NOT_REGISTERED``) is registered with again. Other refusals (another grid, a name in use) are
final: the container logs it and exits with status 2.

With ``--etcd`` (issue 24) there is no catalog link: ``etcd_link.EtcdLink`` registers the container
in etcd under its own lease, applies the state the leading catalog wrote there, and writes currency
reports as etcd transactions; ``lease_ok`` and ``report_currency`` are then the link's.

DIR holds ``container.json`` (its name and grid, once a catalog accepted it: a container never
changes grid), ``log/container.log``, ``run/container.json``; the control socket answers ``ping``,
``status`` and ``shutdown``. ``--listen`` (or ``--advertise``, when clients and replicas reach it
through a proxy or NAT) is the address the catalog gives clients and the other shards of its
partitions; one port takes ``grid status``, grid clients and replica subscriptions, told apart by
their first frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
import uuid
from pathlib import Path

from ...engine import Database, create
from ...engine import open as open_db
from ...errors import ConfigError, MultisiteError, ProtocolError
from ...fsutil import atomic_write
from ..placement import CAPACITY_SHARDS_DEFAULT
from ..shard_wire import FIRST_TYPES, DataWire, Failed, FailCode, Open, Subscribe, encode
from ..shipping import CHECKPOINT_AFTER_DEFAULT
from ..wire import (GRID_WIRE_VERSION, Assignments, GridWire, Heartbeat, HeartbeatAck, Refused, RefusedCode, Register,
                    Side, Status, StatusRequest, View)
from .loader_runner import ShardLoader, make_loader
from ...net.control import answer_simple, control_address
from ...net.process import run_logged
from .catalog import LOG_FORMAT, read_message
from ..coordination import LEASE_TTL_S_DEFAULT
from .etcd_link import EtcdLink
from .hosted import Shard
from .client_sessions import serve_client
from .replica import restore_interrupted_swap
from .shard import read_into
from ...net.tls import TLSConfig, parse_hostport
from .security import CLOSED_AFTER_TLS, CLOSES_BEFORE_REFUSED, GridSecurity, certificate_refused, serve
from ...ha.etcd_client import parse_urls

RECONNECT_S = 0.5
CONNECT_TIMEOUT_S = 5.0
IDENTITY_FILE = "container.json"
REFUSED_FILE = "refused.json"  # under run/: the catalog's last refusal


def shard_dir(root: Path, grid: str, partition: int) -> Path:
    return root / f"{grid}-p{partition}"


def _identity(root: Path, grid: str | None, name: str | None) -> tuple[str, str | None, str]:
    """The grid, name and DIR id of the container in ROOT: those it was given, checked against those its
    ``container.json`` remembers (a container never changes grid or name), or new ones."""
    ident = root / IDENTITY_FILE
    known = json.loads(ident.read_bytes()) if ident.exists() else {}
    if grid and known.get("grid") and grid != known["grid"]:
        raise ConfigError(f"container {root} belongs to grid {known['grid']!r}, not {grid!r}: use another --dir")
    if name and known.get("name") and name != known["name"]:
        raise ConfigError(f"container {root} is named {known['name']!r}, not {name!r}: use another --dir")
    # dir_id: who this DIR is, across restarts and renames
    return grid or known.get("grid", ""), name or known.get("name"), known.get("dir_id") or uuid.uuid4().hex


class ContainerServer:
    def __init__(self, root: Path, catalog: str, listen: str, zone: str | None, name: str | None,
                 grid: str | None, capacity: int, *, checkpoint_after: int = CHECKPOINT_AFTER_DEFAULT,
                 advertise: str | None = None, metrics: str | None = None, etcd: list[str] | None = None,
                 lease_ttl_s: float = LEASE_TTL_S_DEFAULT, tls: TLSConfig | None = None,
                 users: Path | None = None, insecure: bool = False) -> None:
        self.metrics_listen, self.metrics = metrics, None  # net.metrics: /metrics on HOST:PORT
        self.root = root
        self.advertise = advertise  # the address the catalog gives clients and replicas (a proxy, a NAT)
        if advertise:
            parse_hostport(advertise)
        self.checkpoint_after = checkpoint_after
        self.catalog = catalog or ""
        self.catalogs = [c.strip() for c in self.catalog.split(",") if c.strip()]  # tried in turn
        for c in self.catalogs:
            parse_hostport(c)
        self.etcd_urls, self.lease_ttl_s = etcd, lease_ttl_s
        self.etcd: EtcdLink | None = None  # made in run(), once the name is known
        if not self.catalogs and not etcd:
            raise ConfigError("a container needs --catalog HOST:PORT[,HOST:PORT...] or --etcd URLS")
        self.listen = listen
        self.zone = zone
        self.capacity = capacity
        self.log = logging.getLogger("multisite.container")
        self.grid, self.name, self.dir_id = _identity(root, grid, name)
        if etcd and not self.grid:
            raise ConfigError(f"a new container with --etcd needs --grid NAME (the grid whose keys it joins in etcd); "
                              f"{root} has not joined one yet")
        self.security = GridSecurity(lambda: self.grid, tls, users or root, parse_hostport(listen)[0], insecure,
                                     self.log)
        if tls is not None:  # its certificate names it: other members take it by that name only
            if self.name and self.name != self.security.name:
                raise ConfigError(f"container {root} is named {self.name!r}, its certificate names "
                                  f"{self.security.name!r}: a member's name is its certificate's common name")
            self.name = self.security.name
        self.shards: dict[int, Shard] = {}
        self.applied_version = -1
        self.registered = False
        self.refused: Refused | None = None
        self.interval_s = 0.5
        self.timeout_s = 3.0
        # The lease on primaries runs from the *sending* of the last heartbeat the catalog answered: the
        # catalog heard it no earlier, and loses this container heartbeat_timeout_s after hearing it.
        self.last_answer = 0.0
        self._sent: dict[int, float] = {}  # heartbeat ack id -> when it was sent
        self._reports: dict[int, dict] = {}  # heartbeat ack id -> the currency it reported
        self._stop = asyncio.Event()
        self._link: tuple[asyncio.StreamWriter, GridWire] | None = None
        self._acks: dict[int, asyncio.Future] = {}
        self._next_ack = 1
        self._assign_lock = asyncio.Lock()
        self._report_task: asyncio.Task | None = None
        self._partitions = 0
        self._pending: Assignments | None = None
        self._applier: asyncio.Task | None = None  # with a catalog: the task applying its Assignments
        self._link_task: asyncio.Task | None = None  # with etcd: EtcdLink.run, which applies the state itself
        self.loader_maps: dict[str, dict] = {}

    # -- assignments ------------------------------------------------------------------------------
    async def apply(self, a: Assignments) -> None:
        """Take each assigned shard in its role (creating its instance the first time), stop those no
        longer assigned (their data stays), and hand role changes over: a primary that becomes a
        replica finishes its batch in hand first."""
        async with self._assign_lock:
            if not self.grid:
                self.grid = a.grid
            if self.grid != a.grid:
                raise ConfigError(f"catalog sent assignments of grid {a.grid!r} to a container of grid {self.grid!r}")
            self.loader_maps = a.loaders  # issue 16: the maps' write-through loader (new primaries take it)
            self._remember()
            loop = asyncio.get_running_loop()
            for p in sorted(set(self.shards) - set(a.shards)):
                sh = self.shards.pop(p)
                await sh.close()
                self.log.info("closed shard p%d (was %s): no longer assigned here", p, sh.role)
            for p, role in sorted(a.shards.items()):
                view = a.views.get(p) or View(a.epoch, None, None, [], [], 0)
                sh = self.shards.get(p)
                if sh is None:
                    sh = await loop.run_in_executor(None, self._open, a.grid, p, role)
                    self.shards[p] = sh
                await sh.take(role, view)
            self.applied_version = a.epoch
            self.interval_s = a.heartbeat_interval_s
            self.timeout_s = a.heartbeat_timeout_s
            self._partitions = a.partitions

    def _open(self, grid: str, p: int, role: str) -> "Shard":
        d = shard_dir(self.root, grid, p)
        restore_interrupted_swap(d)
        made = not d.exists()
        if made:
            create(d, f"{grid}-p{p}", group=grid, durability="group")
        db = open_db(d)
        self.log.info("%s shard p%d at seqno %d (%s)", "created" if made else "opened", p, db.seqno, d)
        return Shard(self, p, d, db)

    def _remember(self) -> None:
        ident = {"name": self.name, "grid": self.grid, "dir_id": self.dir_id}
        path = self.root / IDENTITY_FILE
        if not path.exists() or json.loads(path.read_bytes()) != ident:
            atomic_write(path, json.dumps(ident).encode())

    # -- what shards ask of the container ---------------------------------------------------------
    def lease_ok(self) -> bool:
        """A primary commits only while the catalog answered within 3/4 of the heartbeat timeout:
        past the timeout the catalog may have promoted another primary. With etcd: while the
        container's own lease holds (``EtcdLink.lease_ok``)."""
        if self.etcd is not None:
            return self.etcd.lease_ok()
        return self.registered and time.monotonic() - self.last_answer < 0.75 * self.timeout_s

    def currency(self) -> dict[int, tuple[int, list[str]]]:
        return {p: (sh.primary.epoch, sorted(sh.primary.sync.current)) for p, sh in self.shards.items()
                if sh.primary is not None}

    async def report_currency(self) -> set[int]:
        """Send the primaries' current sets and wait until the catalog recorded them; the partitions
        the catalog says this container no longer leads at the reported epoch (deposed)."""
        if self.etcd is not None:
            return await self.etcd.report_currency()
        while True:
            if self._link is not None:
                writer, wire = self._link
                fut = asyncio.get_running_loop().create_future()
                beat = self.heartbeat()
                ack = beat.ack
                self._acks[ack] = fut
                try:
                    writer.write(wire.send(beat))
                    stale = set(await asyncio.wait_for(fut, self.timeout_s))
                    return stale
                except (TimeoutError, OSError, ProtocolError):
                    pass
                finally:
                    self._acks.pop(ack, None)
            await asyncio.sleep(RECONNECT_S)

    def report_currency_soon(self) -> None:
        """A replica counts current again: tell the catalog without waiting (wider is safe later)."""
        if self.etcd is not None:
            self.etcd.report_currency_soon()
            return
        if self._report_task is None or self._report_task.done() or self._report_task.cancelled():
            self._report_task = asyncio.create_task(self.report_currency())

    def shard_loader(self, p: int):
        """A new primary's Loader (issue 16), None when no map has one."""
        loader = make_loader(self.loader_maps)
        return ShardLoader(p, loader, self.loader_maps) if loader is not None else None

    def shard_reopened(self, p: int, db: Database) -> None:
        sh = self.shards.get(p)
        if sh is not None:
            sh.db = db

    def heartbeat(self) -> Heartbeat:
        """The next heartbeat, numbered: its answer extends the lease (``last_answer``). Its currency
        report counts, for each primary, as what the catalog may hold until the answer comes."""
        ack = self._next_ack
        self._next_ack += 1
        self._sent[ack] = time.monotonic()
        currency = self.currency()
        for p, (_, names) in currency.items():
            self.shards[p].primary.lease.sent(ack, frozenset(names))
        self._reports[ack] = currency
        return Heartbeat(self.name, self.applied_version, self.seqnos(), currency, ack, self.loader_report())

    def seqnos(self) -> dict[int, int]:
        """Each shard's seqno: a primary's last committed one, not one of a batch still being voted on."""
        return {p: sh.primary.committed if sh.primary is not None else sh.db.seqno for p, sh in self.shards.items()}

    def refuse(self, msg: Refused) -> None:
        """Refused for good (another grid, a name in use): log it, keep it for ``container start``, stop."""
        self.refused = msg
        self.log.error("refused: %s: %s", msg.code, msg.message)
        atomic_write(self.root / "run" / REFUSED_FILE, json.dumps({"code": msg.code, "message": msg.message}).encode())
        self._stop.set()

    def loader_report(self) -> dict[int, dict]:
        """Issue 16: each shard's Loader state (a primary) or protocol buffer (a replica), for grid status."""
        out: dict[int, dict] = {}
        for p, sh in self.shards.items():
            if sh.primary is not None and sh.primary.loader is not None:
                st = sh.primary.loader.status()
                out[p] = {k: st[k] for k in ("state", "database", "applied", "refused", "replayed", "last_error")}
            elif sh.replica is not None and sh.replica.buffer is not None:
                out[p] = {"buffered": sh.replica.buffer.status()["buffered"]}
        return out

    def _answered(self, msg: HeartbeatAck) -> None:
        """The catalog recorded heartbeat ``msg.ack`` (and, answering in order, every earlier one)."""
        for a in [a for a in self._reports if a < msg.ack]:
            del self._reports[a]
        for p, (epoch, names) in self._reports.pop(msg.ack, {}).items():
            sh = self.shards.get(p)
            if sh is None or sh.primary is None or sh.primary.epoch != epoch:
                continue
            sh.primary.lease.answered(msg.ack, frozenset(names), p in msg.stale)

    def status(self) -> dict:
        return {"name": self.name, "grid": self.grid, "zone": self.zone, "catalog": self.catalog,
                "registered": self.registered, "applied_version": self.applied_version, "pid": os.getpid(),
                "lease_ok": self.lease_ok(), "dir_id": self.dir_id, "security": self.security.status(),
                "coordination": self.etcd.status() if self.etcd is not None else {"mode": "catalog",
                                                                                    "catalogs": self.catalogs},
                "refused": None if self.refused is None else {"code": self.refused.code,
                                                               "message": self.refused.message},
                "shards": {str(p): sh.status() for p, sh in sorted(self.shards.items())},
                "applying": _where(self._applier if self.etcd is None else self._link_task)}

    # -- the catalog link -------------------------------------------------------------------------
    async def link(self) -> None:
        turn = silent = 0  # silent: sessions in a row the catalog closed after TLS without a word
        while not self._stop.is_set():
            self.catalog = self.catalogs[turn % len(self.catalogs)]
            host, port = parse_hostport(self.catalog)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.security.client_ssl), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as e:
                if certificate_refused(e):  # a verdict on a certificate, not a network blip: final
                    self.refuse(Refused(RefusedCode.NOT_A_MEMBER, f"TLS with the catalog {self.catalog} refused a "
                                                                  f"certificate: {getattr(e, 'reason', None) or e}"))
                    return
                self.log.debug("catalog %s not reachable: %s", self.catalog, e)
                turn += 1
                await asyncio.sleep(RECONNECT_S / len(self.catalogs))
                continue
            try:
                if await self._session(reader, writer) or self.security.tls is None:
                    silent = 0
                else:
                    silent += 1
                    if silent >= CLOSES_BEFORE_REFUSED:
                        self.refuse(Refused(RefusedCode.NOT_A_MEMBER, f"the catalog {self.catalog}: "
                                                                      f"{CLOSED_AFTER_TLS}"))
            except ProtocolError as e:
                self.log.warning("catalog connection broken: %s", e)
            except (ConnectionError, OSError) as e:
                if certificate_refused(e):  # TLS 1.3: the catalog's verdict on our certificate comes after
                    self.refuse(Refused(RefusedCode.NOT_A_MEMBER, f"the catalog {self.catalog} refused this "
                                                                  f"container's certificate: "
                                                                  f"{getattr(e, 'reason', None) or e}"))
                else:
                    self.log.info("catalog connection lost: %s", e)
            finally:
                self.registered = False
                self._link = None
                writer.close()
            if self.refused is not None:
                self._stop.set()
                return
            await asyncio.sleep(RECONNECT_S)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One session with the catalog; whether the catalog said anything at all."""
        wire = GridWire(Side.MEMBER)
        heard = False
        writer.write(wire.send(Register(GRID_WIRE_VERSION, self.grid, self.name, self.zone, self.address,
                                        self.capacity)))
        beats: asyncio.Task | None = None
        try:
            while True:
                msg = await read_message(reader, wire)
                if msg is None:
                    self.log.info("the catalog closed the connection")
                    return heard
                heard = True
                if isinstance(msg, Refused) and msg.code == RefusedCode.NOT_REGISTERED:
                    # the catalog counted this container lost (silent past its timeout, e.g. a long first
                    # apply under load): a new session registers it again; only the other refusals are final
                    self.log.warning("the catalog %s lost this container: %s; registering again", self.catalog,
                                     msg.message)
                    return heard
                if isinstance(msg, Refused):
                    self.refused = msg
                    self.log.error("refused by the catalog %s: %s: %s", self.catalog, msg.code, msg.message)
                    # for `container start`, which reports it as the error it is
                    atomic_write(self.root / "run" / REFUSED_FILE,
                                 json.dumps({"code": msg.code, "message": msg.message}).encode())
                    return heard
                if isinstance(msg, HeartbeatAck):
                    sent = self._sent.pop(msg.ack, None)
                    if sent is not None:
                        self.last_answer = max(self.last_answer, sent)
                    for old in [a for a in self._sent if a < msg.ack]:
                        del self._sent[old]
                    self._answered(msg)
                    fut = self._acks.get(msg.ack)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.stale)
                elif isinstance(msg, Assignments):
                    # Applied by a task of its own: a primary handing its role over finishes its batch
                    # first, and that batch may wait for a HeartbeatAck this loop must go on reading.
                    self._link = (writer, wire)
                    self._pending = msg
                    if self._applier is None or self._applier.done():
                        self._applier = asyncio.create_task(self._apply_pending(writer, wire))
                    if beats is None:
                        beats = asyncio.create_task(self._beat(writer, wire))
        finally:
            if beats is not None:
                beats.cancel()

    async def _apply_pending(self, writer: asyncio.StreamWriter, wire: GridWire) -> None:
        """Apply the newest Assignments until none is left (those overtaken are skipped)."""
        while self._pending is not None:
            a, self._pending = self._pending, None
            try:
                await self.apply(a)
            except MultisiteError as e:
                self.log.error("cannot apply the assignments of version %d: %s", a.epoch, e)
                writer.close()
                return
            if not self.registered:
                self.log.info("registered with the catalog %s as %s (grid %s)", self.catalog, self.name, a.grid)
            self.registered = True
            try:
                writer.write(wire.send(self.heartbeat()))  # the new shards' seqnos, at once
            except (OSError, ProtocolError):
                return

    async def _beat(self, writer: asyncio.StreamWriter, wire: GridWire) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                writer.write(wire.send(self.heartbeat()))
                await writer.drain()
        except (ConnectionError, OSError, ProtocolError):
            pass  # the reading side sees the end of the connection and reconnects

    # -- the listening side and control -----------------------------------------------------------
    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection to ``--listen``: ``grid status`` (a StatusRequest), a grid client (Open) or a
        replica shard (Subscribe), told apart by the first frame's type."""
        try:
            head = await reader.readexactly(5)
            if head[4] in FIRST_TYPES:
                wire = DataWire(server=True)
                wire.receive_data(head)
                first = await read_into(reader, wire)
                if isinstance(first, Open):
                    await serve_client(self, first, reader, writer, wire)
                elif isinstance(first, Subscribe):
                    await self._subscriber(first, reader, writer, wire)
                return
            gw = GridWire(Side.CATALOG)
            gw.receive_data(head)
            ask = await read_message(reader, gw)
            if isinstance(ask, StatusRequest):
                access = await self.security.client(writer, self.security.peer(writer), ask.user, ask.password)
                why = access if isinstance(access, tuple) else access.refusal("status")
                writer.write(gw.send(Refused(*why) if why else Status(json.dumps(self.status()))))
                await writer.drain()
        except (ProtocolError, OSError, asyncio.IncompleteReadError) as e:
            self.log.debug("connection on %s ended: %s", self.address, e)
        finally:
            writer.close()

    async def _subscriber(self, sub: Subscribe, reader, writer, wire: DataWire) -> None:
        sh = self.shards.get(sub.partition)
        why = self.security.member_refusal(self.security.peer(writer), sub.replica, "subscribe")
        if why is not None:
            writer.write(encode(Failed(0, FailCode.NOT_A_MEMBER, why)))
        elif sub.grid != self.grid:
            writer.write(encode(Failed(0, FailCode.WRONG_GRID, f"this container is of grid {self.grid!r}, the "
                                                               f"replica of grid {sub.grid!r}")))
        elif sh is None or sh.primary is None:
            writer.write(encode(Failed(0, FailCode.NOT_PRIMARY, f"{self.name} holds no primary of partition "
                                                                f"{sub.partition}")))
        else:
            await sh.primary.feeds.serve(sub, reader, writer, wire)
        await writer.drain()

    @property
    def partitions(self) -> int:
        return self._partitions

    def _link_ended(self, task: asyncio.Task) -> None:
        """The link to the catalog (or etcd) ended: by a refusal or a shutdown, or by an error that would
        leave this container serving a placement it no longer follows; then it stops, saying why."""
        if task.cancelled() or task.exception() is None:
            return
        e = task.exception()
        self.log.error("container %s: its link to the grid failed (%s: %s); stopping", self.name,
                       type(e).__name__, e, exc_info=e)
        self._stop.set()

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_simple(reader, writer, self.status, self._stop)

    async def run(self) -> None:
        host, port = parse_hostport(self.listen)
        try:
            srv = await serve(self.answer, host, port, self.security)
        except OSError as e:
            raise ConfigError(f"the container cannot listen on {self.listen}: {e.strerror or e}") from None
        self.address = self.advertise or f"{host}:{srv.port}"
        self.name = self.name or self.address
        self.log.info("container %s (zone %s) listening on %s, %s", self.name, self.zone or "-", self.address,
                      f"etcd {','.join(self.etcd_urls)}, grid {self.grid}" if self.etcd_urls
                      else f"catalog {self.catalog}")
        if self.etcd_urls:
            self._remember()  # its DIR's identity, before its registration names it
            self.etcd = EtcdLink(self, self.etcd_urls, self.lease_ttl_s)
            try:
                await self.etcd.check()
            except ConfigError:
                srv.close()
                raise
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        if self.metrics_listen:
            from ...net.metrics import start_collector_metrics
            from .metrics import ContainerCollector
            self.metrics = await start_collector_metrics(ContainerCollector(self), self.metrics_listen, self.log)
        (self.root / "run" / "container.json").write_text(json.dumps(
            {"pid": os.getpid(), "name": self.name, "listen": self.address,
             "log": str(self.root / "log" / "container.log"),
             "metrics_port": self.metrics.port if self.metrics else None}))
        ctl = await asyncio.start_unix_server(self.control, path=control_address(self.root))
        if self.etcd is not None:
            link = asyncio.create_task(self.etcd.run())
        else:
            link = asyncio.create_task(self.link())
        self._link_task = link
        link.add_done_callback(self._link_ended)
        try:
            await self._stop.wait()
        finally:
            link.cancel()
            ctl.close()
            srv.close()
            if self.metrics:
                await self.metrics.close()
            for sh in self.shards.values():
                await sh.close()
            if self.etcd is not None:
                await self.etcd.close()
            (self.root / "run" / "container.json").unlink(missing_ok=True)
            self.log.info("container %s stopped", self.name)
        if self.refused is not None:
            by = f"etcd ({','.join(self.etcd_urls)})" if self.etcd_urls else f"the catalog {self.catalog}"
            raise ConfigError(f"refused by {by}: {self.refused.code}: {self.refused.message}")


def _where(task: asyncio.Task | None) -> list[str] | None:
    """Where a running task waits (its chain of awaits), for status: a stuck hand-over shows here."""
    if task is None or task.done():
        return None
    out, coro = [], task.get_coro()
    while coro is not None and hasattr(coro, "cr_frame"):
        f = coro.cr_frame
        if f is not None:
            out.append(f"{f.f_code.co_name} ({f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno})")
        coro = getattr(coro, "cr_await", None)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="multisite-container")
    ap.add_argument("dir")
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--etcd", default=None)
    ap.add_argument("--lease-ttl", type=float, default=LEASE_TTL_S_DEFAULT)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-ca")
    ap.add_argument("--users", default=None, help="the directory of the grid's users.json (default: DIR)")
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--listen", required=True)
    ap.add_argument("--zone", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--grid", default=None)
    ap.add_argument("--capacity", type=int, default=CAPACITY_SHARDS_DEFAULT)
    ap.add_argument("--advertise", default=None, help="HOST:PORT clients and replicas reach this container at "
                                                      "(default: the --listen address)")
    ap.add_argument("--checkpoint-after", type=int, default=CHECKPOINT_AFTER_DEFAULT,
                    help="a new or returning replica further behind than this many transactions copies a checkpoint")
    ap.add_argument("--metrics", default=None, help="serve Prometheus metrics on HOST:PORT/metrics")
    a = ap.parse_args(argv)
    root = Path(a.dir).absolute()
    run_logged(root, "container.log", LOG_FORMAT,
               lambda: ContainerServer(root, a.catalog, a.listen, a.zone, a.name, a.grid, a.capacity,
                                       checkpoint_after=a.checkpoint_after, advertise=a.advertise,
                                       metrics=a.metrics, etcd=parse_urls(a.etcd) if a.etcd else None,
                                       lease_ttl_s=a.lease_ttl,
                                       tls=TLSConfig.from_options(a.tls_cert, a.tls_key, a.tls_ca),
                                       users=Path(a.users).absolute() if a.users else None,
                                       insecure=a.insecure).run())


if __name__ == "__main__":
    main()
