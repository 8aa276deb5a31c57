"""Connections that never log in, and a timed login beside them: what an instance server's client port
must survive (``protocol/admission.py``), for tests and ``bench/login_flood.py``.

``Flood`` holds connections to a client port from one local address from a thread of its own (one
``selectors`` loop): it opens them all, says nothing on them, and, with ``reopen_per_s``, opens again
the ones the server closes (refused at accept, closed at the login deadline), at most that many a
second, as a persistent attacker would. ``login`` times one client's login from another local
address: on loopback every 127.x.y.z is a different client host to the server.

    python -m multisite.testing.flood 127.0.0.1:7000 --connections 1000 --reopen-per-s 200

runs a flood until interrupted (a process of its own, as the bench uses it), printing what it holds.
"""

from __future__ import annotations

import argparse
import errno
import selectors
import signal
import socket
import threading
import time

from ..errors import ConnectionLost
from ..net.tls import parse_hostport
from ..protocol.client import FrameBuffer, encode
from ..server.client import result_of

READ_BYTES = 4096
TICK_S = 0.05  # how often the flood's loop looks for connections to open again


def login(address: str, user: str, password: str, *, source: str | None = None, timeout_s: float = 30.0) -> float:
    """Connect to the client port at ``address`` from ``source`` (a local address, e.g. 127.0.0.2), say
    hello with ``user`` and ``password`` and read the answer: the seconds from the connect to the
    answer. The server's refusal is raised as its error class; a closed connection as ConnectionLost."""
    host, port = parse_hostport(address)
    t0 = time.perf_counter()
    with socket.create_connection((host, port), timeout=timeout_s,
                                  source_address=(source, 0) if source else None) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(encode([1, "hello", {"user": user, "password": password}]))
        buf = FrameBuffer()
        while (msg := buf.next()) is None:
            data = s.recv(READ_BYTES)
            if not data:
                raise ConnectionLost(f"the instance server at {address} closed the connection before its answer")
            buf.feed(data)
        result_of(msg)
    return time.perf_counter() - t0


class Flood:
    """``connections`` connections to ``address`` from ``source`` that never log in (see the module doc)."""

    def __init__(self, address: str, connections: int, *, source: str = "127.0.0.1", reopen_per_s: float = 0.0):
        self.host, self.port = parse_hostport(address)
        self.connections, self.source, self.reopen_per_s = connections, source, reopen_per_s
        self.opened = 0  # connects made
        self.closed_by_server = 0  # of those, ended by the server (refused at accept, deadline, eviction)
        self.failed = 0  # connects that failed at once (ports, file descriptors)
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self.ready = threading.Event()  # set once every connection was opened once

    @property
    def held(self) -> int:
        """Connections open on this side now (the server may have closed some not yet seen here)."""
        return len(self._sel.get_map())

    def start(self) -> "Flood":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()

    def __enter__(self) -> "Flood":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open(self) -> None:
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setblocking(False)
            s.bind((self.source, 0))
            err = s.connect_ex((self.host, self.port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, errno.errorcode.get(err, str(err)))
        except OSError:
            s.close()
            self.failed += 1
            return
        self.opened += 1
        self._sel.register(s, selectors.EVENT_READ)

    def _run(self) -> None:
        for _ in range(self.connections):
            if self._stop.is_set():
                return
            self._open()
        self.ready.set()
        allowance, last = 0.0, time.monotonic()
        while not self._stop.is_set():
            for key, _ in self._sel.select(TICK_S):
                s = key.fileobj
                try:
                    gone = not s.recv(READ_BYTES)  # a refusal's answer, then the end; or the end
                except BlockingIOError:
                    continue
                except OSError:
                    gone = True
                if gone:
                    self._sel.unregister(s)
                    s.close()
                    self.closed_by_server += 1
            now = time.monotonic()
            allowance = min(float(self.connections), allowance + (now - last) * self.reopen_per_s)
            last = now
            while allowance >= 1 and self.held < self.connections and not self._stop.is_set():
                allowance -= 1
                self._open()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m multisite.testing.flood", description=__doc__.split("\n\n")[0])
    ap.add_argument("address", help="HOST:PORT of the client port")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--source", default="127.0.0.1", help="the local address the connections come from")
    ap.add_argument("--reopen-per-s", type=float, default=0.0,
                    help="open again at most this many a second of those the server closes")
    a = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Flood(a.address, a.connections, source=a.source, reopen_per_s=a.reopen_per_s) as f:
        f.ready.wait()
        print(f"ready: {f.opened} opened, {f.held} held", flush=True)
        try:
            while not stop.wait(1.0):
                print(f"opened {f.opened}, held {f.held}, closed by the server {f.closed_by_server}, "
                      f"failed {f.failed}", flush=True)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
