"""The container's data wire, sans-IO: grid clients ⇄ a partition's primary, and shard ⇄ shard.

The frame is the catalog wire's (``u32 length | u8 type | msgpack body``, array-like structs), with
types of their own (from 20), so one listening port tells a ``StatusRequest`` from a client's
``Open`` and a replica's ``Subscribe`` by the first frame's type.

Clients (``grid.client``)::

    client → container   Open{version, grid}                    → Opened{container} | Failed
    client → container   Commit{rid, partition, epoch, ops}      → Done{rid, seqno} | Failed{rid, code, …}
    client → container   Read{rid, partition, region, key}       → Done{rid, value} | Failed
                         (many in flight on one connection; answers may come in any order)

A replica shard, to its partition's primary (grid/DESIGN.md, "Replication between shards")::

    replica → primary    Subscribe{version, grid, partition, epoch, replica, role, seqno, tail}
    primary → replica    Resync{to_seqno}                        roll back to it, then subscribe again
                         Checkpoint{seqno, digest, regions} Rows{rows}… CheckpointEnd{}
                         Frames{first_seqno, data, ends, vote}   vote > 0: a synchronous prepare
                         Outcome{vote, commit, seqno}            the decision on a prepare
    replica → primary    Voted{vote, commit, seqno, why}         after journaling a prepare durably
                         Progress{seqno}                         applied up to seqno
    either               Failed{rid=0, code, message}            then close

Who may send what is ``FROM_CLIENT`` / ``FROM_SERVER``: anything else, or a malformed or oversized
frame, raises ``RemoteProtocolError`` and the connection is closed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Union

import msgspec

from ..errors import RemoteProtocolError
from ..protocol.framing import FRAME_PREFIX, encode_frame

SHARD_WIRE_VERSION = 1
MAX_DATA_FRAME_BYTES = 64 * 1024 * 1024


class Open(msgspec.Struct, array_like=True, tag=20):
    """A client's first frame; ``user`` and ``password`` authenticate it by password (issue 24)."""

    version: int
    grid: str
    user: str | None = None
    password: str | None = None


class Opened(msgspec.Struct, array_like=True, tag=21):
    container: str


class Commit(msgspec.Struct, array_like=True, tag=22):
    """One transaction: ``ops`` are ``[opcode, region, key (list), encoded value or None]``; ``epoch``
    is the client's route epoch (0: any)."""

    rid: int
    partition: int
    epoch: int
    ops: list[tuple[int, str, list, bytes | None]]


class Read(msgspec.Struct, array_like=True, tag=23):
    rid: int
    partition: int
    region: str
    key: list


class Done(msgspec.Struct, array_like=True, tag=24):
    """``seqno`` of a commit (0: nothing replicated changed); ``value`` of a read (encoded; None: absent)."""

    rid: int
    seqno: int = 0
    value: bytes | None = None


class FailCode(StrEnum):
    NOT_PRIMARY = "NOT_PRIMARY"  # this container holds no primary of the partition (now): refresh routes
    WRONG_PARTITION = "WRONG_PARTITION"  # a key of the request does not route to the partition named
    VOTED_ROLLBACK = "VOTED_ROLLBACK"  # too few synchronous replicas voted to commit; nothing committed
    UNAVAILABLE = "UNAVAILABLE"  # the primary cannot commit now (cut off from the catalog, closing)
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # the primary failed while committing: it may or may not have
    TRANSACTION = "TRANSACTION"  # the transaction itself is refused (a bad key, a record over the limit)
    WRONG_GRID = "WRONG_GRID"
    STALE_EPOCH = "STALE_EPOCH"  # a replica subscribed with another epoch than the primary's
    NOT_ASSIGNED = "NOT_ASSIGNED"  # the subscriber is not a replica of this partition in the placement
    BAD_REQUEST = "BAD_REQUEST"
    VERSION = "VERSION"
    NOT_A_MEMBER = "NOT_A_MEMBER"  # with TLS: a subscriber without this grid's member certificate of its name
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
    TLS_REQUIRED = "TLS_REQUIRED"  # a plain connection to a TLS port
    PERMISSION_DENIED = "PERMISSION_DENIED"  # the user's role does not allow the request (a read-only put)


class Failed(msgspec.Struct, array_like=True, tag=25):
    """A refused request (``rid``), or the whole connection (``rid`` 0, then close). ``detail`` holds
    the vote counts of a VOTED_ROLLBACK, the epoch of a NOT_PRIMARY."""

    rid: int
    code: str
    message: str
    detail: dict[str, Any] = {}


