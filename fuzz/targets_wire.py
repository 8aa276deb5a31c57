"""Fuzz targets for the wires: each takes the bytes a peer could send and must end in the project's own
errors (``MultisiteError``) or in messages, never in another exception or a hang (issue 28).

A target is ``Target(name, run, seeds)``: ``run(data)`` feeds ``data`` to a fresh parser as a peer's
bytes (its first byte picks the parser's side or state and how the rest is cut into reads, so that
frames split anywhere are exercised); ``seeds()`` are real inputs made by the project's own encoders,
which the fuzzer mutates.
"""

from __future__ import annotations

import zlib

import msgspec

from multisite.delivery import message as dmsg
from multisite.grid import shard_wire, wire as gwire
from multisite.journal.records import SET, Record, Update, encode_record
from multisite.multimaster import wire as mwire
from multisite.multimaster.document import Doc
from multisite.protocol import client as pclient, packed
from multisite.protocol.connection import NEED_DATA, Connection, Role, State
from multisite.protocol.framing import NEED_DATA as FRAMED_NEED_DATA, encode_frame
from multisite.protocol.messages import (PROTOCOL_VERSION, ZSTD_STREAM_FLAG, Heartbeat, HeartbeatAck, Hello,
                                         HistoryEntry, Start, TxnBatch, Xoff, Xon)

from fuzz.target import MAX_EVENTS, Target, chunks

# -- the replication wire (protocol/connection.py) --------------------------------------------------

HIST = [HistoryEntry(1, "A", 12345)]


def _hello(name: str, stream: bool) -> Hello:
    return Hello(PROTOCOL_VERSION, name, "default", False, "primary" if name == "A" else "secondary", 4, HIST,
                 {ZSTD_STREAM_FLAG: True} if stream else {})


def _frames(first: int, n: int) -> bytes:
    return b"".join(encode_record(Record(s, 0, s, "A", 1.7e9, [Update(SET, "acct", ("k", s), b"\x01" * 8)]))
                    for s in range(first, first + n))


def _pair(stream: bool, level: int = 0) -> tuple[Connection, Connection]:
    """A source and a receiver joined in memory, both streaming from seqno 5."""
    src, rcv = Connection(Role.SOURCE, compress_level=level), Connection(Role.RECEIVER)
    rcv.receive_data(src.send(_hello("A", stream)))
    rcv.next_event()
    src.receive_data(rcv.send(_hello("B", stream)))
    src.next_event()
    rcv.receive_data(src.send(Start(5, 4, HIST)))
    rcv.next_event()
    assert src.state is rcv.state is State.STREAMING
    return src, rcv


def _connection(mode: int) -> Connection:
    """0: a receiver before any Hello; 1: a source that sent its Hello; 2: a receiver streaming from
    seqno 5; 3: the same with streamed compression agreed; 4-7: a source streaming."""
    if mode == 0:
        return Connection(Role.RECEIVER)
    if mode == 1:
        c = Connection(Role.SOURCE)
        c.send(_hello("A", True))
        return c
    if mode in (2, 3):
        return _pair(mode == 3)[1]
    return _pair(True)[0]


def run_connection(data: bytes) -> None:
    """First byte: bits 0-2 the connection's side and state (``_connection``), the rest the read size."""
    if not data:
        return
    c = _connection(data[0] & 7)
    for piece in chunks(data[1:], data[0] >> 3):
        c.receive_data(piece)
        if _drain(c):
            return
    c.receive_data(b"")
    _drain(c)


def _drain(c: Connection) -> bool:
    """Take every event out; whether the connection ended."""
    for _ in range(MAX_EVENTS):
        if c.state in (State.CLOSED, State.ERROR):
            return True
        ev = c.next_event()
        if ev is NEED_DATA:
            return False
        if ev is State.CLOSED:
            return True
    raise AssertionError(f"next_event gave {MAX_EVENTS} events out of one input: a loop")


