"""The client port's TLS and authentication: the I/O around ``protocol.auth`` and ``protocol.admission``.

The listener (``server.clients``, one event loop) asks ``ClientAuth.admission`` (a
``protocol.admission.AdmissionGate``: the connection slots, and how long one may wait to log in)
when a connection is accepted, before anything else. It does its own TLS with
``ClientAuth.ssl_context``, makes each connection's ``Gate`` (holding the connection's
``protocol.auth.ConnectionAuth``) with ``ClientAuth.gate(addr, common_name(peercert))``, sets its
frame limit from ``Gate.max_frame_bytes``, runs ``Gate.admit`` for every request (a few dict
look-ups) except a ``hello`` (``Gate.blocks``: a hash verification), which it runs in a worker
thread, and closes a connection once ``Gate.must_close`` after sending the answer.
``Gate.on_authenticated`` tells it when the connection logged in (its waiting slot is freed).

Here live what the sans-IO parts leave to their caller: the clock, the users file re-read when it
changes, a lock around the pacer all connections share, a bound on password verifications running
at once (each takes ~19 MiB and a core for tens of milliseconds), and the server's log lines.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import MultisiteError
from ..instance.users import UserFile, UserTable
from ..protocol.admission import AdmissionGate, AdmissionPolicy
from ..protocol.client import MAX_CLIENT_FRAME_BYTES
from ..protocol.auth import AUTHENTICATED, ConnectionAuth, Pacer, PacingPolicy, check_listen, is_loopback
from ..net.tls import TLSConfig

TLS_HANDSHAKE_RECORD = b"\x16"  # the first byte of a TLS ClientHello
PLAIN_REFUSED = "this instance server takes TLS on its client port: connect with tls_ca= (and a client certificate or a user)"
UNAUTHENTICATED_FRAME_BYTES = 64 * 1024  # a request before authentication (a hello is far smaller)
USERS_RECHECK_S = 0.1  # open sessions see a changed users file within this (a stat costs ~5-20 us: not per request)
MAX_CONCURRENT_VERIFICATIONS = 2  # password hashes computed at once (the machine's cores, not 256 connections')


class _LockedPacer:
    """The shared pacer behind a lock: connections' threads fail and wait at once."""

    def __init__(self, pacer: Pacer):
        self._pacer = pacer
        self._lock = threading.Lock()

    def wait_s(self, address: str, now: float) -> float:
        with self._lock:
            return self._pacer.wait_s(address, now)

    def failed(self, address: str, now: float) -> float:
        with self._lock:
            return self._pacer.failed(address, now)

    def failures(self, address: str, now: float) -> int:
        with self._lock:
            return self._pacer.failures(address, now)


class _BoundedUsers:
    """A user table whose ``verify`` waits for one of ``MAX_CONCURRENT_VERIFICATIONS`` slots."""

    def __init__(self, table: UserTable, slots: threading.BoundedSemaphore):
        self._table = table
        self._slots = slots

    def __len__(self) -> int:
        return len(self._table)

    def get(self, name: str):
        return self._table.get(name)

    def verify(self, name: str, secret: str):
        with self._slots:
            return self._table.verify(name, secret)


