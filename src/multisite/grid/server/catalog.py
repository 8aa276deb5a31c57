"""The catalog process (``python -m multisite.grid.server.catalog DIR --grid grid.toml --listen HOST:PORT``).

Thin asyncio around ``grid.catalog.Catalog``: it accepts TCP connections from containers (and from
``grid status``), feeds each message and the passing time to the Catalog with ``time.monotonic()``,
and after each event writes the state file when it changed (``fsutil.atomic_write``: a crash leaves
the old or the new placement, never a torn one), pushes ``Assignments`` to every connected container
whose shards changed, and logs the Catalog's log lines. Every decision is the Catalog's.

DIR holds ``catalog.json`` (the state), ``log/catalog.log`` and ``run/catalog.json`` (pid, address).
The control socket (``net/control.py``, named after DIR) answers ``ping``, ``status`` and ``shutdown``.

With ``--etcd`` (issue 24) the placement lives in etcd, not in DIR: this process is one of any number
of catalogs, and ``etcd_catalog.CoordinatedCatalog`` does the work (campaign, the leader's decisions,
status and routes from etcd for leader and followers alike). Containers then register in etcd, not
here: a container that sends ``Register`` is refused with the way to start it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

import msgspec

from ...errors import ConfigError, ProtocolError
from ...fsutil import atomic_write
from ..catalog import HEARTBEAT_TIMEOUT_S_DEFAULT, Catalog
from ..coordination import LEASE_TTL_S_DEFAULT
from ...ha.etcd_client import parse_urls
from ..policy import load_policy
from .etcd_catalog import CoordinatedCatalog, OperationRefused
from ..wire import (NEED_DATA, GridWire, Heartbeat, HeartbeatAck, Operate, Refused, RefusedCode, Register,
                    RouteRequest, Routes, Side, Status, StatusRequest)
from ...net.control import answer_simple, control_address
from ...net.process import run_logged
from ...net.tls import TLSConfig, parse_hostport
from .security import GridSecurity, serve

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
TICK_S = 0.1  # how often the catalog looks for silent containers
READ_BYTES = 65536
STATE_FILE = "catalog.json"


async def read_message(reader: asyncio.StreamReader, wire: GridWire):
    """The next message from the peer, or None once it closed."""
    while True:
        ev = wire.next_event()
        if ev is not NEED_DATA:
            return ev
        wire.receive_data(await reader.read(READ_BYTES))


class CatalogServer:
    def __init__(self, root: Path, grid: Path, listen: str, heartbeat_timeout_s: float,
                 metrics: str | None = None, *, etcd: list[str] | None = None, name: str | None = None,
                 lease_ttl_s: float = LEASE_TTL_S_DEFAULT, tls: TLSConfig | None = None,
                 users: Path | None = None, insecure: bool = False) -> None:
        self.metrics_listen = metrics  # net.metrics: /metrics on HOST:PORT
        self.root = root
        self.listen = listen
        self.log = logging.getLogger("multisite.catalog")
        policy = load_policy(grid)
        self.security = GridSecurity(lambda: policy.name, tls, users or root, parse_hostport(listen)[0], insecure,
                                     self.log)
        self.conns: dict[str, tuple[asyncio.StreamWriter, GridWire]] = {}
        self._stop = asyncio.Event()
        self.port = 0
        self.coord: CoordinatedCatalog | None = None
        if etcd:
            self.name = name or f"{socket.gethostname()}-{os.getpid()}"
            self.coord = CoordinatedCatalog(policy, self.name, etcd, lease_ttl_s, self.log)
            self.catalog = None
            return
        state_path = root / STATE_FILE
        try:
            state = json.loads(state_path.read_bytes()) if state_path.exists() else None
        except ValueError as e:  # atomic_write never leaves a torn file: this one was edited or damaged
            raise ConfigError(f"{state_path} is not the catalog's state (not JSON: {e}); restore it from a "
                              f"backup, or move it away to place the grid anew") from None
        self.catalog = Catalog(policy, now=time.monotonic(), heartbeat_timeout_s=heartbeat_timeout_s, state=state)
        self.sent: dict[str, tuple] = {}
        self._saved = state

    # -- after every event: persist, push, log ----------------------------------------------------
    def settle(self) -> None:
        for line in self.catalog.drain_log():
            self.log.info("%s", line)
        st = self.catalog.state_dict()
        if st != self._saved:
            atomic_write(self.root / STATE_FILE, json.dumps(st, indent=1).encode())
            self._saved = st
        for name, (writer, wire) in list(self.conns.items()):
            a = self.catalog.assignments_for(name)
            key = msgspec.msgpack.encode(a)
            if self.sent.get(name) == key:
                continue
            self.sent[name] = key
            try:
                writer.write(wire.send(a))
            except (OSError, ProtocolError) as e:
                self.log.warning("cannot send assignments to %s: %s", name, e)
                continue
            self.log.info("assignments to %s at version %d: %s", name, a.epoch,
                          ", ".join(f"p{p} {r}" for p, r in sorted(a.shards.items())) or "none")

    # -- connections ------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: a client's (or a member's) question, answered and closed, or a container's
        registration followed by its heartbeats for as long as the connection lasts."""
        wire = GridWire(Side.CATALOG)
        peer = writer.get_extra_info("peername")
        name = None
        try:
            first = await read_message(reader, wire)
            if isinstance(first, (StatusRequest, RouteRequest, Operate)):
                await self._answer(first, writer, wire)
            elif isinstance(first, Register):
                name = self._register(first, writer, wire, peer)
                if name is not None:
                    await self._heartbeats(name, reader, writer, wire)
        except ProtocolError as e:
            self.log.warning("grid connection from %s (%s) broken: %s", peer, name or "?", e)
        except (ConnectionError, OSError):
            pass
        finally:
            if name is not None and self.conns.get(name, (None,))[0] is writer:
                del self.conns[name]
                self.sent.pop(name, None)
            try:
                await writer.drain()
                writer.close()
            except OSError:
                pass

    async def _answer(self, first: StatusRequest | RouteRequest | Operate, writer: asyncio.StreamWriter,
                      wire: GridWire) -> None:
        """Answer a status, routes or operation request of a user allowed to ask it."""
        access = await self.security.client(writer, self.security.peer(writer), first.user, first.password)
        why = access if isinstance(access, tuple) else access.refusal(
            "status" if isinstance(first, StatusRequest) else "routes" if isinstance(first, RouteRequest)
            else "operate")
        if why is not None:
            writer.write(wire.send(Refused(*why)))
        elif isinstance(first, Operate):
            writer.write(wire.send(await self.operate(first.op, first.args)))
        elif isinstance(first, StatusRequest):
            writer.write(wire.send(Status(json.dumps(await self.status()))))
        else:
            table = self.coord.routes() if self.coord is not None else self.catalog.route_table()
            writer.write(wire.send(Routes(json.dumps(table.to_dict()))))

    def _register(self, first: Register, writer: asyncio.StreamWriter, wire: GridWire, peer) -> str | None:
        """Register a container on this connection (replacing an older connection of it), or refuse it:
        its name when registered, else None."""
        why = self.security.member_refusal(self.security.peer(writer), first.container, "register")
        if why is not None:  # before it registers: nothing of it reaches the catalog's decisions
            writer.write(wire.send(Refused(RefusedCode.NOT_A_MEMBER, why)))
            return None
        if self.coord is not None:
            writer.write(wire.send(Refused(RefusedCode.BAD_REQUEST, (
                f"grid {self.coord.policy.name!r} is coordinated through etcd: start the container with "
                f"--etcd {','.join(self.coord.urls)} --grid {self.coord.policy.name} (it registers in etcd, "
                f"not with a catalog)"))))
            return None
        refused = self.catalog.register(first, time.monotonic(), old_connected=first.container in self.conns)
        if refused is not None:
            self.log.warning("refused container %s from %s: %s: %s", first.container, peer, refused.code,
                             refused.message)
            writer.write(wire.send(refused))
            return None
        name = first.container
        old = self.conns.pop(name, None)
        if old is not None:
            old[0].close()
        self.conns[name] = (writer, wire)
        self.sent.pop(name, None)
        self.settle()
        return name

    async def _heartbeats(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          wire: GridWire) -> None:
        """Take a registered container's heartbeats and answer each once its currency is in the state file."""
        while True:
            msg = await read_message(reader, wire)
            if msg is None:
                self.log.info("container %s closed its connection", name)
                return
            if isinstance(msg, Heartbeat):
                if self.conns.get(name, (None,))[0] is not writer:
                    return  # a newer connection of this container replaced this one: its reports are stale
                if msg.container != name:
                    refused = Refused(RefusedCode.BAD_REQUEST, f"heartbeat for {msg.container!r} on the "
                                                               f"connection of {name!r}")
                else:
                    refused = self.catalog.heartbeat(msg, time.monotonic())
                if refused is not None:
                    writer.write(wire.send(refused))
                    return
                self.settle()  # the currency it reported is in the state file before the answer
                writer.write(wire.send(HeartbeatAck(msg.ack, self.catalog.stale_currency(name, msg.currency))))

    async def ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if self.catalog.tick(time.monotonic()):
                self.settle()

    # -- operator commands ------------------------------------------------------------------------
    async def operate(self, op: str, args: dict) -> Status | Refused:
        """``grid drain`` and ``grid promote --force``: the Catalog's decision, recorded (the state file, or
        with etcd the leader's next write) before the answer."""
        def apply(cat: Catalog, now: float) -> str:
            if op == "drain":
                return cat.drain(str(args["container"]), bool(args.get("on", True)), now)
            if op == "promote":
                return cat.force_promote(int(args["partition"]), str(args["container"]), now)
            raise ConfigError(f"unknown grid operation {op!r} (drain, promote)")
        try:
            if self.coord is not None:
                msg = await self.coord.operate(apply)
            else:
                msg = apply(self.catalog, time.monotonic())
                self.settle()
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            return Refused(RefusedCode.BAD_REQUEST, str(e))
        except OperationRefused as e:
            return Refused(e.code, e.message)
        self.log.warning("operator: %s", msg)
        return Status(json.dumps({"op": op, "message": msg}))

    # -- status and control -----------------------------------------------------------------------
    async def status(self) -> dict:
        if self.coord is not None:
            return {**await self.coord.status(), "security": self.security.status()}
        return {**self.catalog.status(time.monotonic()), "security": self.security.status()}

    def quick_status(self) -> dict:
        """Without etcd's health (the control socket's ``status`` and /metrics answer at once)."""
        if self.coord is not None:
            now = time.monotonic()
            return {**self.coord.view(now).status(now), "coordination": self.coord.coordination(),
                    "security": self.security.status()}
        return {**self.catalog.status(time.monotonic()), "security": self.security.status()}

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_simple(reader, writer, self.quick_status, self._stop)

    async def run(self) -> None:
        host, port = parse_hostport(self.listen)
        try:
            srv = await serve(self.handle, host, port, self.security)
        except OSError as e:
            raise ConfigError(f"the catalog cannot listen on {self.listen}: {e.strerror or e}") from None
        self.port = srv.port
        if self.coord is not None:
            await self.coord.start(f"{host}:{self.port}")
            pol = self.coord.policy
            self.log.info("catalog %s of grid %s (%d partitions, min_sync %d, max_sync %d, max_async %d) listening "
                          "on %s:%d, coordinated through etcd at %s", self.coord.name, pol.name, pol.partitions,
                          pol.min_sync, pol.max_sync, pol.max_async, host, self.port, ",".join(self.coord.urls))
            tick = asyncio.create_task(self.coord.run())
        else:
            self.settle()  # the restart's log lines, and the state file of a new catalog
            pol = self.catalog.policy
            self.log.info("catalog of grid %s (%d partitions, min_sync %d, max_sync %d, max_async %d) listening on "
                          "%s:%d, heartbeat timeout %g s", pol.name, pol.partitions, pol.min_sync, pol.max_sync,
                          pol.max_async, host, self.port, self.catalog.heartbeat_timeout_s)
            tick = asyncio.create_task(self.ticker())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        metrics = None
        if self.metrics_listen:
            from ...net.metrics import start_collector_metrics
            from .metrics import CatalogCollector
            metrics = await start_collector_metrics(CatalogCollector(self.quick_status), self.metrics_listen, self.log)
        info = {"pid": os.getpid(), "listen": f"{host}:{self.port}", "grid": pol.name,
                "log": str(self.root / "log" / "catalog.log"), "metrics_port": metrics.port if metrics else None,
                "name": self.coord.name if self.coord is not None else None}
        (self.root / "run" / "catalog.json").write_text(json.dumps(info))
        ctl = await asyncio.start_unix_server(self.control, path=control_address(self.root))
        try:
            await self._stop.wait()
        finally:
            tick.cancel()
            ctl.close()
            srv.close()
            if metrics:
                await metrics.close()
            for w, _ in self.conns.values():
                w.close()
            if self.coord is not None:
                await self.coord.close()
            (self.root / "run" / "catalog.json").unlink(missing_ok=True)
            self.log.info("catalog stopped at placement version %d", self.quick_status()["version"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="multisite-catalog")
    ap.add_argument("dir")
    ap.add_argument("--grid", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--heartbeat-timeout", type=float, default=HEARTBEAT_TIMEOUT_S_DEFAULT)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--etcd", default=None, help="etcd URLs: the catalogs coordinate through etcd (issue 24)")
    ap.add_argument("--name", default=None, help="this catalog's name among the grid's catalogs (with --etcd)")
    ap.add_argument("--lease-ttl", type=float, default=LEASE_TTL_S_DEFAULT)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-ca")
    ap.add_argument("--users", default=None, help="the directory of the grid's users.json (default: DIR)")
    ap.add_argument("--insecure", action="store_true")
    a = ap.parse_args(argv)
    root = Path(a.dir).absolute()
    run_logged(root, "catalog.log", LOG_FORMAT,
               lambda: CatalogServer(root, Path(a.grid), a.listen, a.heartbeat_timeout, a.metrics,
                                     etcd=parse_urls(a.etcd) if a.etcd else None, name=a.name,
                                     lease_ttl_s=a.lease_ttl,
                                     tls=TLSConfig.from_options(a.tls_cert, a.tls_key, a.tls_ca),
                                     users=Path(a.users).absolute() if a.users else None,
                                     insecure=a.insecure).run())


if __name__ == "__main__":
    main()
