"""``multisite.serve(DIR, listen=...)``: the instance server inside the application's own process.

For applications that want embedded speed and replication together. The handle's ``db`` is the
``Database`` the instance server owns: calls on it are the embedded engine's (no socket, no
copy), and its commits share the journal and its fdatasyncs with the client connections' group
commits. Beside it run what ``multisite server start`` runs in a process of its own: the client
listener on ``listen`` (if given) and the control socket, so that the replication components are
started with the CLI against the instance as usual (``multisite source start DIR ...``,
``receiver start``, ``update start``, ``status``). The server's loop runs in a thread of its own.

    with multisite.serve("/data/A", listen="127.0.0.1:7000") as srv:
        srv.db.create_region("acct")
        with srv.db.transaction() as tx:
            tx.set("acct", ("a", 1), {"n": 1})
        srv.address                              # "127.0.0.1:7000": multisite.connect(srv.address)

Stop it with ``close()`` (or the end of the ``with`` block), not ``multisite server stop``, which
waits for the server's process to exit: here that is the application's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from pathlib import Path

from ..errors import ServerError
from ..fsutil import create_file
from ..instance.layout import Layout
from .sockets import KEEPALIVE_S, check_keepalive
from .instance import LOG_FORMAT, InstanceServer
from ..net.tls import TLSConfig, parse_hostport

START_TIMEOUT_S = 60.0  # recovery on open runs first; a large journal takes a while
_served = itertools.count(1)  # numbers the loggers of instances served in this process


def _close_logs(log: logging.Logger) -> None:
    """Close the log files of a served instance: its server.log and its components' (update.log...)."""
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and (name == log.name or name.startswith(log.name + ".")):
            for h in list(lg.handlers):
                lg.removeHandler(h)
                h.close()


def _stop(server: InstanceServer, thread: threading.Thread, timeout_s: float) -> None:
    """Stop a served instance's server (if it runs) and close its log files."""
    loop = getattr(server, "loop", None)
    if thread.is_alive() and loop is not None:
        server._stop_timeout_s = timeout_s
        try:
            loop.call_soon_threadsafe(server._stop.set)
        except RuntimeError:  # its loop already closed: the server stopped (it failed), its thread ends
            pass
        thread.join()
    _close_logs(server.log)


class Served:
    """An instance served in this process: ``db``, ``address`` (None without ``listen``), ``close()``."""

    def __init__(self, server: InstanceServer, thread: threading.Thread, handler: logging.Handler):
        self._server, self._thread, self._handler = server, thread, handler
        self.db = server.db
        self.root = server.root
        port = server.client_port
        self.address: str | None = None
        if port is not None and server.listen:
            host, _ = parse_hostport(server.listen)
            self.address = f"{host}:{port}"

    @property
    def clients(self) -> int:
        """Client connections open now."""
        return self._server.clients.connections if self._server.clients else 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the replication components (sources send what is pending within ``timeout_s``), the
        client listener (transactions in flight end first) and close the instance."""
        _stop(self._server, self._thread, timeout_s)

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<multisite.Served {self.root} at {self.address}>"


def serve(path: str | os.PathLike, listen: str | None = None, *, keepalive_s: int = KEEPALIVE_S,
          tls: TLSConfig | None = None, insecure: bool = False) -> Served:
    """Open the instance at ``path`` and serve it from this process (see the module's text). ``tls``
    and ``insecure`` are the client port's, as ``multisite server start``'s (``server.client_auth``)."""
    root = Layout.existing(Path(path).absolute()).root
    if listen:
        parse_hostport(listen)  # a wrong address is an error here, in the caller's thread
    check_keepalive(keepalive_s)
    handler = logging.FileHandler(create_file(root / "log" / "server.log"))
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    # A logger of its own (and its components' below it): two instances served in one process must
    # not write into each other's logs, as they did through the one "multisite" logger.
    log = logging.getLogger(f"multisite.serve.{next(_served)}")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    server = InstanceServer(root, listen, keepalive_s, tls, insecure)
    server.log = log
    server.in_process = True  # `server stop` then waits for the server, not for this process to exit
    failed: list[BaseException] = []

    def run() -> None:
        async def main() -> None:
            server.loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
            await server.run()

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - handed to the caller of serve()
            failed.append(e)
        finally:
            server.ready.set()

    th = threading.Thread(target=run, name=f"multisite-serve-{root.name}", daemon=True)
    th.start()
    if not server.ready.wait(START_TIMEOUT_S):
        # The caller is told it failed: the server, once up, must not go on serving the instance unseen.
        threading.Thread(target=lambda: server.ready.wait() and _stop(server, th, 5.0),
                         name=f"multisite-serve-abandon-{root.name}", daemon=True).start()
        raise ServerError(f"the instance server for {root} did not start within {START_TIMEOUT_S:.0f} s")
    if failed or not th.is_alive():
        th.join()
        _close_logs(log)
        if failed:
            raise failed[0]
        raise ServerError(f"the instance server for {root} stopped at start; see {root / 'log' / 'server.log'}")
    return Served(server, th, handler)

