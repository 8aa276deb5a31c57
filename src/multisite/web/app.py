"""The dashboard's server: polls its targets, keeps the last hour in memory, serves the page and ``/api``.

    multisite dashboard --listen 127.0.0.1:8080 /data/A /data/B 10.0.0.7:9100

A target is an instance directory on this machine (read through its server's control channel, plus its
instance file, ``lost/`` folder and consumer positions: everything the page shows), the address of an
instance server's ``--metrics`` endpoint (``HOST:PORT``, for instances elsewhere: role, seqno, links,
backlog and lag only), or the HOME of a document server (multi-master): its connection documents, read
through its control channel when the page asks, join the Spark work on the schedule map. Every ``interval_s`` the poller reads them all, builds the topology
(``model.topology``) and adds a point to the series; the page polls ``/api/state`` and ``/api/series``
once a second (live refresh by polling: simple, and the page keeps working through a dashboard
restart). aiohttp serves everything from the one event loop; a control call (blocking) runs in a
worker thread, bounded by ``TARGET_TIMEOUT_S``.

Access: loopback clients need no login; others get 403 unless they show ``--token`` (``?token=`` or
``Authorization: Bearer``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client.parser import text_string_to_metric_families

from ..errors import ConfigError, MultisiteError
from ..instance import consumers
from ..instance.instance_file import load as load_instance_file
from ..instance.layout import Layout
from ..journal.lostfile import LostFile, list_lost_files
from ..net import control
from ..multimaster.server.process import call as docserver_call
from ..net.tls import parse_hostport
from . import model

STATIC = Path(__file__).parent / "static"
POLL_INTERVAL_S = 1.0
TARGET_TIMEOUT_S = 2.0
log = logging.getLogger("multisite.dashboard")


@dataclass
class Target:
    key: str  # the directory or address given
    root: Path | None = None  # an instance directory
    address: str | None = None  # HOST:PORT of a metrics endpoint
    docserver: Path | None = None  # a document server's HOME: only its connection documents are shown
    status: dict[str, Any] | None = None  # the last status read
    reachable: bool = False
    error: str | None = None
    since: float = field(default_factory=time.time)


def is_docserver_home(p: Path) -> bool:
    """A document server's HOME: what ``docserver start`` leaves there (its output, its log, its run file)."""
    return any((p / f).exists() for f in ("log/docserver.out", "log/docserver.log", "run/docserver.json"))


def make_target(spec: str) -> Target:
    p = Path(spec)
    if p.is_dir():
        if not Layout(p).instance_file.exists() and is_docserver_home(p):
            return Target(spec, docserver=p.absolute())
        return Target(spec, root=Layout.existing(p).root)
    try:
        parse_hostport(spec.removeprefix("http://").rstrip("/"))
    except MultisiteError:
        raise ConfigError(f"dashboard target {spec!r} is neither an instance directory nor the HOST:PORT of an "
                          f"instance server's --metrics endpoint") from None
    return Target(spec, address=spec.removeprefix("http://").rstrip("/"))