def seeds_connection() -> list[bytes]:
    out = [bytes([0]) + Connection(Role.SOURCE).send(_hello("A", False))]
    src, rcv = _pair(True)
    out.append(bytes([1]) + _hello_answer(True))
    out.append(bytes([4]) + b"".join(rcv.send(m) for m in (HeartbeatAck(1, 1.7e9, 3, 4), Xoff(4), Xon(5))))
    for mode, stream, level in ((2, False, 0), (2, False, 3), (3, True, 3), (3 | 64, True, 3)):
        s, _ = _pair(stream, level)
        body = b"".join(s.send(TxnBatch(f, f + 2, _frames(f, 3))) for f in (5, 8, 11))
        out.append(bytes([mode]) + body + s.send(Heartbeat(1, 1.7e9, 13)))
    return out


def _hello_answer(stream: bool) -> bytes:
    r = Connection(Role.RECEIVER)
    r.receive_data(Connection(Role.SOURCE).send(_hello("A", stream)))
    r.next_event()
    return r.send(_hello("B", stream))


def run_packed(data: bytes) -> None:
    """``packed.unpack``: its contract is ValueError or a msgspec error for a malformed batch, which
    the connection turns into RemoteProtocolError; anything else is a crash."""
    try:
        packed.unpack(1 + (data[:1] or b"\0")[0], data[1:], max_bytes=1 << 20)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        pass


def seeds_packed() -> list[bytes]:
    return [bytes([4]) + packed.pack(5, _frames(5, n)) for n in (1, 3, 20)]


# -- the client protocol (protocol/client.py) -------------------------------------------------------

def run_client(data: bytes) -> None:
    s = pclient.ClientSession(max_frame_bytes=1 << 20)
    for piece in chunks(data[1:], (data[:1] or b"\0")[0]):
        s.feed(piece)
        s.parse()
        for _ in range(MAX_EVENTS):
            req = s.next_runnable()
            if req is None:
                break
            s.answer(req, True, None)
        s.replies()


def seeds_client() -> list[bytes]:
    reqs = [[1, "get", {"region": "acct", "key": ["k", 1]}], [2, "commit", {"ops": [[1, "acct", ["k"], b"v"]]}],
            [3, "items", {"region": "acct", "start": None, "stop": None, "limit": 10, "inclusive": True}],
            [4, "info", {}]]
    return [bytes([0]) + b"".join(pclient.encode(r) for r in reqs), bytes([7]) + pclient.encode(reqs[0])]


# -- the framed wires: the grid's catalog wire and the document servers' replicator wire -----------

def _feed_framed(w, data: bytes, cut: int) -> None:
    for piece in chunks(data, cut):
        w.receive_data(piece)
        if _drain_framed(w):
            return
    w.receive_data(b"")
    _drain_framed(w)


def _drain_framed(w) -> bool:
    for _ in range(MAX_EVENTS):
        if w.state is w.ERROR or w.state is w.CLOSED:
            return True
        ev = w.next_event()
        if ev is FRAMED_NEED_DATA:
            return False
        if ev is None:
            return True
    raise AssertionError(f"next_event gave {MAX_EVENTS} events out of one input: a loop")


REGISTER = gwire.Register(1, "orders", "c1", None, "127.0.0.1:7000", 8)


def run_grid(data: bytes) -> None:
    """Bit 0: the catalog's end (a member's bytes) or a member's; bit 1: the member registered first."""
    if not data:
        return
    catalog = bool(data[0] & 1)
    w = gwire.GridWire(gwire.Side.CATALOG if catalog else gwire.Side.MEMBER, max_frame_bytes=1 << 20)
    if not catalog and data[0] & 2:
        w.send(REGISTER)
    _feed_framed(w, data[1:], data[0] >> 2)


