"""The container process (``python -m multisite.net.grid_container DIR --catalog HOST:PORT --listen HOST:PORT``).

One process hosting many shards, each a multisite instance under DIR named ``<grid>-p<partition>``,
opened in-process with ``multisite.engine``. It registers with the catalog, heartbeats (with each open
shard's seqno, which is how the catalog learns which synchronous replicas are current), and applies
every ``Assignments``: creates or opens the instance of each assigned shard and closes those no longer
assigned (their directories stay: a shard that comes back reopens its data). Replication between a
partition's shards is not wired yet (grid/DESIGN.md, "next").

A lost connection is retried every ``RECONNECT_S`` (the catalog may be restarting). A ``Refused``
(another grid, a name in use) is final: the container logs it and exits with status 2.

DIR holds ``container.json`` (its name and grid, once a catalog accepted it: a container never
changes grid), ``log/container.log``, ``run/container.json``; the control socket answers ``ping``,
``status`` and ``shutdown``. ``--listen`` is the address the catalog (and, next, the other shards of
a partition) know it by; today it answers ``StatusRequest`` with the container's status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path

from ..engine import Database, create
from ..engine import open as open_db
from ..errors import ConfigError, ProtocolError
from ..fsutil import atomic_write
from ..grid.placement import CAPACITY_SHARDS_DEFAULT
from ..grid.wire import (GRID_WIRE_VERSION, Assignments, GridWire, Heartbeat, Refused, Register, Side, Status,
                         StatusRequest)
from .control import answer_simple, control_address
from .process import run_logged
from .grid_catalog import LOG_FORMAT, read_message
from .tls import parse_hostport

RECONNECT_S = 0.5
CONNECT_TIMEOUT_S = 5.0
IDENTITY_FILE = "container.json"
REFUSED_FILE = "refused.json"  # under run/: the catalog's last refusal


def shard_dir(root: Path, grid: str, partition: int) -> Path:
    return root / f"{grid}-p{partition}"


class ContainerServer:
    def __init__(self, root: Path, catalog: str, listen: str, zone: str | None, name: str | None,
                 grid: str | None, capacity: int) -> None:
        self.root = root
        self.catalog = catalog
        parse_hostport(catalog)
        self.listen = listen
        self.zone = zone
        self.capacity = capacity
        self.log = logging.getLogger("multisite.container")
        ident = root / IDENTITY_FILE
        known = json.loads(ident.read_bytes()) if ident.exists() else {}
        if grid and known.get("grid") and grid != known["grid"]:
            raise ConfigError(f"container {root} belongs to grid {known['grid']!r}, not {grid!r}: use another --dir")
        self.grid = grid or known.get("grid", "")
        if name and known.get("name") and name != known["name"]:
            raise ConfigError(f"container {root} is named {known['name']!r}, not {name!r}: use another --dir")
        self.name = name or known.get("name")
        self.shards: dict[int, tuple[str, Database]] = {}  # partition -> (role, open instance)
        self.applied_version = -1
        self.registered = False
        self.refused: Refused | None = None
        self.interval_s = 0.5
        self._stop = asyncio.Event()

    # -- assignments ------------------------------------------------------------------------------
    def apply(self, a: Assignments) -> None:
        """Open every assigned shard (creating it the first time), close those no longer assigned.

        Runs in a worker thread while heartbeats read ``self.shards`` on the event loop: it builds the
        new table aside and swaps it in whole, closing dropped shards only after the swap."""
        if not self.grid:
            self.grid = a.grid
        if self.grid != a.grid:
            raise ConfigError(f"catalog sent assignments of grid {a.grid!r} to a container of grid {self.grid!r}")
        self._remember()
        shards = dict(self.shards)
        dropped = [(p, *shards.pop(p)) for p in sorted(set(shards) - set(a.shards))]
        for p, role in sorted(a.shards.items()):
            if p in shards:
                if shards[p][0] != role:
                    self.log.info("shard p%d: %s -> %s", p, shards[p][0], role)
                    shards[p] = (role, shards[p][1])
                continue
            d = shard_dir(self.root, a.grid, p)
            made = not d.exists()
            if made:
                create(d, f"{a.grid}-p{p}", group=a.grid)
            shards[p] = (role, open_db(d))
            self.log.info("%s shard p%d as %s at seqno %d (%s)", "created" if made else "opened", p, role,
                          shards[p][1].seqno, d)
        self.shards = shards
        for p, role, db in dropped:
            db.close()
            self.log.info("closed shard p%d (was %s): no longer assigned here", p, role)
        self.applied_version = a.epoch
        self.interval_s = a.heartbeat_interval_s

    def _remember(self) -> None:
        ident = {"name": self.name, "grid": self.grid}
        path = self.root / IDENTITY_FILE
        if not path.exists() or json.loads(path.read_bytes()) != ident:
            atomic_write(path, json.dumps(ident).encode())

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.name, self.applied_version, {p: db.seqno for p, (_, db) in self.shards.items()})

    def status(self) -> dict:
        return {"name": self.name, "grid": self.grid, "zone": self.zone, "catalog": self.catalog,
                "registered": self.registered, "applied_version": self.applied_version, "pid": os.getpid(),
                "refused": None if self.refused is None else {"code": self.refused.code,
                                                               "message": self.refused.message},
                "shards": {str(p): {"role": r, "seqno": db.seqno, "dir": str(shard_dir(self.root, self.grid, p))}
                           for p, (r, db) in sorted(self.shards.items())}}

    # -- the catalog link -------------------------------------------------------------------------
    async def link(self) -> None:
        host, port = parse_hostport(self.catalog)
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as e:
                self.log.debug("catalog %s not reachable: %s", self.catalog, e)
                await asyncio.sleep(RECONNECT_S)
                continue
            try:
                await self._session(reader, writer)
            except ProtocolError as e:
                self.log.warning("catalog connection broken: %s", e)
            except (ConnectionError, OSError) as e:
                self.log.info("catalog connection lost: %s", e)
            finally:
                self.registered = False
                writer.close()
            if self.refused is not None:
                self._stop.set()
                return
            await asyncio.sleep(RECONNECT_S)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        wire = GridWire(Side.MEMBER)
        writer.write(wire.send(Register(GRID_WIRE_VERSION, self.grid, self.name, self.zone, self.address,
                                        self.capacity)))
        beats: asyncio.Task | None = None
        try:
            while True:
                msg = await read_message(reader, wire)
                if msg is None:
                    self.log.info("the catalog closed the connection")
                    return
                if isinstance(msg, Refused):
                    self.refused = msg
                    self.log.error("refused by the catalog %s: %s: %s", self.catalog, msg.code, msg.message)
                    # for `container start`, which reports it as the error it is
                    atomic_write(self.root / "run" / REFUSED_FILE,
                                 json.dumps({"code": msg.code, "message": msg.message}).encode())
                    return
                if isinstance(msg, Assignments):
                    if not self.registered:
                        self.log.info("registered with the catalog %s as %s (grid %s)", self.catalog, self.name,
                                      msg.grid)
                    await asyncio.get_running_loop().run_in_executor(None, self.apply, msg)
                    self.registered = True
                    writer.write(wire.send(self.heartbeat()))  # the new shards' seqnos, at once
                    if beats is None:
                        beats = asyncio.create_task(self._beat(writer, wire))
        finally:
            if beats is not None:
                beats.cancel()

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
        wire = GridWire(Side.CATALOG)
        try:
            if isinstance(await read_message(reader, wire), StatusRequest):
                writer.write(wire.send(Status(json.dumps(self.status()))))
                await writer.drain()
        except (ProtocolError, OSError):
            pass
        writer.close()

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_simple(reader, writer, self.status, self._stop)

    async def run(self) -> None:
        host, port = parse_hostport(self.listen)
        try:
            srv = await asyncio.start_server(self.answer, host, port)
        except OSError as e:
            raise ConfigError(f"the container cannot listen on {self.listen}: {e.strerror or e}") from None
        self.address = f"{host}:{srv.sockets[0].getsockname()[1]}"
        self.name = self.name or self.address
        self.log.info("container %s (zone %s) listening on %s, catalog %s", self.name, self.zone or "-",
                      self.address, self.catalog)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        (self.root / "run" / "container.json").write_text(json.dumps(
            {"pid": os.getpid(), "name": self.name, "listen": self.address,
             "log": str(self.root / "log" / "container.log")}))
        ctl = await asyncio.start_unix_server(self.control, path=control_address(self.root))
        link = asyncio.create_task(self.link())
        try:
            await self._stop.wait()
        finally:
            link.cancel()
            ctl.close()
            srv.close()
            for _, db in self.shards.values():
                db.close()
            (self.root / "run" / "container.json").unlink(missing_ok=True)
            self.log.info("container %s stopped", self.name)
        if self.refused is not None:
            raise ConfigError(f"refused by the catalog {self.catalog}: {self.refused.code}: {self.refused.message}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="multisite-container")
    ap.add_argument("dir")
    ap.add_argument("--catalog", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--zone", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--grid", default=None)
    ap.add_argument("--capacity", type=int, default=CAPACITY_SHARDS_DEFAULT)
    a = ap.parse_args(argv)
    root = Path(a.dir).absolute()
    run_logged(root, "container.log", LOG_FORMAT,
               lambda: ContainerServer(root, a.catalog, a.listen, a.zone, a.name, a.grid, a.capacity).run())


if __name__ == "__main__":
    main()
