"""A shard hosted by a container: its instance, its worker thread, and the machinery of its role.

``Shard.take`` hands the role over: a primary (``primary.PrimaryShard``) takes commits and ships them, a
replica (``replica.ReplicaShard``) follows its primary. A replica's apply still running in the shard's
thread ends before the role changes there, because every change goes through that one thread.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...engine import Database
from ..wire import View
from .primary import PrimaryShard
from .replica import ReplicaShard


class Shard:
    """One shard hosted by the container ``host``: its instance, its worker thread, and its role's machinery."""

    def __init__(self, host, partition: int, path: Path, db: Database) -> None:
        self.host, self.partition, self.path, self.db = host, partition, path, db
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shard-p{partition}")
        self.role = ""
        self.view = View(0, None, None, [], [], 0)
        self.primary: PrimaryShard | None = None
        self.replica: ReplicaShard | None = None

    async def take(self, role: str, view: View) -> None:
        loop = asyncio.get_running_loop()
        was, self.role, old_view, self.view = self.role, role, self.view, view
        if role == "primary":
            if self.primary is not None:
                self.primary.update(view)
                return
            await self.stop()
            # through the shard's thread: an apply the stopped replica left running there ends first
            await loop.run_in_executor(self.executor, self.db.update_info, _set_role("primary"))
            self.primary = PrimaryShard(self.host, self.partition, self.db, view, self.executor,
                                        loader=self.host.shard_loader(self.partition))
            self.host.log.info("shard p%d is primary at epoch %d (was %s), seqno %d", self.partition, view.epoch,
                               was or "new", self.db.seqno)
            return
        if self.replica is not None and (was, old_view.epoch, old_view.primary_address) == (
                role, view.epoch, view.primary_address):
            self.replica.view = view
            return
        await self.stop()
        if self.db.role == "primary":
            await loop.run_in_executor(self.executor, self.db.update_info, _set_role("secondary"))
        self.replica = ReplicaShard(self.host, self.partition, self.path, self.db, view, role, self.executor)
        self.host.log.info("shard p%d is a %s replica of %s at epoch %d (was %s), seqno %d", self.partition, role,
                           view.primary, view.epoch, was or "new", self.db.seqno)

    async def stop(self) -> None:
        if self.primary is not None:
            await self.primary.stop()
            self.primary = None
        if self.replica is not None:
            self.db = await self.replica.stop()
            self.replica = None

    async def close(self) -> None:
        """Stop the role and close the instance in the shard's thread (its data stays)."""
        await self.stop()
        await asyncio.get_running_loop().run_in_executor(self.executor, self.db.close)
        self.executor.shutdown(wait=False)

    def status(self) -> dict:
        out = {"role": self.role, "seqno": self.db.seqno, "epoch": self.view.epoch, "dir": str(self.path)}
        if self.primary is not None:
            out.update(self.primary.status())
        if self.replica is not None:
            out.update(self.replica.status())
        return out


def _set_role(role: str):
    def fn(info) -> None:
        info.role = role
    return fn