class Subscribe(msgspec.Struct, array_like=True, tag=30):
    """Replica → primary: which shard I am and where my journal ends. ``tail`` is
    ``[(seqno, digest)]`` of my last frames, newest last (``shipping.tail_digests``)."""

    version: int
    grid: str
    partition: int
    epoch: int
    replica: str
    role: str
    seqno: int
    tail: list[tuple[int, bytes]]


class Resync(msgspec.Struct, array_like=True, tag=31):
    to_seqno: int
    why: str


class Checkpoint(msgspec.Struct, array_like=True, tag=32):
    """The primary's state at ``seqno`` follows in ``Rows``; ``digest`` is its frame's at ``seqno``
    (what the replica's tail is checked against next time, before it journals any frame)."""

    seqno: int
    digest: bytes
    regions: dict[str, tuple[bool, str | None]]
    keys: int


class Rows(msgspec.Struct, array_like=True, tag=33):
    rows: list[tuple[str, bytes, bytes]]  # (region, encoded key, encoded value)


class CheckpointEnd(msgspec.Struct, array_like=True, tag=34):
    keys: int


class Frames(msgspec.Struct, array_like=True, tag=35):
    first_seqno: int
    data: bytes
    ends: list[int]
    vote: int = 0


class Outcome(msgspec.Struct, array_like=True, tag=36):
    """The decision on prepare ``vote``: committed, or rolled back to ``seqno`` (the replica cuts
    back to it: the prepared frames leave the journal into a lost-transaction file)."""

    vote: int
    commit: bool
    seqno: int


class Voted(msgspec.Struct, array_like=True, tag=37):
    vote: int
    commit: bool
    seqno: int
    why: str = ""


class Progress(msgspec.Struct, array_like=True, tag=38):
    seqno: int


Message = Union[Open, Opened, Commit, Read, Done, Failed, Subscribe, Resync, Checkpoint, Rows, CheckpointEnd,
                Frames, Outcome, Voted, Progress]
MESSAGE_TYPES: dict[int, type] = {c.__struct_config__.tag: c for c in Message.__args__}  # type: ignore[attr-defined]
FROM_CLIENT = frozenset((Open, Commit, Read, Subscribe, Voted, Progress, Failed))  # to the listening end
FROM_SERVER = frozenset((Opened, Done, Failed, Resync, Checkpoint, Rows, CheckpointEnd, Frames, Outcome))
FIRST_TYPES = frozenset(c.__struct_config__.tag for c in (Open, Subscribe))  # a data connection starts so
_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(c) for t, c in MESSAGE_TYPES.items()}


def encode(msg: Message) -> bytes:
    return encode_frame(_encoder, msg)


class DataWire:
    """One end of a data connection: ``server`` is the listening end (a container)."""

    def __init__(self, *, server: bool, max_frame_bytes: int = MAX_DATA_FRAME_BYTES) -> None:
        self.accept = FROM_CLIENT if server else FROM_SERVER
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self.broken = False

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_event(self) -> Message | None:
        """The next whole message, or None until more bytes come."""
        if self.broken:
            raise RemoteProtocolError("the data connection is broken")
        buf, pos = self._buf, self._pos
        if len(buf) - pos < FRAME_PREFIX.size:
            return None
        length, t = FRAME_PREFIX.unpack_from(buf, pos)
        if length < 1 or length > self.max_frame_bytes:
            self.broken = True
            raise RemoteProtocolError(f"grid data frame of {length} bytes (at most {self.max_frame_bytes}): "
                                      f"not a multisite grid peer, or a broken one")
        if len(buf) - pos < 4 + length:
            return None
        dec = _decoders.get(t)
        if dec is None:
            self.broken = True
            raise RemoteProtocolError(f"unknown grid data message type {t}")
        try:
            msg = dec.decode(memoryview(buf)[pos + FRAME_PREFIX.size:pos + 4 + length])
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as e:
            self.broken = True  # (msgspec raises the last two for a string not UTF-8, for nesting too deep)
            raise RemoteProtocolError(f"malformed grid data message of type {t}: {e}") from None
        self._pos = pos + 4 + length
        if self._pos > 1 << 20:
            del self._buf[:self._pos]
            self._pos = 0
        if type(msg) not in self.accept:
            self.broken = True
            raise RemoteProtocolError(f"{type(msg).__name__} may not be sent to the "
                                      f"{'container' if self.accept is FROM_CLIENT else 'client'}")
        return msg

    def pending(self) -> int:
        """Bytes received and not yet consumed (a peer that closed with some left cut a frame short)."""
        return len(self._buf) - self._pos
