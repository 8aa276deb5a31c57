"""A replica shard: it follows its partition's primary (``ReplicaShard``).

It connects to its primary (the address in the catalog's ``View``), subscribes with its seqno and
the digests of its last frames, and applies what comes: frames (``Database.apply_frames``:
journaled byte for byte, hardened before a vote), outcomes of votes (a rollback cuts its journal
back into a lost-transaction file), checkpoints (a new instance in place of the old). It reconnects
every ``RECONNECT_S`` until the container gives the shard another role.

A checkpoint copy is built beside the shard (``staging_dir``) and swapped in with two renames; a
crash between them is repaired when the container opens the shard (``restore_interrupted_swap``).
It is its own module because a replica shares nothing with the primary's pipeline but the wire and
the helpers in ``shard.py``.
"""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...engine import Database
from ...engine import open as open_db
from ...engine.checkpoint import install_state
from ...errors import MultisiteError, ProtocolError, RemoteProtocolError, StorageFull, StoreLost
from ...fsutil import atomic_write, fsync_dir
from ...journal.records import FrameRun
from ...net.tls import parse_hostport
from ..loader import ReplicaBuffer
from ..shard_wire import (SHARD_WIRE_VERSION, Checkpoint, CheckpointEnd, DataWire, Failed, Frames, Outcome, Progress,
                          Resync, Rows, Subscribe, Voted, encode)
from ..shipping import TAIL_FRAMES
from ..wire import View
from .loader_runner import buffer_frames
from .security import open_connection
from .shard import RECONNECT_S, frame_digests, log, read_into, reopen

COPY_POLL_S = 0.5  # how often a thread installing a checkpoint copy looks whether the copy was given up
SHARD_STATE = "grid-shard.json"  # a checkpoint-installed replica's seqno and digest (its tail before any frame)


def staging_dir(path: Path) -> Path:
    """Where a replica builds a checkpoint copy before swapping it in for ``path``."""
    return path.with_name(path.name + ".checkpoint")


def restore_interrupted_swap(path: Path) -> None:
    """A crash between the two renames of a checkpoint swap left ``path`` missing: take the whole
    copy (it has its state file, written last) or else the old instance back."""
    if path.exists():
        return
    staging, old = staging_dir(path), path.with_name(path.name + ".old")
    if (staging / SHARD_STATE).exists():
        staging.rename(path)
    elif old.exists():
        old.rename(path)


class CopyAbandoned(Exception):
    """The checkpoint copy was given up (the replica stopped, its link broke) before its end."""


def copy_batches(q: queue.Queue, abandoned: threading.Event):
    """The rows of a checkpoint copy for the thread that installs them, until its end (None). A copy
    given up ends them too (``CopyAbandoned``, its instance never swapped in): the end may never be put
    when the replica's task is cancelled again while it offers it, and a thread waiting on ``q`` for
    ever is a thread of the loop's default executor lost for good."""
    while True:
        try:
            item = q.get(timeout=COPY_POLL_S)
        except queue.Empty:
            if abandoned.is_set():
                raise CopyAbandoned("the checkpoint copy was given up") from None
            continue
        if item is None:
            return
        yield item


async def _offer(q: queue.Queue, item, consumer: asyncio.Future) -> None:
    """Put ``item`` for a consumer thread without blocking forever if the consumer died."""
    loop = asyncio.get_running_loop()
    while not consumer.done():
        try:
            await loop.run_in_executor(None, lambda: q.put(item, timeout=0.5))
            return
        except queue.Full:
            continue