def seeds_grid() -> list[bytes]:
    enc = gwire._encoder
    view = gwire.View(3, "c1", "127.0.0.1:7000", ["c2"], [], 1)
    member = [REGISTER, gwire.Heartbeat("c1", 2, {0: 10, 1: 4}, {0: (3, ["c2"])}, 1, {0: {"up": True}})]
    catalog = [gwire.Assignments("orders", 2, {0: "primary", 1: "sync"}, 0.25, {0: view}, 1.0, 2, {}),
               gwire.HeartbeatAck(1, [1]), gwire.Refused("NAME_IN_USE", "c1 is taken")]
    return [bytes([1]) + b"".join(encode_frame(enc, m) for m in member),
            bytes([1]) + encode_frame(enc, gwire.StatusRequest("u", "p")),
            bytes([1]) + encode_frame(enc, gwire.Operate("drain", {"name": "c1"}, None, None)),
            bytes([2]) + b"".join(encode_frame(enc, m) for m in catalog)]


def run_shard(data: bytes) -> None:
    """Bit 0: the container's end (a client's or a replica's bytes) or the client's."""
    if not data:
        return
    w = shard_wire.DataWire(server=bool(data[0] & 1), max_frame_bytes=1 << 20)
    for piece in chunks(data[1:], data[0] >> 1):
        w.receive_data(piece)
        for _ in range(MAX_EVENTS):
            if w.broken or w.next_event() is None:
                break
        if w.broken:
            return


def seeds_shard() -> list[bytes]:
    sw = shard_wire
    to_server = [sw.Open(1, "orders", "u", "p"), sw.Commit(1, 0, 2, [(1, "m", [5], b"\x05")]), sw.Read(2, 0, "m", [5]),
                 sw.Subscribe(1, "orders", 0, 2, "c2", "sync", 10, [(10, b"d" * 8)]), sw.Voted(1, True, 11, ""),
                 sw.Progress(11)]
    to_client = [sw.Opened("c1"), sw.Done(1, 11, None), sw.Failed(2, "NOT_PRIMARY", "moved", {"epoch": 3}),
                 sw.Resync(9, "cut back"), sw.Checkpoint(9, b"d" * 8, {"m": (True, None)}, 1),
                 sw.Rows([("m", b"k", b"v")]), sw.CheckpointEnd(1), sw.Frames(10, _frames(10, 2), [], 1),
                 sw.Outcome(1, True, 11)]
    return [bytes([1]) + b"".join(sw.encode(m) for m in to_server),
            bytes([0]) + b"".join(sw.encode(m) for m in to_client)]


UNID = "0123456789abcdef0123456789abcdef"
SESSION_REQUESTS = [mwire.ListDbs(), mwire.GetBookmarks("r1", "d1"), mwire.Changes("r1", 0, 100),
                    mwire.Fetch("r1", [UNID]), mwire.Offer("r1", [(UNID, 2, 17, "d1")]), mwire.Push("r1", "d1", [], 3),
                    mwire.PullDone("r1", "d1", 3)]


def run_docwire(data: bytes) -> None:
    """Bit 0: the initiator's end (a responder's bytes; bit 1: its Hello answered and a session's requests
    sent first) or the responder's
    (which answers each request: HelloOk to a Hello, Refused to the others)."""
    if not data:
        return
    side = mwire.Side.INITIATOR if data[0] & 1 else mwire.Side.RESPONDER
    w = mwire.DocWire(side, max_frame_bytes=1 << 20)
    if side is mwire.Side.INITIATOR:
        if data[0] & 2:
            w.send(mwire.Hello(1, "B", "127.0.0.1:9"))
            w.receive_data(encode_frame(mwire._encoder, mwire.HelloOk(1, "A")))
            w.next_event()
            for req in SESSION_REQUESTS:  # pipelined, as a session sends them: answers come in order
                w.send(req)
        _feed_framed(w, data[1:], data[0] >> 2)
        return
    for piece in chunks(data[1:], data[0] >> 2):
        w.receive_data(piece)
        for _ in range(MAX_EVENTS):
            if w.state in (w.ERROR, w.CLOSED, mwire.State.DONE):
                return
            ev = w.next_event()
            if ev is FRAMED_NEED_DATA or ev is None:
                break
            w.send(mwire.HelloOk(1, "A") if isinstance(ev, mwire.Hello) else mwire.Refused("X", "no"))


