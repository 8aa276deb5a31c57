"""``await multisite.aconnect("h1:p1,h2:p2,...")``: the asyncio client following the primary of a cluster.

The same operations as ``AsyncRemoteDatabase``: the calls go to whichever address is the primary,
found by asking each its role, and after a failover to the new one. As in the blocking client
(``server.client.RemoteDatabase``): reads and requests the old primary refused with NOT_PRIMARY are
sent to the new primary; a commit whose answer was lost raises ``CommitOutcomeUnknown`` and is never
sent again. The tasks of an application share one connection; one of them reconnects at a time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..errors import AuthenticationFailed, ConnectionLost, MultisiteError, NotPrimary, PermissionDenied
from .aclient import AsyncRemoteDatabase, connect as connect_one
from .client import (CONNECT_TIMEOUT_S, FAILOVER_TIMEOUT_S, PRIMARY_POLL_S, RETRIED_OPS, no_primary,
                     outcome_unknown, parse_addresses, writable_role)


class AsyncFailoverDatabase(AsyncRemoteDatabase):
    """A multi-host string's primary (see the module docstring)."""

    def __init__(self, addresses: list[str], auth: dict, failover_timeout_s: float = FAILOVER_TIMEOUT_S):
        self.addresses, self._auth, self.failover_timeout_s = addresses, auth, failover_timeout_s
        self._db: AsyncRemoteDatabase | None = None
        self._reconnect = asyncio.Lock()
        self.address = addresses[0]
        self.user: dict | None = None

    async def _primary(self) -> AsyncRemoteDatabase:
        """The connection to the primary, opened (once for every waiting task) when there is none."""
        async with self._reconnect:
            if self._db is not None and self._db._broken is None:
                return self._db
            deadline = time.monotonic() + self.failover_timeout_s
            while True:
                seen = {}
                for addr in self.addresses:
                    try:
                        db = await connect_one(addr, CONNECT_TIMEOUT_S, **self._auth)
                    except (AuthenticationFailed, PermissionDenied):
                        raise
                    except MultisiteError as e:
                        seen[addr] = e.code
                        continue
                    try:  # bounded: a paused member's kernel accepts the connection, and nothing answers
                        role = writable_role(await asyncio.wait_for(db._call("info"), CONNECT_TIMEOUT_S))
                    except (MultisiteError, asyncio.TimeoutError) as e:
                        seen[addr] = getattr(e, "code", "no answer")
                        await db.close()
                        continue
                    if role == "primary":
                        self._db, self.address, self.user = db, addr, db.user
                        return db
                    seen[addr] = role
                    await db.close()
                if time.monotonic() >= deadline:
                    raise no_primary(self.addresses, self.failover_timeout_s, seen)
                await asyncio.sleep(PRIMARY_POLL_S)

    async def _call(self, op: str, **args: Any) -> Any:
        deadline = time.monotonic() + self.failover_timeout_s
        while True:
            db = await self._primary()
            try:
                return await db._call(op, **args)
            except NotPrimary:  # refused before it was applied: send it to the primary
                db._fail("the server is no longer the primary")
            except ConnectionLost as e:
                if op not in RETRIED_OPS:
                    raise outcome_unknown(db.address, op, self.addresses) from e
            if time.monotonic() >= deadline:
                raise ConnectionLost(f"{op!r} found no primary among {', '.join(self.addresses)} within "
                                     f"{self.failover_timeout_s:g} s")

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()


async def connect(address: str, timeout: float = 30.0, **auth: Any) -> AsyncRemoteDatabase:
    """One address: ``aclient.connect``; several: the primary among them (``AsyncFailoverDatabase``)."""
    addrs = parse_addresses(address)
    failover_timeout_s = auth.pop("failover_timeout_s", FAILOVER_TIMEOUT_S)
    if len(addrs) == 1:
        return await connect_one(addrs[0], timeout, **auth)
    db = AsyncFailoverDatabase(addrs, auth, failover_timeout_s)
    await db._primary()
    return db