class ReplicaShard:
    """A replica shard following its primary (see the module docstring)."""

    def __init__(self, host, partition: int, path: Path, db: Database, view: View, role: str,
                 executor: ThreadPoolExecutor) -> None:
        self.host, self.partition, self.path, self.db, self.view, self.role = host, partition, path, db, view, role
        self.ex = executor
        self.connected = False
        self.last_error = ""
        self.retry_s = 0.01
        self.stopped = False
        self.buffer = ReplicaBuffer(partition) if getattr(host, "loader_maps", None) else None  # issue 16
        self.task = asyncio.create_task(self.run())

    async def stop(self) -> Database:
        # Python 3.11's asyncio.wait_for returns (or raises) the inner result when a cancellation
        # races with its end (bpo-42130): a cancel that lands on _follow's connection attempt (one
        # refused at once by a dead primary, the usual case before a promotion) is swallowed and the
        # loop goes on. The flag ends the loop; the cancel is repeated until the task is done.
        self.stopped = True
        while not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=RECONNECT_S)
        if not self.task.cancelled():
            self.task.exception()  # retrieved: it ended the replica, which stops anyway
        return self.db

    async def run(self) -> None:
        while not self.stopped:
            addr = self.view.primary_address
            delay = RECONNECT_S
            if addr and self.view.primary != self.host.name:
                try:
                    await self._follow(addr)
                    delay = 0.0  # cut back on the primary's word: subscribe again at once
                except (OSError, ProtocolError, MultisiteError) as e:
                    if str(e) != self.last_error:
                        log.info("partition %d: %s replica: link to primary %s: %s", self.partition, self.role,
                                 self.view.primary, e)
                    self.last_error = str(e)
                    # a primary still taking its role (NOT_PRIMARY, STALE_EPOCH) is ready within
                    # milliseconds, and while a synchronous replica waits its partition refuses commits
                    if "NOT_PRIMARY" in self.last_error or "STALE_EPOCH" in self.last_error:
                        delay, self.retry_s = self.retry_s, min(RECONNECT_S, self.retry_s * 2)
                    else:
                        self.retry_s = 0.01
                except Exception as e:  # noqa: BLE001 - never end silently: the shard would stop following,
                    # its seqno frozen, while its container goes on reporting it
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.exception("partition %d: %s replica: following primary %s failed; subscribing again",
                                  self.partition, self.role, self.view.primary)
                finally:
                    self.connected = False
            await asyncio.sleep(delay)

    async def _tail(self) -> list[tuple[int, bytes]]:
        loop = asyncio.get_running_loop()
        seqno = self.db.seqno
        d = await loop.run_in_executor(self.ex, frame_digests, self.db, max(1, seqno - TAIL_FRAMES + 1), seqno)
        tail = sorted(d.items())
        state = self._state()
        if state and state["seqno"] <= seqno and state["seqno"] not in d and (not tail or state["seqno"] < tail[0][0]):
            tail.insert(0, (state["seqno"], bytes.fromhex(state["digest"])))
        return tail

    def _state(self) -> dict | None:
        p = self.path / SHARD_STATE
        return json.loads(p.read_text()) if p.exists() else None

    async def _follow(self, addr: str) -> None:
        host, port = parse_hostport(addr)
        reader, writer = await asyncio.wait_for(open_connection(host, port, self.host.security), 5.0)
        loop = asyncio.get_running_loop()
        try:
            wire = DataWire(server=False)
            writer.write(encode(Subscribe(SHARD_WIRE_VERSION, self.host.grid, self.partition, self.view.epoch,
                                          self.host.name, self.role, self.db.seqno, await self._tail())))
            self.connected = True
            while True:
                msg = await read_into(reader, wire)
                if msg is None:
                    raise ConnectionError("the primary closed the connection")
                if isinstance(msg, Frames):
                    run = FrameRun(msg.first_seqno, msg.data, msg.ends)
                    try:
                        seqno = await loop.run_in_executor(self.ex, self.db.apply_frames, [run])
                    except MultisiteError as e:  # a full disk, a gap: this replica cannot hold it
                        log.warning("partition %d: cannot apply seqnos %d..%d: %s", self.partition, msg.first_seqno,
                                    run.last_seqno, e)
                        if msg.vote:
                            writer.write(encode(Voted(msg.vote, False, self.db.seqno, str(e))))
                            await writer.drain()
                        if isinstance(e, (StoreLost, StorageFull)):  # the store may be lost too: reopen
                            await self._reopen()
                        raise
                    writer.write(encode(Voted(msg.vote, True, seqno) if msg.vote else Progress(seqno)))
                    if self.buffer is not None:  # issue 16: the Loader protocol's buffer, for status
                        buffer_frames(self.buffer, run, bool(msg.vote))
                elif isinstance(msg, Outcome):
                    if self.buffer is not None:
                        self.buffer.outcome(msg.commit, msg.seqno)
                    if not msg.commit and self.db.seqno > msg.seqno:
                        await loop.run_in_executor(self.ex, lambda: self.db.rollback(
                            msg.seqno, reason=f"grid vote {msg.vote} rolled back on the primary"))
                        log.info("partition %d: vote %d rolled back: cut back to seqno %d", self.partition,
                                 msg.vote, msg.seqno)
                        writer.write(encode(Progress(self.db.seqno)))
                elif isinstance(msg, Resync):
                    log.info("partition %d: cutting back to seqno %d: %s", self.partition, msg.to_seqno, msg.why)
                    await loop.run_in_executor(self.ex, lambda: self.db.rollback(
                        msg.to_seqno, reason=f"grid resync: {msg.why}"))
                    return  # subscribe again
                elif isinstance(msg, Checkpoint):
                    await self._install(msg, reader, wire)
                    writer.write(encode(Progress(self.db.seqno)))
                elif isinstance(msg, Failed):
                    raise MultisiteError(f"{msg.code}: {msg.message}")
                else:
                    raise RemoteProtocolError(f"unexpected {type(msg).__name__} from the primary")
        finally:
            writer.close()

    async def _reopen(self) -> None:
        """The store was lost (a full disk while it committed): reopen the instance (see ``reopen``)."""
        self.db = await reopen(self.db, self.ex, self.partition)
        self.host.shard_reopened(self.partition, self.db)

    async def _install(self, ck: Checkpoint, reader: asyncio.StreamReader, wire: DataWire) -> None:
        """Build the checkpoint beside the shard, then swap it in: the old instance stays open (and the
        shard usable) until the copy is whole, so a copy cut short leaves the shard as it was."""
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        log.info("partition %d: a checkpoint of the primary at seqno %d (%d keys) replaces this shard",
                 self.partition, ck.seqno, ck.keys)
        name, group, durability = self.db.name, self.db.info.group, self.db.durability.value
        staging = staging_dir(self.path)
        await loop.run_in_executor(None, shutil.rmtree, staging, True)
        q: queue.Queue = queue.Queue(maxsize=16)
        abandoned = threading.Event()
        fut = loop.run_in_executor(None, lambda: install_state(
            staging, name, group=group, durability=durability, seqno=ck.seqno, regions=dict(ck.regions),
            batches=copy_batches(q, abandoned)))
        try:
            while True:
                msg = await read_into(reader, wire)
                if isinstance(msg, Rows):
                    await _offer(q, msg.rows, fut)
                elif isinstance(msg, CheckpointEnd):
                    break
                else:
                    raise RemoteProtocolError(f"{type(msg).__name__ if msg else 'the end'} in a checkpoint copy")
        except BaseException:
            abandoned.set()  # at once: the offer below may be cut short by another cancel
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # its CopyAbandoned is expected
            raise
        finally:
            await _offer(q, None, fut)
        keys = await fut
        atomic_write(staging / SHARD_STATE, json.dumps({"seqno": ck.seqno, "digest": ck.digest.hex()}).encode())
        old_db = self.db

        def swap() -> Database:
            old_db.close()
            old = self.path.with_name(self.path.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            self.path.rename(old)  # a crash from here on: the container's open finds .checkpoint or .old
            staging.rename(self.path)
            fsync_dir(self.path.parent)
            shutil.rmtree(old, ignore_errors=True)
            return open_db(self.path)
        self.db = await asyncio.shield(loop.run_in_executor(self.ex, swap))
        self.host.shard_reopened(self.partition, self.db)
        log.info("partition %d: checkpoint installed: %d keys at seqno %d in %.1f s", self.partition, keys, ck.seqno,
                 time.monotonic() - t0)

    def status(self) -> dict:
        return {"primary": self.view.primary, "epoch": self.view.epoch, "connected": self.connected,
                "last_error": self.last_error,
                **({"loader_buffer": self.buffer.status()} if self.buffer is not None else {})}