class _OneAtATime:
    """A lock per pacing key (a client's address), held while a hello from it runs: the pacer sees each
    attempt's outcome before the next one from that address is checked (else the worker threads
    verified as many guesses at once, each let through by a wait the others had not yet earned)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [lock, hellos holding or waiting for it]

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._mutex:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._mutex:
                entry[1] -= 1
                if not entry[1]:
                    del self._locks[key]


class ClientAuth:
    """Authentication for one client listener. Raises ConfigError at construction when ``host`` is
    reachable from other hosts, the instance has no users and ``insecure`` is false."""

    def __init__(self, root: str | os.PathLike, host: str, log: logging.Logger, *, tls: TLSConfig | None = None,
                 insecure: bool = False, pacing: PacingPolicy = PacingPolicy(),
                 admission: AdmissionPolicy = AdmissionPolicy(), clock: Callable[[], float] = time.monotonic):
        self.users = UserFile(root)
        check_listen(host, len(self.users.current()), insecure)
        self.open_allowed = insecure or is_loopback(host)  # no users: no authentication, here only
        self.tls = tls
        self._ssl = tls.server_context(client_cert_required=False) if tls else None
        self._pacer = _LockedPacer(Pacer(pacing))
        self.admission = AdmissionGate(admission)  # the listener's connection slots (its loop's thread only)
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_VERIFICATIONS)
        self._hellos = _OneAtATime()
        self._log = log
        self._clock = clock
        self._stats_lock = threading.Lock()
        self.refused = 0  # connections refused by their TLS handshake or authentication, for status
        self._recent: tuple[float, UserTable] | None = None  # (when read, users) for open sessions' checks
        if not is_loopback(host):
            if not len(self.users.current()):
                log.warning("--insecure: clients from any host that reaches %s may read, write and stop this "
                            "instance without authenticating", host or "*")
            elif tls is None:
                log.warning("clients authenticate on %s without TLS: their passwords cross the network in clear "
                            "(give --tls-cert, --tls-key and --tls-ca)", host or "*")

    def _table(self) -> UserTable:
        try:
            return self.users.current()
        except MultisiteError as e:  # a users file damaged while running: the last good one stays in force
            self._log.error("%s; the users read before stay in force", e)
            return self.users.current()

    def _recent_table(self) -> UserTable:
        """The users as of at most ``USERS_RECHECK_S`` ago (a race between threads costs one more stat)."""
        now = self._clock()
        if self._recent is None or not 0 <= now - self._recent[0] < USERS_RECHECK_S:
            self._recent = (now, self._table())
        return self._recent[1]

    def status(self) -> dict:
        return {"users": len(self._table()), "tls": self.tls is not None, "required": self._required(),
                "refused": self.refused, "admission": self.admission.status()}

    def _required(self) -> bool:
        return bool(len(self._table())) or not self.open_allowed

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client port's server-side TLS context (for a listener doing its own handshakes, e.g.
        ``asyncio.start_server(ssl=...)``; then ``gate(addr, cert_name)`` with the peer certificate's
        common name, ``common_name(transport.get_extra_info("peercert"))``)."""
        return self._ssl

    def gate(self, addr: Any, cert_name: str | None) -> "Gate":
        """A connection's gate, after its TLS handshake (if any)."""
        host = addr[0] if isinstance(addr, tuple) else str(addr)
        table = self._table()
        # the newest read is what open sessions check against from now on: else a connection made just
        # after a user was added was checked by ``admit`` against the table of up to USERS_RECHECK_S
        # before, without that user ("wrong user or password" for a user that exists)
        self._recent = (self._clock(), table)
        auth = ConnectionAuth(_BoundedUsers(table, self._slots), self._pacer, host,  # type: ignore[arg-type]
                              required=bool(len(table)) or not self.open_allowed, cert_name=cert_name,
                              peer=_peer(addr))
        gate = Gate(self, auth, table)
        gate.flush()
        return gate

    def _count_refused(self) -> None:
        with self._stats_lock:
            self.refused += 1


class Gate:
    """One connection's authentication as the listener sees it."""

    def __init__(self, owner: ClientAuth, auth: ConnectionAuth, table: UserTable):
        self._owner = owner
        self.auth = auth
        self._table = table  # the users it was last checked against
        self.on_authenticated: Callable[[], None] | None = None  # called once, when it authenticates

    @property
    def authenticated(self) -> bool:
        return self.auth.state == AUTHENTICATED

    def admit(self, op: str, args: Any) -> dict | None:
        """None: serve the request; a dict: the answer to hello. Raises the error to answer with.
        A ``hello`` with a password blocks for a hash verification (tens of ms): an event loop runs
        it in a worker thread (``blocks(op)``); every other op is a few dict look-ups."""
        open_before = not self.auth.must_close
        try:
            table = self._owner._recent_table()  # changed users reach open sessions too
            if table is not self._table:
                self._table = table
                self.auth.refresh(_BoundedUsers(table, self._owner._slots))
            if op == "hello":
                with self._owner._hellos.hold(self.auth.pacing_key):
                    return self.auth.admit(op, args, self._owner._clock())
            return self.auth.admit(op, args, self._owner._clock())
        finally:
            self.flush()
            if open_before and self.auth.must_close:
                self._owner._count_refused()
            if self.on_authenticated is not None and self.authenticated:
                self.on_authenticated, done = None, self.on_authenticated
                done()

    @staticmethod
    def blocks(op: str) -> bool:
        return op == "hello"

    @property
    def must_close(self) -> bool:
        return self.auth.must_close

    @property
    def max_frame_bytes(self) -> int:
        """The largest request frame the connection may send now: a client not yet authenticated does
        not get to hold 64 MiB of the listener's buffer budget."""
        return MAX_CLIENT_FRAME_BYTES if self.authenticated else UNAUTHENTICATED_FRAME_BYTES

    def flush(self) -> None:
        for line in self.auth.take_events():
            level = logging.WARNING if " refused" in line or " denied " in line else logging.INFO
            self._owner._log.log(level, "%s", line)


def common_name(cert: dict | None) -> str | None:
    """The subject's common name of a verified peer certificate (``SSLSocket.getpeercert()``)."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