def seeds_docwire() -> list[bytes]:
    enc, mw = mwire._encoder, mwire
    unid = "0123456789abcdef0123456789abcdef"
    reqs = [mw.Hello(1, "B", "127.0.0.1:9"), mw.ListDbs(), mw.GetBookmarks("r1", "d1"), mw.Changes("r1", 0, 100),
            mw.Fetch("r1", [unid]), mw.Offer("r1", [(unid, 2, 17, "d1")]), mw.Push("r1", "d1", [], 3),
            mw.PullDone("r1", "d1", 3)]
    answers = [mw.DbList([("r1", "d1", "P", "writer")]), mw.Bookmarks("d1", 3, 4),
               mw.ChangePage([(unid, 2, 17, "d1")], 9, False), mw.Docs([]), mw.Want([unid]), mw.Applied({"new": 1}),
               mw.Refused("ACCESS_DENIED", "reader")]
    return [bytes([0]) + b"".join(encode_frame(enc, m) for m in reqs),
            bytes([3]) + b"".join(encode_frame(enc, m) for m in answers)]


def run_document(data: bytes) -> None:
    """A received version (``Doc.from_value`` of msgpack from a peer) and what a session reads of it."""
    try:
        v = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return  # not msgpack: the wire refused it before (framing.py)
    d = Doc.from_value(v)
    d.stamp, d.oid, d.public(), d.to_value(), d.is_conflict, d.stamp_at(1)


def seeds_document() -> list[bytes]:
    unid = "0123456789abcdef0123456789abcdef"
    v = [unid, "F", {"a": 1, "b": "x"}, 2, 1_700_000_000_000_000, "db1", [[1_699_999_999_000_000, "db1"]],
         {"a": 1, "b": 2}, False, True, []]
    return [msgspec.msgpack.encode(v), msgspec.msgpack.encode([*v[:10], [[1, 2, "db2"]]])]


# -- delivery messages (delivery/message.py) -------------------------------------------------------

KEY = b"k" * 32


def run_delivery(data: bytes) -> None:
    """A message file as it arrives in an inbox. First byte: bit 0 makes its checksum right first (so
    that mutations reach the checks behind it), bit 1 peeks at the sender, bit 2 decodes with a key."""
    if not data:
        return
    body = data[1:]
    if data[0] & 1 and len(body) >= 4:
        body = body[:-4] + zlib.crc32(body[:-4]).to_bytes(4, "little")
    if data[0] & 2:
        dmsg.peek_sender(body, "fuzz.msg")
    m = dmsg.decode(body, "fuzz.msg", key=KEY if data[0] & 4 else None)
    m.name, m.group, m.is_data


def seeds_delivery() -> list[bytes]:
    tx = dmsg.Tx(4096, 7, [Update(SET, "orders", ("hq", 1), b"\x81\xa4site\xa2fr")])
    m = dmsg.Message("HQ", "P", 1, 0, 4096, 0, 1, 0, 0, False, 0, False, 4096, 1.7e9, [tx], 0)
    return [bytes([1]) + dmsg.encode(m), bytes([5]) + dmsg.encode(m, key=KEY), bytes([3]) + dmsg.encode(m)]


TARGETS = {t.name: t for t in [
    Target("protocol_connection", run_connection, seeds_connection),
    Target("protocol_packed", run_packed, seeds_packed),
    Target("protocol_client", run_client, seeds_client),
    Target("grid_wire", run_grid, seeds_grid),
    Target("grid_shard_wire", run_shard, seeds_shard),
    Target("multimaster_wire", run_docwire, seeds_docwire),
    Target("multimaster_document", run_document, seeds_document),
    Target("delivery_message", run_delivery, seeds_delivery),
]}
