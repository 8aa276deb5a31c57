"""The replicator's wire between two document servers, sans-IO (the shape of ``grid/wire.py``).

Every message is one frame: ``u32 length | u8 type | msgpack body`` (array-like structs). The
**initiator** (the server whose Replicator runs the session) sends requests; the **responder**
answers each with exactly one reply, in order. ``Hello`` comes first and names the initiator (and
where its own server listens, for pull-pull) and is answered before anything else is sent; after it
the initiator may pipeline: send several requests before the replies come (at most
``MAX_OUTSTANDING_REQUESTS``), so the responder reads the next batch while the initiator applies one. ``Refused`` answers any
request it cannot serve (no such replica, access denied, a malformed document) and the session may
go on with its next database; a ``Refused`` to ``Hello`` ends the connection. Anything else out of
turn, a malformed frame or an oversized one raises Remote/LocalProtocolError and the wire stays in
``ERROR``.
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any, Union

import msgspec

from ..errors import LocalProtocolError
from ..protocol.framing import NEED_DATA, FramedWire, Frames, encode_frame  # noqa: F401 - NEED_DATA re-exported

DOC_WIRE_VERSION = 1
MAX_DOC_FRAME_BYTES = 64 * 1024 * 1024
MAX_OUTSTANDING_REQUESTS = 64


class _M(msgspec.Struct, array_like=True):
    pass


# -- requests (initiator -> responder) -------------------------------------------------------------
class Hello(_M, tag=1):
    version: int
    server: str
    listen: str = ""  # where the initiator's own docserver listens ("" if it does not)


class ListDbs(_M, tag=2):
    pass


class GetBookmarks(_M, tag=3):
    replica_id: str
    peer_db_id: str  # the initiator's database


class Changes(_M, tag=4):
    replica_id: str
    since: int
    limit: int


class Fetch(_M, tag=5):
    replica_id: str
    unids: list[str]


class PullDone(_M, tag=6):
    replica_id: str
    peer_db_id: str
    upto: int  # the responder's change number the initiator now holds everything up to


class Offer(_M, tag=7):
    replica_id: str
    entries: list[tuple[str, int, int, str]]  # unid, seq, time_us, origin


class Push(_M, tag=8):
    replica_id: str
    peer_db_id: str
    docs: list[Any]  # Doc.to_value() each
    upto: int  # with this batch applied, the responder holds the initiator's changes up to here (-1: not yet)


class PullBack(_M, tag=9):
    """pull-pull: the initiator asks the responder's Replicator to pull from it, for these replicas."""

    replica_ids: list[str]


# -- replies (responder -> initiator) ---------------------------------------------------------------
class HelloOk(_M, tag=20):
    version: int
    server: str


class DbList(_M, tag=21):
    dbs: list[tuple[str, str, str, str]]  # replica_id, db_id, title, the initiator's access


class Bookmarks(_M, tag=22):
    db_id: str
    bm_in: int  # the responder holds the initiator's changes up to here
    bm_out: int  # the initiator holds the responder's changes up to here (as the responder was told)


class ChangePage(_M, tag=23):
    entries: list[tuple[str, int, int, str]]
    last: int
    more: bool


class Docs(_M, tag=24):
    docs: list[Any]


class Want(_M, tag=25):
    unids: list[str]


class Applied(_M, tag=26):
    counts: dict[str, int]


class Ok(_M, tag=27):
    pass


class Refused(_M, tag=28):
    code: str
    message: str


Request = Union[Hello, ListDbs, GetBookmarks, Changes, Fetch, PullDone, Offer, Push, PullBack]
Reply = Union[HelloOk, DbList, Bookmarks, ChangePage, Docs, Want, Applied, Ok, Refused]
REQUESTS = tuple(Request.__args__)  # type: ignore[attr-defined]
REPLIES = tuple(Reply.__args__)  # type: ignore[attr-defined]
# The reply each request may get (besides Refused).
ANSWERS: dict[type, type] = {Hello: HelloOk, ListDbs: DbList, GetBookmarks: Bookmarks, Changes: ChangePage,
                             Fetch: Docs, PullDone: Ok, Offer: Want, Push: Applied, PullBack: Ok}
MESSAGE_TYPES: dict[int, type] = {c.__struct_config__.tag: c for c in REQUESTS + REPLIES}
_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(c) for t, c in MESSAGE_TYPES.items()}


class Side(Enum):
    INITIATOR = "initiator"
    RESPONDER = "responder"


class State(Enum):
    IDLE = "idle"  # nothing yet: the initiator's Hello comes first
    GREETING = "greeting"  # Hello sent, HelloOk awaited
    READY = "ready"  # the initiator may send a request
    WAITING = "waiting"  # requests are out; a reply answers the oldest
    DONE = "done"  # the Hello was refused
    CLOSED = "closed"
    ERROR = "error"




class DocWire(FramedWire):
    """One end of a replicator connection (``side`` is the end this object is)."""

    ERROR, CLOSED = State.ERROR, State.CLOSED

    def __init__(self, side: Side, *, max_frame_bytes: int = MAX_DOC_FRAME_BYTES) -> None:
        self.side = side
        self.peer = Side.RESPONDER if side is Side.INITIATOR else Side.INITIATOR
        self.state = State.IDLE
        self.max_frame_bytes = max_frame_bytes
        self._asked: deque[type] = deque()  # the requests not yet answered, oldest first
        self._frames = Frames(_decoders, max_frame_bytes, "replicator", "a multisite document server")

    def _step(self, sender: Side, msg: object, err: type) -> None:
        if self.state is State.ERROR:
            raise err(f"the replicator connection is broken; {type(msg).__name__} cannot be "
                      f"{'sent' if err is LocalProtocolError else 'received'}")
        t = type(msg)
        st = self.state
        if sender is Side.INITIATOR and isinstance(msg, REQUESTS) and (
                (st is State.IDLE and t is Hello) or (st in (State.READY, State.WAITING) and t is not Hello
                                                      and len(self._asked) < MAX_OUTSTANDING_REQUESTS)):
            self._asked.append(t)
            self.state = State.GREETING if t is Hello else State.WAITING
            return
        if sender is Side.RESPONDER and st in (State.GREETING, State.WAITING) and (
                t is Refused or t is ANSWERS[self._asked[0]]):
            self._asked.popleft()
            self.state = (State.DONE if (st is State.GREETING and t is Refused)
                          else State.WAITING if self._asked else State.READY)
            return
        self.state = State.ERROR
        want = (f"a {ANSWERS[self._asked[0]].__name__} or Refused" if st in (State.GREETING, State.WAITING)
                else "Hello" if st is State.IDLE else "a request" if st is State.READY else "nothing")
        raise err(f"the {sender.value} may not send {t.__name__} in state {st.value}: expected {want}")

    def send(self, msg: Request | Reply) -> bytes:
        self._step(self.side, msg, LocalProtocolError)
        return encode_frame(_encoder, msg)