class Dashboard:
    def __init__(self, specs: list[str], interval_s: float = POLL_INTERVAL_S, token: str | None = None):
        if not specs:
            raise ConfigError("the dashboard needs at least one instance directory or metrics address")
        if not interval_s > 0:
            raise ConfigError(f"--interval must be a number of seconds above 0, got {interval_s}")
        self.targets = [make_target(s) for s in specs]
        self.interval_s, self.token = interval_s, token
        self.series = model.Series(interval_s)
        self.state: dict[str, Any] = {"time": None, "instances": [], "links": []}
        self.polls = 0
        self._session: ClientSession | None = None

    # -- polling ---------------------------------------------------------------------------------
    async def _read(self, t: Target) -> None:
        if t.docserver is not None:
            return  # not an instance: read for the schedule map only (``schedule``)
        try:
            if t.root is not None:
                st = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                    None, lambda: control.call(t.root, "status", timeout=TARGET_TIMEOUT_S)), TARGET_TIMEOUT_S + 1)
            else:
                assert self._session is not None
                async with self._session.get(f"http://{t.address}/metrics") as r:
                    if r.status != 200:
                        raise ConfigError(f"{t.address}/metrics answered HTTP {r.status}")
                    text = await r.text()
                st = model.status_from_metrics((s.name, s.labels, s.value) for fam in
                                               text_string_to_metric_families(text) for s in fam.samples)
            if not t.reachable:
                log.info("target %s reachable (%s, %s)", t.key, st.get("name"), st.get("role"))
            t.status, t.reachable, t.error = st, True, None
        except (MultisiteError, OSError, asyncio.TimeoutError, ValueError) as e:
            if t.reachable or t.error is None:
                log.warning("target %s unreachable: %s", t.key, e)
            t.reachable, t.error = False, str(e) or type(e).__name__

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._read(t) for t in self.targets))
        topo = model.topology((t.key, t.status, t.reachable, t.error) for t in self.targets if t.docserver is None)
        now = time.time()
        self.series.add(now, topo, {t.status["name"]: t.status for t in self.targets
                                    if t.status and t.status.get("name")})
        self.state = {"time": now, "interval_s": self.interval_s, **topo}
        self.polls += 1

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # serve() polled once before starting this
            t0 = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # keep polling: one bad answer must not freeze the map
                log.exception("poll failed")
            if time.monotonic() - t0 > self.interval_s:
                log.warning("a poll took %.1f s, more than the %.1f s interval", time.monotonic() - t0,
                            self.interval_s)

    # -- what only an instance directory tells -----------------------------------------------------
    def _dir_targets(self) -> list[Target]:
        return [t for t in self.targets if t.root is not None]

    def _name(self, t: Target) -> str:
        return (t.status or {}).get("name") or t.key

    def history(self) -> dict[str, Any]:
        out = {}
        for t in self._dir_targets():
            try:
                info = load_instance_file(Layout(t.root).instance_file)
                out[self._name(t)] = [{"start_seqno": h.start_seqno, "root_primary": h.root_primary,
                                       "role": h.role, "created": h.created, "upstream": h.upstream,
                                       "stream": h.stream} for h in info.history]
            except MultisiteError as e:
                out[self._name(t)] = {"error": str(e)}
        return out

    def lost_files(self) -> dict[str, Any]:
        out = {}
        for t in self._dir_targets():
            files = []
            for p in list_lost_files(Layout(t.root).lost):
                entry: dict[str, Any] = {"file": p.name, "bytes": p.stat().st_size, "mtime": p.stat().st_mtime,
                                         "url": f"/api/lost/{self._name(t)}/{p.name}"}
                try:
                    lf = LostFile.read(p)
                    entry.update(transactions=len(lf.transactions), reason=lf.header.get("reason"),
                                 common_seqno=lf.header.get("common_seqno"))
                except MultisiteError as e:
                    entry["error"] = str(e)
                files.append(entry)
            out[self._name(t)] = files
        return out

    def lost_file(self, instance: str, name: str) -> dict[str, Any]:
        for t in self._dir_targets():
            if self._name(t) == instance:
                for p in list_lost_files(Layout(t.root).lost):
                    if p.name == name:  # only files the folder lists: no path from the request is opened
                        lf = LostFile.read(p)
                        return {"instance": instance, "file": name, "header": lf.header,
                                "transactions": [{k: v for k, v in x.items() if k != "payload"}
                                                 for x in lf.transactions]}
        raise web.HTTPNotFound(text=f"no lost-transaction file {name!r} on instance {instance!r}")

    def schedule(self) -> list[dict[str, Any]]:
        """Timed work: the Spark consumers of each instance's journal (their position files and consumer
        slots), with how far behind the instance each one is and when it last moved; and the connection
        documents of each document server given (``model.connection_rows``)."""
        out = self._connections()
        for t in self._dir_targets():
            lay = Layout(t.root)
            seqno = (t.status or {}).get("seqno")
            try:
                items = [(c.name, c.last_confirmed, c.updated, "spark stream") for c in consumers.load_all(lay)]
                info = load_instance_file(lay.instance_file)
                items += [(s.name, s.last_confirmed, s.updated, "spark export") for s in info.slots.values()
                          if s.kind == "consumer"]
            except MultisiteError as e:
                out.append({"instance": self._name(t), "error": str(e)})
                continue
            for name, confirmed, updated, kind in items:
                out.append({"instance": self._name(t), "name": name, "kind": kind, "last_confirmed": confirmed,
                            "behind": None if seqno is None else max(0, seqno - confirmed), "updated": updated})
        return out

    def _connections(self) -> list[dict[str, Any]]:
        """The connection documents the document-server targets read from their address books, with their
        last and next runs (each server computes the runs of those it fires)."""
        answers = []
        for t in self.targets:
            if t.docserver is None:
                continue
            try:
                answers.append((t.key, docserver_call(t.docserver, "connections", timeout=TARGET_TIMEOUT_S), None))
            except MultisiteError as e:
                answers.append((t.key, [], str(e)))
        return model.connection_rows(answers)

    # -- http ------------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        given = request.query.get("token")
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[7:]
        # A loopback peer naming another host is a browser's page of another site (DNS rebinding): not local.
        host = request.host.rsplit(":", 1)[0].strip("[]") if not request.host.endswith("]") else request.host[1:-1]
        local = host == "localhost" or model.access_allowed(host, None, None)
        if not model.access_allowed(request.remote if local else None, given, self.token):
            log.warning("refused %s %s from %s: not local and no valid token", request.method, request.path,
                        request.remote)
            raise web.HTTPForbidden(text="the dashboard answers loopback clients only, or clients that give its "
                                         "token (?token=... or Authorization: Bearer ...)")
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        j = web.json_response

        async def index(_r):
            return web.FileResponse(STATIC / "index.html")

        async def lost_one(r):
            return j(await asyncio.get_running_loop().run_in_executor(
                None, self.lost_file, r.match_info["instance"], r.match_info["file"]))

        async def blocking(fn):
            return j(await asyncio.get_running_loop().run_in_executor(None, fn))

        app.router.add_get("/", index)
        app.router.add_get("/api/state", lambda _r: j(self.state))
        app.router.add_get("/api/series", lambda _r: j(self.series.to_json()))
        app.router.add_get("/api/history", lambda _r: blocking(self.history))
        app.router.add_get("/api/lost", lambda _r: blocking(self.lost_files))
        app.router.add_get("/api/lost/{instance}/{file}", lost_one)
        app.router.add_get("/api/schedule", lambda _r: blocking(self.schedule))
        app.router.add_static("/static/", STATIC)
        return app

    async def serve(self, listen: str, ready=None) -> None:
        host, port = parse_hostport(listen)
        self._session = ClientSession(timeout=ClientTimeout(total=TARGET_TIMEOUT_S))
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            await self._session.close()
            raise ConfigError(f"cannot listen for the dashboard on {listen}: {e.strerror or e}") from None
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await self.poll_once()
        poller = asyncio.get_running_loop().create_task(self._poll_loop())
        log.info("dashboard on http://%s:%d/ for %s", host, bound, ", ".join(t.key for t in self.targets))
        if ready is not None:
            ready(host, bound)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            poller.cancel()
            await runner.cleanup()
            await self._session.close()
            log.info("dashboard stopped")
