"""``await multisite.aconnect("HOST:PORT")``: the client protocol for asyncio applications.

The same operations as ``multisite.connect``, awaited. Every call sends its request at once and
waits for its own reply, so the tasks of one application share a connection and pipeline: many
requests in flight, answered in the order sent (the server keeps that order, ``protocol.client``),
and their commits join the server's group commits together.

    db = await multisite.aconnect("127.0.0.1:7000")
    await db.set("acct", ("a", 1), {"n": 1})
    async with db.transaction() as tx:
        tx.set("acct", ("a", 2), 2)
        tx.kill("acct", ("b",))
    await db.get("acct", ("a", 2))
    await db.commit([("set", "acct", ("c",), 3), ("zkill", "acct", ("a", 1))])
    await db.close()
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections import deque
from typing import Any, AsyncIterator

from ..errors import (AuthenticationFailed, ConfigError, ConnectionLost, MultisiteError, RemoteProtocolError,
                      TransactionError)
from ..journal.records import KILL, SET, ZKILL
from ..keys import check_key
from ..protocol.client import MAX_CLIENT_FRAME_BYTES, FrameBuffer, encode
from .client import WireUpdates, _document, client_tls_context, result_of
from ..net.tls import parse_hostport

UPDATE_OPS = {"set": SET, "kill": KILL, "zkill": ZKILL}
CLOSE_FLUSH_S = 2.0  # how long close() lets buffered requests go out before it drops the connection


class _Replies(asyncio.Protocol):
    """The connection's bytes, on the loop's own callbacks: each reply read resolves its caller's future
    right in ``data_received`` (no reader task woken per reply: one loop pass less per request)."""

    def __init__(self) -> None:
        self.db: AsyncRemoteDatabase | None = None
        self.transport: asyncio.Transport | None = None
        self.buf = FrameBuffer()
        self.closed = asyncio.get_running_loop().create_future()
        self.drained: asyncio.Future | None = None  # set while the transport's write buffer is over its limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        db = self.db
        if db is None or db._broken is not None:
            return
        self.buf.feed(data)
        try:
            while (msg := self.buf.next()) is not None:
                db._reply(msg)
        except MultisiteError as e:
            db._fail(e.message)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.db is not None:
            if isinstance(exc, OSError):
                self.db._error = exc
                self.db._fail(f"connection to {self.db.address} failed: {exc}")
            else:
                self.db._fail(f"instance server at {self.db.address} closed the connection")
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drained is not None:
            if not self.drained.done():
                self.drained.set_result(None)
            self.drained = None


class AsyncRemoteDatabase:
    def __init__(self, address: str, transport: asyncio.Transport, protocol: _Replies):
        self.address = address
        self._transport, self._protocol = transport, protocol
        self._ids = itertools.count(1)
        self._waiting: deque[tuple[int, str, asyncio.Future]] = deque()  # sent, in order
        self._broken: str | None = None
        self._error: BaseException | None = None  # what broke the connection (an ssl.SSLError: TLS refused)
        self.user: dict | None = None  # the server's answer to hello: user, role, by
        protocol.db = self
        if protocol.closed.done():  # the connection ended before this object existed to hear it
            self._fail(f"instance server at {address} closed the connection")

    def _reply(self, msg: object) -> None:
        """One reply read: it answers the oldest request in flight (RemoteProtocolError otherwise)."""
        if not (isinstance(msg, list) and len(msg) == 3):
            raise RemoteProtocolError(f"instance server at {self.address} answered with {msg!r:.80}")
        if msg[0] is None:  # the server could not read a request and closes the connection
            raise RemoteProtocolError(f"{msg[2][0]}: {msg[2][1]}")
        if not self._waiting or self._waiting[0][0] != msg[0]:
            raise RemoteProtocolError(f"instance server at {self.address} answered request {msg[0]!r}, "
                                      f"expected {self._waiting[0][0] if self._waiting else 'none'}")
        _rid, _op, fut = self._waiting.popleft()
        if not fut.done():
            fut.set_result(msg)

    def _fail(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
        while self._waiting:
            _rid, op, fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(ConnectionLost(f"{why}; whether that {op!r} took effect is unknown"))
        self._transport.close()

    async def _call(self, op: str, **args: Any) -> Any:
        if self._broken is not None:
            raise ConnectionLost(f"the connection to {self.address} was lost earlier ({self._broken}); connect again")
        rid = next(self._ids)
        frame = encode([rid, op, args])
        if len(frame) - 4 > MAX_CLIENT_FRAME_BYTES:
            raise TransactionError(f"{op} request of {len(frame) - 4:,} bytes exceeds the client protocol's "
                                   f"limit of {MAX_CLIENT_FRAME_BYTES:,} bytes; split it into smaller ones")
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((rid, op, fut))
        self._transport.write(frame)
        if self._protocol.drained is not None:  # over the write buffer's limit: wait until it drains
            await asyncio.shield(self._protocol.drained)  # a cancelled caller must not cancel the others
        return result_of(await fut)

    # -- the Database API, awaited -------------------------------------------------------------------
    async def info(self) -> dict:
        return await self._call("info")

    async def seqno(self) -> int:
        return (await self._call("info"))["seqno"]

    async def create_region(self, name: str, replicated: bool = True, schema: str | None = None) -> None:
        await self._call("create_region", name=name, replicated=replicated, schema=schema)

    async def regions(self) -> dict[str, bool]:
        return await self._call("regions")

    async def get(self, region: str, key: tuple) -> Any:
        return await self._call("get", region=region, key=list(check_key(key)))

    async def items(self, region: str, start: tuple | None = None, stop: tuple | None = None,
                    batch: int = 1000) -> AsyncIterator[tuple[tuple, Any]]:
        lo, inclusive = (list(check_key(start)) if start is not None else None), True
        hi = list(check_key(stop)) if stop is not None else None
        while True:
            rows = await self._call("items", region=region, start=lo, stop=hi, limit=batch, inclusive=inclusive)
            for k, v in rows:
                yield tuple(k), v
            if len(rows) < batch:
                return
            lo, inclusive = rows[-1][0], False

    async def set(self, region: str, key: tuple, value: Any) -> int:
        return await self._call("commit", ops=[[SET, region, list(check_key(key)), _document(value)]])

    async def kill(self, region: str, key: tuple) -> int:
        return await self._call("commit", ops=[[KILL, region, list(check_key(key)), None]])

    async def zkill(self, region: str, key: tuple) -> int:
        return await self._call("commit", ops=[[ZKILL, region, list(check_key(key)), None]])

    async def commit(self, updates: list[tuple]) -> int:
        """Commit ``("set", region, key, value)``, ``("kill", region, key)`` and ``("zkill", region,
        key)`` updates atomically as one transaction; its seqno (0 if nothing replicated was touched)."""
        return await self._call("commit", ops=[_update(u) for u in updates])

    def transaction(self) -> "AsyncTransaction":
        return AsyncTransaction(self)

    async def close(self) -> None:
        """Fail what is pending and close; bytes still buffered get ``CLOSE_FLUSH_S`` to be sent (a peer
        that reads nothing would hold the close forever), then the connection is dropped."""
        self._fail("closed by this client")
        try:
            await asyncio.wait_for(asyncio.shield(self._protocol.closed), CLOSE_FLUSH_S)
        except asyncio.TimeoutError:
            self._transport.abort()
            await self._protocol.closed

    async def __aenter__(self) -> "AsyncRemoteDatabase":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncTransaction(WireUpdates):
    """``async with db.transaction() as tx``: updates collected while open, committed as one request
    when the block ends without an exception (or by ``await tx.commit()``), once."""

    def __init__(self, db: AsyncRemoteDatabase):
        self.db = db
        self.ops: list = []
        self.seqno = 0
        self.state = "new"

    async def __aenter__(self) -> "AsyncTransaction":
        if self.state != "new":
            raise TransactionError(f"transaction is {self.state}; start a new one with db.transaction()")
        self.state = "open"
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.state = "aborted"
            return
        await self.commit()

    async def commit(self) -> int:
        if self.state in ("committing", "committed", "failed"):
            raise TransactionError(f"transaction already {self.state}; start a new one with db.transaction()")
        self.state = "committing"
        try:
            if self.ops:
                self.seqno = await self.db._call("commit", ops=self.ops)
        except BaseException:
            self.state = "failed"
            raise
        self.state = "committed"
        return self.seqno

    def _add(self, update: list) -> None:
        if self.state != "open":
            raise TransactionError(f"transaction is {self.state}; start a new one with db.transaction()")
        self.ops.append(update)


def _update(u: tuple) -> list:
    if not isinstance(u, (tuple, list)) or not u or u[0] not in UPDATE_OPS:
        raise TransactionError(f"an update is ('set', region, key, value), ('kill', region, key) or "
                               f"('zkill', region, key), got {u!r:.80}")
    if u[0] == "set":
        if len(u) != 4:
            raise TransactionError(f"a set is ('set', region, key, value), got {u!r:.80}")
        return [SET, u[1], list(check_key(u[2])), _document(u[3])]
    if len(u) != 3:
        raise TransactionError(f"a {u[0]} is ({u[0]!r}, region, key), got {u!r:.80}")
    return [UPDATE_OPS[u[0]], u[1], list(check_key(u[2])), None]


async def connect(address: str, timeout: float = 30.0, *, user: str | None = None, password: str | None = None,
                  tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                  tls_check_hostname: bool = True) -> AsyncRemoteDatabase:
    """Connect to the instance server listening at ``HOST:PORT``; the authentication arguments are
    ``multisite.connect``'s (``server.client.connect``)."""
    host, port = parse_hostport(address)
    if password is not None and user is None:
        raise ConfigError("aconnect: a password needs a user (user=NAME, password=SECRET)")
    tls = client_tls_context(tls_ca, tls_cert, tls_key, tls_check_hostname)
    try:
        transport, protocol = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            _Replies, host, port, ssl=tls, server_hostname=host if tls else None), timeout)
    except ssl.SSLError as e:
        raise ConnectionLost(f"TLS handshake with the instance server at {address} failed: {e}") from e
    except (OSError, TimeoutError) as e:
        raise ConnectionLost(f"cannot connect to instance server at {address}: {e}") from e
    transport.set_write_buffer_limits(high=1 << 20)
    db = AsyncRemoteDatabase(address, transport, protocol)
    if user is not None or tls_cert:
        try:
            db.user = await db._call("hello", user=user, password=password)
        except ConnectionLost as e:
            await db.close()
            if isinstance(db._error, ssl.SSLError):  # TLS 1.3: the server's verdict on the certificate
                raise AuthenticationFailed(f"the instance server at {address} refused this client's TLS "
                                           f"certificate: {db._error.reason or db._error}") from e
            raise
        except BaseException:
            await db.close()
            raise
    return db
