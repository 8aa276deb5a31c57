"""A container's shards at work: what the primary's and the replica's modules share.

A primary takes commits and ships them (``primary.PrimaryShard``: the batch and vote pipeline, with
``feeds.Feeds``, its links to the replicas, and ``lease.Lease``, the catalog's word that lets it take
commits); a replica follows its primary (``replica.ReplicaShard``). They share what is here: a
client's ``Request`` and its refusal (``ShardRefusal``), reading a message off a data connection
(``read_into``), the digests of journal frames (how a subscription compares tails), and reopening
an instance whose store a full disk lost.

Each shard has one worker thread for its engine calls (``Database`` is used from that thread only,
so a prepared batch's lock is taken and released there, and reads wait behind a batch).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from ...engine import Database
from ...engine import open as open_db
from ...errors import MultisiteError, RemoteProtocolError
from ...journal.reader import iter_runs
from ...journal.segments import list_segments
from ..shard_wire import DataWire
from ..shipping import digest

RECONNECT_S = 0.3
CATCH_UP_RUN_BYTES = 1 << 20

log = logging.getLogger("multisite.container")


async def read_into(reader: asyncio.StreamReader, wire: DataWire):
    """The next message, or None at the end of the connection."""
    while True:
        msg = wire.next_event()
        if msg is not None:
            return msg
        data = await reader.read(1 << 18)
        if not data:
            if wire.pending():
                raise RemoteProtocolError(f"the peer closed in the middle of a frame ({wire.pending()} bytes left)")
            return None
        wire.receive_data(data)


def joined(frames: list[tuple[int, bytes]]) -> tuple[bytes, list[int]]:
    """A batch's frames as one ``Frames`` payload: the bytes and each frame's end."""
    ends, pos = [], 0
    for _, f in frames:
        pos += len(f)
        ends.append(pos)
    return b"".join(f for _, f in frames), ends


def journal_first(db: Database) -> int:
    segs = list_segments(db.layout.journal)
    return segs[0].first_seqno if segs else db.seqno + 1


def runs(db: Database, lo: int, hi: int):
    """The journal's frames ``lo..hi`` in runs of about ``CATCH_UP_RUN_BYTES``."""
    return iter_runs(db.layout.journal, lo, CATCH_UP_RUN_BYTES, to_seqno=hi)


def frame_digests(db: Database, lo: int, hi: int) -> dict[int, bytes]:
    """Digests of the journal's frames ``lo..hi`` that the journal files hold."""
    out: dict[int, bytes] = {}
    lo = max(lo, journal_first(db))
    if hi < lo:
        return out
    for run in runs(db, lo, hi):
        for seqno, fr in run.frames():
            out[seqno] = digest(fr)
    return out


class Request:
    __slots__ = ("kind", "ops", "region", "key", "future")

    def __init__(self, kind: str, future: asyncio.Future, ops=None, region=None, key=None):
        self.kind, self.future, self.ops, self.region, self.key = kind, future, ops, region, key


class ShardRefusal(Exception):
    def __init__(self, code: str, message: str, detail: dict):
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail


def fail(r: Request, code: str, message: str, **detail) -> None:
    """Refuse ``r`` (unless it was answered already)."""
    if not r.future.done():
        r.future.set_exception(ShardRefusal(code, message, detail))


async def reopen(db: Database, ex: ThreadPoolExecutor, partition: int) -> Database:
    """Close ``db`` and open it again in the shard's thread, retrying while it cannot open (the disk
    still full): recovery rolls a store lost to a full disk forward from the journal."""
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(ex, db.close)
    except MultisiteError as e:
        log.info("partition %d: closing the instance after its store was lost: %s", partition, e)
    while True:
        try:
            new = await loop.run_in_executor(ex, open_db, db.layout.root)
        except MultisiteError as e:
            log.warning("partition %d: cannot reopen the instance yet: %s", partition, e)
            await asyncio.sleep(RECONNECT_S * 3)
            continue
        log.info("partition %d: instance reopened at seqno %d", partition, new.seqno)
        return new
