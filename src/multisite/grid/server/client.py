"""The grid client: ``g = multisite.grid.connect("HOST:PORT")`` (the catalog's address; with several
catalogs, ``"H1:P1,H2:P2"``: routes come from whichever answers, leader or follower).

``g.put(map, key, value)``, ``g.get(map, key)``, ``g.remove(map, key)`` and
``with g.transaction(routing_key) as tx: tx.put(...); tx.remove(...)`` (several updates of one
partition, committed together; a key of another partition raises ``WrongPartition`` at once). A map
is a region of each partition's instance, made on its first write.

The client asks the catalog for the route table (each partition's primary container and epoch) and
keeps it (``routing.RouteCache``). A request goes to its partition's primary; the answers that mean
"ask elsewhere" (``NOT_PRIMARY``, ``UNAVAILABLE``, a container that refuses the connection) refresh
the table and retry until ``timeout_s``, and then raise ``GridUnavailable``. A commit that was sent
and whose answer never came (the container died, the connection broke) is **never sent again**: it
may have committed, and it raises ``CommitOutcomeUnknown``. A commit refused by the vote raises
``ReplicationVotedToRollback`` with the counts: it committed nowhere.

Blocking and thread-safe: the client's threads share one connection per container, each request
pipelined with the others' (``client_conn.py``); use threads for concurrency.

On a grid with TLS (issue 24), ``tls_ca`` (the grid's CA) makes every connection TLS, ``tls_cert`` and
``tls_key`` present a client certificate (its common name is the user), and ``user`` and ``password``
authenticate a user of the grid's users file; ``AuthenticationFailed`` and ``PermissionDenied`` (a
read-only user's put) come back as those classes.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from typing import Any

from ...errors import (CommitOutcomeUnknown, GridUnavailable, MultisiteError, ProtocolError, ReplicationVotedToRollback,
                       TransactionError, WrongGrid, WrongPartition)
from ...journal.records import KILL, SET
from ...keys import check_key
from ...values import decode_value, encode_value
from ..routing import RouteCache, RouteTable, partition_of, routing_partition
from ..shard_wire import Commit, Done, Failed, FailCode, Read
from ..wire import NEED_DATA, GridWire, Refused, RouteRequest, Routes, Side
from ...net.tls import parse_hostport
from ...server.client import client_tls_context
from .client_conn import CONNECT_TIMEOUT_S, REFUSALS, TLS_HANDSHAKE_TIMEOUT_S, NotSent, _Conn, refusal

RETRY_PAUSE_S = 0.05


def open_socket(address: str, timeout: float, tls: ssl.SSLContext | None,
                session: ssl.SSLSession | None = None) -> socket.socket:
    """A connection to a grid port (TLS when ``tls``, resuming ``session`` if given: a resumed handshake
    skips the certificates' signature and checks); a refused handshake is an OSError (``ssl.SSLError``)."""
    host, port = parse_hostport(address)
    s = socket.create_connection((host, port), timeout=timeout)
    if tls is None:
        return s
    s.settimeout(max(timeout, TLS_HANDSHAKE_TIMEOUT_S))  # abandoning a slow handshake only starts another one
    try:
        return tls.wrap_socket(s, server_hostname=host, session=session)
    except OSError:
        s.close()
        raise


def fetch_routes(catalog: str, timeout: float = CONNECT_TIMEOUT_S, tls: ssl.SSLContext | None = None,
                 user: str | None = None, password: str | None = None) -> RouteTable:
    """Ask the catalog for its route table (one address)."""
    wire = GridWire(Side.MEMBER)
    with open_socket(catalog, timeout, tls) as s:
        s.sendall(wire.send(RouteRequest(user, password)))
        while True:
            ev = wire.next_event()
            if ev is NEED_DATA:
                wire.receive_data(s.recv(1 << 16))
                continue
            if isinstance(ev, Routes):
                return RouteTable.from_dict(json.loads(ev.json))
            if isinstance(ev, Refused) and ev.code in REFUSALS:
                raise refusal(ev.code, f"the catalog {catalog}: {ev.message}")
            if ev is None:  # it closed without an answer (stopping, restarting)
                raise ConnectionError(f"the catalog {catalog} closed the connection without the routes")
            raise MultisiteError(f"the catalog {catalog} answered {type(ev).__name__} to a route request")


def _key(key: Any) -> tuple:
    return check_key(key if isinstance(key, tuple) else (key,))


class Grid:
    """A client of one grid (see the module docstring)."""

    def __init__(self, catalog: str, *, timeout_s: float = 30.0, user: str | None = None,
                 password: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        self.catalog = catalog
        self.user, self.password = user, password
        self.tls = client_tls_context(tls_ca, tls_cert, tls_key, check_hostname=False)
        self._sessions: dict[str, ssl.SSLSession] = {}  # container address -> a TLS session to resume
        self.catalogs = [c.strip() for c in catalog.split(",") if c.strip()]
        if not self.catalogs:
            raise MultisiteError("give the grid's catalog as HOST:PORT[,HOST:PORT...]")
        for c in self.catalogs:
            parse_hostport(c)
        self._answering = 0  # the catalog that answered last: asked first next time
        self.timeout_s = timeout_s
        table = self._fetch(first=True)
        self.grid = table.grid
        self.routes = RouteCache(table.grid, table)
        self._lock = threading.Lock()
        self._conns: dict[str, _Conn] = {}  # container address -> the connection every thread shares
        self._connecting: dict[str, threading.Lock] = {}  # per address: one connect, not one per thread

    # -- the API -----------------------------------------------------------------------------------
    def put(self, map: str, key: Any, value: Any) -> int:  # noqa: A002 - the seed's word
        """Set ``key`` of ``map`` to ``value`` in its own transaction; the partition's seqno."""
        k = _key(key)
        return self._commit(self.partition_of(k), [(SET, map, list(k), encode_value(value))])

    def remove(self, map: str, key: Any) -> int:  # noqa: A002
        k = _key(key)
        return self._commit(self.partition_of(k), [(KILL, map, list(k), None)])

    def get(self, map: str, key: Any, default: Any = None) -> Any:  # noqa: A002
        k = _key(key)
        p = self.partition_of(k)
        done = self._request(p, lambda rid: Read(rid, p, map, list(k)), commit=False)
        return default if done.value is None else decode_value(done.value)

    def transaction(self, routing_key: Any) -> GridTransaction:
        return GridTransaction(self, routing_partition(routing_key, self.partitions))

    @property
    def partitions(self) -> int:
        return self.routes.table.partitions

    def partition_of(self, key: tuple) -> int:
        return partition_of(key, self.partitions)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, {}
        for c in conns.values():
            c.close()

    def __enter__(self) -> Grid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------------
    def _commit(self, partition: int, ops: list) -> int:
        return self._request(partition, lambda rid: Commit(rid, partition, 0, ops), commit=True).seqno

    def _conn(self, address: str) -> _Conn:
        c = self._conns.get(address)
        if c is not None and not c.closed_by_peer():
            return c
        with self._lock:
            connecting = self._connecting.setdefault(address, threading.Lock())
        with connecting:
            c = self._conns.get(address)  # made meanwhile by another thread
            if c is not None and not c.closed_by_peer():
                return c
            c = _Conn(address, self.grid, self.tls, self.user, self.password, self._sessions.get(address))
            if c.session is not None:
                self._sessions[address] = c.session
            with self._lock:
                old, self._conns[address] = self._conns.get(address), c
        if old is not None:
            old.close()
        return c

    def _lost(self, address: str, conn: _Conn | None = None) -> None:
        """The container at ``address`` broke or refused a connection (``conn``, if one was made): close
        it, and route its partitions anew (the next table says whether it is still their primary)."""
        with self._lock:
            if conn is not None and self._conns.get(address) is conn:
                del self._conns[address]
            self.routes.unreachable(address)
        if conn is not None:
            conn.close()

    def _fetch(self, first: bool = False) -> RouteTable | None:
        """The route table of the first catalog that answers, starting with the one that answered last
        (None if none did; at connect, the error of the last one)."""
        n = len(self.catalogs)
        for i in range(n):
            k = (self._answering + i) % n
            try:
                table = fetch_routes(self.catalogs[k], tls=self.tls, user=self.user, password=self.password)
            except (OSError, ProtocolError):
                if first and i == n - 1:
                    raise
                continue  # restarting, killed mid-answer, or gone: the next one
            self._answering = k
            return table
        return None

    def _refresh(self) -> None:
        table = self._fetch()
        if table is None:
            return  # no catalog answered: the next try asks again
        with self._lock:
            self.routes.install(table)

    def _request(self, partition: int, make, *, commit: bool) -> Done:
        deadline = time.monotonic() + self.timeout_s
        last = "no primary"
        while True:
            with self._lock:
                route = self.routes.route(partition)
            if route is None:
                self._refresh()
                with self._lock:
                    route = self.routes.route(partition)
            if route is not None:
                try:
                    conn = self._conn(route.primary)
                except OSError as e:
                    last = f"container {route.primary} unreachable: {e}"
                    self._lost(route.primary)
                    conn = None
                if conn is not None:
                    try:
                        ans = conn.ask(make)
                    except NotSent as e:  # the connection broke before this request was written
                        self._lost(route.primary, conn)
                        last = f"container {route.primary}: {e}"
                    except (OSError, MultisiteError) as e:
                        self._lost(route.primary, conn)
                        if commit:
                            raise CommitOutcomeUnknown(
                                f"partition {partition}: the commit was sent to {route.primary} and no answer "
                                f"came ({e}); it may or may not have committed, and is not retried",
                                partition=partition, container=route.primary) from None
                        last = f"container {route.primary}: {e}"
                    else:
                        if isinstance(ans, Done):
                            return ans
                        last = self._failed(partition, ans)
            if time.monotonic() >= deadline:
                raise GridUnavailable(f"partition {partition} of grid {self.grid}: no primary took the request "
                                      f"within {self.timeout_s:g} s (last: {last})", partition=partition)
            time.sleep(RETRY_PAUSE_S)
            self._refresh()

    def _failed(self, partition: int, f: Failed) -> str:
        """Raise what the application must see; return why for the retries."""
        if f.code == FailCode.VOTED_ROLLBACK:
            raise ReplicationVotedToRollback(f.message, **f.detail)
        if f.code == FailCode.WRONG_PARTITION:
            raise WrongPartition(f.message)
        if f.code == FailCode.TRANSACTION:
            raise TransactionError(f.message)
        if f.code == FailCode.WRONG_GRID:
            raise WrongGrid(f.message)
        if f.code in (FailCode.AUTHENTICATION_FAILED, FailCode.PERMISSION_DENIED):
            raise refusal(f.code, f.message)
        if f.code == FailCode.OUTCOME_UNKNOWN:
            raise CommitOutcomeUnknown(f.message, partition=partition)
        if f.code == FailCode.NOT_PRIMARY:  # REFRESH marks the route stale; WAIT retries it as it is
            with self._lock:
                self.routes.not_primary(partition, int(f.detail.get("epoch", 1 << 62)))
        return f"{f.code}: {f.message}"


class GridTransaction:
    """Updates of one partition, committed together when the ``with`` block ends without an error."""

    def __init__(self, grid: Grid, partition: int) -> None:
        self.grid, self.partition = grid, partition
        self.ops: list = []
        self.seqno = 0

    def _check(self, key: Any) -> tuple:
        k = _key(key)
        p = self.grid.partition_of(k)
        if p != self.partition:
            raise WrongPartition(f"key {k!r} belongs to partition {p}, this transaction to partition "
                                 f"{self.partition}: a grid transaction updates one partition")
        return k

    def put(self, map: str, key: Any, value: Any) -> None:  # noqa: A002
        self.ops.append((SET, map, list(self._check(key)), encode_value(value)))

    def remove(self, map: str, key: Any) -> None:  # noqa: A002
        self.ops.append((KILL, map, list(self._check(key)), None))

    def get(self, map: str, key: Any, default: Any = None) -> Any:  # noqa: A002
        return self.grid.get(map, self._check(key), default)

    def __enter__(self) -> GridTransaction:
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None and self.ops:
            self.seqno = self.grid._commit(self.partition, self.ops)


def connect(catalog: str, *, timeout_s: float = 30.0, user: str | None = None, password: str | None = None,
            tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None) -> Grid:
    """A client of the grid whose catalog listens at ``catalog`` (HOST:PORT, or several: H:P,H:P); with
    TLS and users, as the module docstring says."""
    return Grid(catalog, timeout_s=timeout_s, user=user, password=password, tls_ca=tls_ca, tls_cert=tls_cert,
                tls_key=tls_key)
