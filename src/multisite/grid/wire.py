"""The catalog ⇄ container wire, sans-IO: bytes in, messages out (the shape of ``protocol/``).

Every message is one frame, as in ``protocol/messages.py``::

    u32 length (of what follows) | u8 type | msgpack body (the struct, array-like)

A container opens a TCP connection to the catalog and sends ``Register``; the catalog answers
``Assignments`` (and again whenever the placement changes) or ``Refused`` and closes. The container
then sends a ``Heartbeat`` every ``heartbeat_interval_s`` (the catalog says how often in each
``Assignments``). ``grid status`` opens a connection, sends ``StatusRequest`` and reads one
``Status``; a client sends ``RouteRequest`` and reads one ``Routes``. Who may send what, in which state, is the table ``TRANSITIONS``; anything else, or a
malformed or oversized frame, raises ``RemoteProtocolError`` / ``LocalProtocolError`` and the wire
stays in ``ERROR`` for good.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any, Union

import msgspec

from ..errors import LocalProtocolError
from ..protocol.framing import NEED_DATA, FramedWire, Frames, encode_frame  # noqa: F401 - NEED_DATA re-exported

GRID_WIRE_VERSION = 1
MAX_GRID_FRAME_BYTES = 4 * 1024 * 1024  # an Assignments of MAX_PARTITIONS shards, or a big Status, fits


class Register(msgspec.Struct, array_like=True, tag=1):
    """Container → catalog, first: who I am. ``grid`` is the grid the container belongs to ("" for
    a new container, which joins whichever grid the catalog serves)."""

    version: int
    grid: str
    container: str
    zone: str | None
    address: str
    capacity: int


class Heartbeat(msgspec.Struct, array_like=True, tag=2):
    """Container → catalog: alive; the placement version it has applied; each open shard's seqno;
    for each partition it is the primary of, ``(epoch, the synchronous replicas it counts current)``
    (the catalog promotes only those). ``ack`` > 0 asks for a ``HeartbeatAck`` once the catalog has
    recorded it: a primary waits for it before acknowledging a commit that left a replica out."""

    container: str
    applied_version: int
    seqnos: dict[int, int] = {}
    currency: dict[int, tuple[int, list[str]]] = {}
    ack: int = 0
    loaders: dict[int, dict[str, Any]] = {}  # issue 16: per shard, its Loader's state (primary) or buffer (replica)


class HeartbeatAck(msgspec.Struct, array_like=True, tag=9):
    """Catalog → container: heartbeat ``ack`` is recorded (every heartbeat is answered: the
    container's lease on its primaries runs from the last answer). ``stale``: the partitions of its
    currency report it is no longer the primary of at that epoch (deposed)."""

    ack: int
    stale: list[int] = []


class View(msgspec.Struct, array_like=True):
    """One partition as a container holding a shard of it needs to know it: the epoch, the primary's
    name and address (None while its container is down), the replicas by role, min_sync."""

    epoch: int
    primary: str | None
    primary_address: str | None
    sync: list[str]
    async_: list[str]
    min_sync: int


class Assignments(msgspec.Struct, array_like=True, tag=3):
    """Catalog → container: the shards it holds at placement ``epoch`` (partition → role)."""

    grid: str
    epoch: int
    shards: dict[int, str]
    heartbeat_interval_s: float
    views: dict[int, View] = {}
    heartbeat_timeout_s: float = 3.0
    partitions: int = 0
    loaders: dict[str, dict[str, Any]] = {}  # map -> its loader and settings (grid.toml), maps with one only


class RefusedCode(StrEnum):
    WRONG_GRID = "WRONG_GRID"
    NOT_A_MEMBER = "NOT_A_MEMBER"  # with TLS: no certificate of a member of this grid, of that name
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    TLS_REQUIRED = "TLS_REQUIRED"  # a plain connection to a TLS port
    NOT_LEADER = "NOT_LEADER"  # an operation asked of a catalog that does not lead (it names the leader)
    RETRY = "RETRY"  # the operation's write met a change of the grid: ask again
    NAME_IN_USE = "NAME_IN_USE"
    NOT_REGISTERED = "NOT_REGISTERED"
    BAD_REQUEST = "BAD_REQUEST"
    VERSION = "VERSION"


class Refused(msgspec.Struct, array_like=True, tag=4):
    """Catalog → container: no, and why; the catalog closes after it."""

    code: str
    message: str


class StatusRequest(msgspec.Struct, array_like=True, tag=5):
    """``user`` and ``password``: a client that authenticates by password (issue 24)."""

    user: str | None = None
    password: str | None = None


class Status(msgspec.Struct, array_like=True, tag=6):
    """Catalog (or container) → asker: the status as JSON text (the shape of ``grid status --json``)."""

    json: str


class RouteRequest(msgspec.Struct, array_like=True, tag=7):
    """A client → catalog: where is each partition's primary? (``user``, ``password``: as StatusRequest's)"""

    user: str | None = None
    password: str | None = None


class Routes(msgspec.Struct, array_like=True, tag=8):
    """Catalog → client: the route table as JSON text (``RouteTable.to_dict``: partition → primary's
    address and epoch, at placement ``version``)."""

    json: str


class Operate(msgspec.Struct, array_like=True, tag=10):
    """An operator → catalog (issue 24): ``op`` (``drain``, ``promote``) with ``args``; answered by a
    ``Status`` whose JSON holds the outcome in words, or ``Refused`` (``NOT_LEADER``, ``RETRY``, ...)."""

    op: str
    args: dict[str, Any] = {}
    user: str | None = None
    password: str | None = None


Message = Union[Register, Heartbeat, Assignments, Refused, StatusRequest, Status, RouteRequest, Routes,
                HeartbeatAck, Operate]
MESSAGE_TYPES: dict[int, type] = {c.__struct_config__.tag: c for c in Message.__args__}  # type: ignore[attr-defined]
_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(c) for t, c in MESSAGE_TYPES.items()}


class Side(Enum):
    CATALOG = "catalog"  # the listening end
    MEMBER = "member"  # a container, or a status asker


class State(Enum):
    IDLE = "idle"
    REGISTERED = "registered"  # member sent Register (catalog: received it); heartbeats and assignments flow
    ASKED = "asked"  # a StatusRequest is out; one Status answers it
    DONE = "done"  # a Refused or a Status ended the exchange
    CLOSED = "closed"
    ERROR = "error"


C, M = Side.CATALOG, Side.MEMBER
# (who sends, state, message type) -> next state; both ends use the same table.
TRANSITIONS: dict[tuple[Side, State, type], State] = {
    (M, State.IDLE, Register): State.REGISTERED,
    (M, State.IDLE, StatusRequest): State.ASKED,
    (M, State.IDLE, RouteRequest): State.ASKED,
    (M, State.IDLE, Operate): State.ASKED,
    (C, State.REGISTERED, Assignments): State.REGISTERED,
    (M, State.REGISTERED, Heartbeat): State.REGISTERED,
    (C, State.REGISTERED, HeartbeatAck): State.REGISTERED,
    (C, State.REGISTERED, Refused): State.DONE,
    (C, State.ASKED, Status): State.DONE,
    (C, State.ASKED, Routes): State.DONE,
    (C, State.ASKED, Refused): State.DONE,
}



class GridWire(FramedWire):
    """One end of a catalog connection. ``side`` is the end this object is."""

    ERROR, CLOSED = State.ERROR, State.CLOSED

    def __init__(self, side: Side, *, max_frame_bytes: int = MAX_GRID_FRAME_BYTES) -> None:
        self.side = side
        self.peer = C if side is M else M
        self.state = State.IDLE
        self.max_frame_bytes = max_frame_bytes
        self._frames = Frames(_decoders, max_frame_bytes, "grid", "a multisite grid peer")

    def _step(self, sender: Side, msg: object, err: type) -> None:
        if self.state is State.ERROR:
            raise err(f"the grid connection is broken; {type(msg).__name__} cannot be "
                      f"{'sent' if err is LocalProtocolError else 'received'}")
        nxt = TRANSITIONS.get((sender, self.state, type(msg)))
        if nxt is None:
            allowed, was = self._allowed(sender), self.state
            self.state = State.ERROR
            raise err(f"{sender.value} may not send {type(msg).__name__} in state {was.value}: "
                      f"the grid wire allows {allowed} there")
        self.state = nxt

    def _allowed(self, sender: Side) -> str:
        names = [t.__name__ for (s, st, t) in TRANSITIONS if s is sender and st is self.state]
        return ", ".join(names) or "nothing more"

    def send(self, msg: Message) -> bytes:
        self._step(self.side, msg, LocalProtocolError)
        return encode_frame(_encoder, msg)
