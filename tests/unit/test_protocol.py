"""The replication protocol as a sans-IO state machine: joined in memory, driven off its table, fuzzed.

Two ``Connection`` objects (a source and a receiver) exchange bytes directly, with no sockets: a full
handshake and stream, every transition the table does not allow, the smaller frame limit before
streaming, and Hypothesis feeding the parser random, truncated, oversized, unknown, corrupted and
out-of-order input. The invariants:

- a bad input raises ``RemoteProtocolError`` (a bad send ``LocalProtocolError``) and leaves the
  connection in ``ERROR`` for good;
- nothing from a bad frame is ever returned: a ``TxnBatch`` comes out only when every journal frame in
  it is intact and its seqnos continue the stream;
- any legal conversation survives any chunking of the byte stream unchanged.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from multisite import errors
from multisite.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from multisite.journal.records import FRAME_HEADER_SIZE, SET, Record, Update, encode_record, parse_header
from multisite.protocol.client import FrameBuffer
from multisite.protocol.client import encode as client_encode
from multisite.protocol.connection import NEED_DATA, RECV, SEND, TRANSITIONS, Connection, Role, State
from multisite.protocol.messages import (COMPRESSED, FRAME_PREFIX, HANDSHAKE_FRAME_BYTES, MESSAGE_TYPES,
                                         PROTOCOL_VERSION, Error, Heartbeat, HeartbeatAck, Hello, HistoryEntry,
                                         Start, TxnBatch, Xoff, Xon, RefusalCode, decode_body, encode_message,
                                         error_for)

S, R = Role.SOURCE, Role.RECEIVER
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- building blocks -------------------------------------------------------------------------------

def journal_frames(first: int, n: int, value_bytes: int = 8) -> bytes:
    """``n`` real journal frames (as the journal writes them) for seqnos ``first``..``first+n-1``."""
    return b"".join(encode_record(Record(s, 0, s, "A", 1700000000.0,
                                         [Update(SET, "acct", ("k", s), bytes([s % 251]) * value_bytes)]))
                    for s in range(first, first + n))


def batch(first: int, n: int, value_bytes: int = 8) -> TxnBatch:
    return TxnBatch(first, first + n - 1, journal_frames(first, n, value_bytes))


def hello(name: str, seqno: int = 0, *, version: int = PROTOCOL_VERSION) -> Hello:
    return Hello(version, name, "default", False, "primary" if name == "A" else "secondary", seqno,
                 [HistoryEntry(1, "A", 12345)], {"compress": 0})


def deliver(data: bytes, conn: Connection) -> list:
    """Feed ``data`` and take out every complete event (stopping at NEED_DATA or CLOSED)."""
    conn.receive_data(data)
    out = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA or ev is State.CLOSED:
            return out
        out.append(ev)


def handshake(src_seqno: int = 10, rcv_seqno: int = 4, **src_kw) -> tuple[Connection, Connection]:
    """A source and a receiver joined in memory, both STREAMING from ``rcv_seqno + 1``."""
    src, rcv = Connection(S, **src_kw), Connection(R)
    assert deliver(src.send(hello("A", src_seqno)), rcv) == [hello("A", src_seqno)]
    assert deliver(rcv.send(hello("B", rcv_seqno)), src) == [hello("B", rcv_seqno)]
    start = Start(rcv_seqno + 1, rcv_seqno, [HistoryEntry(1, "A", 12345)])
    assert deliver(src.send(start), rcv) == [start]
    assert src.state is rcv.state is State.STREAMING
    return src, rcv


def check_batch_independently(b: TxnBatch, expect_first: int) -> None:
    """What a TxnBatch coming out of next_event must satisfy, checked without the code under test."""
    assert b.first_seqno == expect_first
    off, seqno = 0, b.first_seqno
    while off < len(b.frames):
        length, s, pcrc, hcrc = struct.unpack_from("<IQII", b.frames, off)
        assert zlib.crc32(b.frames[off:off + 16]) == hcrc
        assert zlib.crc32(b.frames[off + FRAME_HEADER_SIZE:off + FRAME_HEADER_SIZE + length]) == pcrc
        assert s == seqno
        off += FRAME_HEADER_SIZE + length
        seqno += 1
    assert off == len(b.frames) and seqno - 1 == b.last_seqno >= b.first_seqno


# One sample of every message type, for the transition tables.
SAMPLES = {
    Hello: hello("P", 3),
    Start: Start(4, 3, [HistoryEntry(1, "A", 12345)]),
    TxnBatch: batch(1, 2),
    Heartbeat: Heartbeat(1, 1700000000.0, 10),
    HeartbeatAck: HeartbeatAck(1, 1700000000.0, 9, 10),
    Xoff: Xoff(10),
    Xon: Xon(11),
}


def reach(role: Role, state: State) -> Connection:
    """A connection of ``role`` driven into ``state`` through legal moves only (peer bytes are
    framed directly with encode_message, so no second state machine is involved)."""
    c = Connection(role)
    steps = {
        (S, State.IDLE): [],
        (S, State.HELLO_SENT): [(SEND, hello("A"))],
        (S, State.NEGOTIATING): [(SEND, hello("A")), (RECV, hello("B"))],
        (S, State.STREAMING): [(SEND, hello("A")), (RECV, hello("B")), (SEND, Start(1, 0, []))],
        (R, State.IDLE): [],
        (R, State.HELLO_RECEIVED): [(RECV, hello("A"))],
        (R, State.WAIT_START): [(RECV, hello("A")), (SEND, hello("B"))],
        (R, State.STREAMING): [(RECV, hello("A")), (SEND, hello("B")), (RECV, Start(1, 0, []))],
    }
    if state is State.CLOSED:
        c.send(Error("TEST", "closing"))
    elif state is State.ERROR:
        c.receive_data(b"\xff" * 8)
        with pytest.raises(RemoteProtocolError):
            c.next_event()
    else:
        for direction, msg in steps[(role, state)]:
            if direction == SEND:
                c.send(msg)
            else:
                assert deliver(encode_message(msg), c) == [msg]
    assert c.state is state
    return c


def live_states(role: Role) -> list[State]:
    return sorted({st_ for (r, st_, _, _) in TRANSITIONS if r is role} | {State.IDLE}, key=lambda s: s.value)


def assert_stuck_in_error(c: Connection) -> None:
    """A failed connection stays failed: it neither parses nor sends anything more."""
    assert c.state is State.ERROR
    c.receive_data(encode_message(SAMPLES[Heartbeat]))
    with pytest.raises(RemoteProtocolError):
        c.next_event()
    with pytest.raises(LocalProtocolError):
        c.send(Error("X", "y"))
    assert c.state is State.ERROR


# -- the happy path --------------------------------------------------------------------------------

def test_full_handshake_and_stream_in_memory():
    src, rcv = handshake(src_seqno=10, rcv_seqno=4)
    assert rcv.peer_hello == hello("A", 10) and src.peer_hello == hello("B", 4)
    assert rcv.next_seqno == 5

    sent = [batch(5, 3), Heartbeat(1, 1.5, 10), batch(8, 1), batch(9, 2)]
    got = deliver(b"".join(src.send(m) for m in sent), rcv)
    assert got == sent
    assert [s for s, _ in got[0].run().frames()] == [5, 6, 7]
    assert rcv.next_seqno == 11

    back = [HeartbeatAck(1, 1.5, 8, 10), Xoff(10), Xon(11)]
    assert deliver(b"".join(rcv.send(m) for m in back), src) == back

    # Either side may end with an Error; both are then CLOSED, and end of stream reads as CLOSED.
    err = Error("SHUTDOWN", "source stopping", 10)
    assert deliver(src.send(err), rcv) == [err]
    assert src.state is rcv.state is State.CLOSED
    rcv.receive_data(b"")
    assert rcv.next_event() is State.CLOSED
    assert src.bytes_out == rcv.bytes_in


def test_refusal_during_the_handshake_closes_both_sides():
    src, rcv = Connection(S), Connection(R)
    deliver(src.send(hello("A", 5)), rcv)
    refusal = Error(RefusalCode.GROUP_MISMATCH, "A belongs to group 'x'", -1)
    assert deliver(rcv.send(refusal), src) == [refusal]
    assert src.state is rcv.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        src.send(Start(1, 0, []))


def test_refusal_codes_travel_as_their_plain_text():
    """The enum changed no byte on the wire: a member encodes as its string, and an Error from a peer
    (a plain str code) compares equal to the member."""
    for code in RefusalCode:
        assert encode_message(Error(code, "m", 7)) == encode_message(Error(code.value, "m", 7))
        got = decode_body(Error.__struct_config__.tag, encode_message(Error(code, "m", 7))[FRAME_PREFIX.size:])
        assert got.code == code and f"{got.code}" == f"{code}" == code.value


def test_every_protocol_error_has_a_wire_code():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, ProtocolError)]
    assert {c.code for c in classes} <= {c.value for c in RefusalCode}
    for c in classes:
        err = error_for(c("what went wrong"))
        assert err.code is RefusalCode(c.code) and err.message == "what went wrong"


def test_the_documented_error_codes_are_the_enum():
    """docs/protocol.md §9 lists every code an Error carries, and only those."""
    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    table = doc[doc.index("## 9. Error codes"):]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    assert documented == {c.value for c in RefusalCode}


def test_a_checked_batch_knows_where_each_journal_frame_ends():
    b = batch(7, 4)
    src, rcv = handshake(src_seqno=10, rcv_seqno=6)
    rcv.receive_data(src.send(b))
    parts = list(rcv.next_event().run().frames())
    assert [s for s, _ in parts] == [7, 8, 9, 10]
    assert b"".join(f for _, f in parts) == b.frames
    assert all(parse_header(f).seqno == s for s, f in parts)


@pytest.mark.parametrize("level", [1, 3, 19])
def test_compressed_batches_round_trip_and_shrink(level):
    src, rcv = handshake(src_seqno=500, rcv_seqno=0, compress_level=level)
    b = batch(1, 200, value_bytes=64)
    data = src.send(b)
    assert data[4] & COMPRESSED
    assert len(data) * 3 < len(encode_message(b))
    assert deliver(data, rcv) == [b]
    # Small messages and non-batches travel uncompressed.
    assert not src.send(Heartbeat(1, 0.0, 500))[4] & COMPRESSED


def test_compressed_body_that_expands_past_the_frame_limit_is_refused():
    """A zstd 'bomb': small on the wire, larger than max_frame_bytes once decompressed."""
    src, rcv = handshake(src_seqno=100, rcv_seqno=0, compress_level=3)
    rcv.max_frame_bytes = 4096
    data = src.send(batch(1, 100, value_bytes=1000))
    assert len(data) < 4096
    with pytest.raises(RemoteProtocolError, match="decompress"):
        deliver(data, rcv)
    assert_stuck_in_error(rcv)


# -- the tables ------------------------------------------------------------------------------------

def illegal_moves():
    for role in (S, R):
        for state in live_states(role) + [State.CLOSED]:
            for direction in (SEND, RECV):
                for t in SAMPLES:
                    if (role, state, direction, t) not in TRANSITIONS:
                        yield pytest.param(role, state, direction, t,
                                           id=f"{role.value}-{state.value}-{direction}-{t.__name__}")


@pytest.mark.parametrize("role,state,direction,mtype", list(illegal_moves()))
def test_every_illegal_transition_raises_and_stays_in_error(role, state, direction, mtype):
    c = reach(role, state)
    msg = SAMPLES[mtype]
    if direction == SEND:
        with pytest.raises(LocalProtocolError):
            c.send(msg)
    else:
        c.receive_data(encode_message(msg))
        with pytest.raises(RemoteProtocolError):
            c.next_event()
    assert_stuck_in_error(c)


@pytest.mark.parametrize("role,state,direction,mtype,nxt",
                         [pytest.param(*k, v, id=f"{k[0].value}-{k[1].value}-{k[2]}-{k[3].__name__}")
                          for k, v in TRANSITIONS.items()])
def test_every_legal_transition_moves_as_the_table_says(role, state, direction, mtype, nxt):
    c = reach(role, state)
    msg = SAMPLES[mtype]
    if mtype is TxnBatch:
        msg = batch(c.next_seqno or 1, 2)
    if direction == SEND:
        c.send(msg)
    else:
        assert deliver(encode_message(msg), c) == [msg]
    assert c.state is nxt


@pytest.mark.parametrize("role", [S, R])
def test_error_is_legal_in_every_live_state_both_ways(role):
    for state in live_states(role):
        c = reach(role, state)
        c.send(Error("X", "y"))
        assert c.state is State.CLOSED
        c = reach(role, state)
        assert deliver(encode_message(Error("X", "y")), c) == [Error("X", "y")]
        assert c.state is State.CLOSED


def test_receiver_refuses_a_second_hello_before_answering():
    c = Connection(R)
    c.receive_data(encode_message(hello("A")) * 2)
    assert c.next_event() == hello("A")
    with pytest.raises(RemoteProtocolError):
        c.next_event()
    assert_stuck_in_error(c)


def test_protocol_version_is_checked_both_ways():
    with pytest.raises(LocalProtocolError, match="version"):
        Connection(S).send(hello("A", version=PROTOCOL_VERSION + 1))
    c = Connection(R)
    c.receive_data(encode_message(hello("A", version=PROTOCOL_VERSION + 1)))
    with pytest.raises(RemoteProtocolError, match="version"):
        c.next_event()
    assert_stuck_in_error(c)


@pytest.mark.parametrize("bad", [Start(0, 0, []), Start(-3, 0, [])])
def test_start_below_seqno_one_is_refused(bad):
    c = reach(R, State.WAIT_START)
    c.receive_data(encode_message(bad))
    with pytest.raises(RemoteProtocolError, match="Start"):
        c.next_event()
    assert_stuck_in_error(c)


def test_xon_below_seqno_one_is_refused():
    c = reach(S, State.STREAMING)
    c.receive_data(encode_message(Xon(0)))
    with pytest.raises(RemoteProtocolError, match="Xon"):
        c.next_event()
    assert_stuck_in_error(c)


# -- malformed input, one case each ----------------------------------------------------------------

def bad(conn: Connection, data: bytes, match: str | None = None) -> None:
    conn.receive_data(data)
    with pytest.raises(RemoteProtocolError, match=match):
        while conn.next_event() is not NEED_DATA:
            pass
    assert_stuck_in_error(conn)


def test_zero_length_frame():
    bad(reach(R, State.STREAMING), b"\0\0\0\0\x04", "frame length")


def test_oversized_length_is_refused_before_the_body_arrives():
    c = reach(R, State.STREAMING)
    c.max_frame_bytes = 1 << 20
    bad(c, FRAME_PREFIX.pack((1 << 20) + 2, 3), "frame length")


def test_unknown_type_is_refused_before_the_body_arrives():
    bad(reach(R, State.STREAMING), FRAME_PREFIX.pack(1000, 0x42), "unknown message type")


def test_truncated_frame_at_end_of_stream():
    c = reach(R, State.STREAMING)
    data = encode_message(batch(1, 3))
    c.receive_data(data[:-1])
    assert c.next_event() is NEED_DATA
    bad(c, b"", "middle of a frame")


def test_valid_prefix_with_garbage_body():
    bad(reach(R, State.STREAMING), FRAME_PREFIX.pack(4, 4) + b"\xc1\xc1\xc1", "malformed Heartbeat")


def test_body_of_the_wrong_shape():
    body = msgspec.msgpack.encode(["not", "a", "heartbeat"])
    bad(reach(R, State.STREAMING), FRAME_PREFIX.pack(len(body) + 1, 4) + body, "malformed Heartbeat")


def test_a_string_that_is_not_utf8():
    """msgspec raises UnicodeDecodeError for it, which must become a protocol error like any other
    malformed body (it escaped, and a Source Server's task died of it)."""
    hello = Connection(Role.SOURCE).send(Hello(1, "AAAA", "g", False, "primary", 0, []))
    bad(Connection(Role.RECEIVER), hello.replace(b"AAAA", b"\xff\xfe\xfd\xfc"), "malformed Hello")  # the name


def test_compressed_flag_on_garbage():
    bad(reach(R, State.STREAMING), FRAME_PREFIX.pack(9, 3 | COMPRESSED) + b"notzstd!", "decompress")


def test_batch_not_starting_where_the_stream_stands():
    c = reach(R, State.STREAMING)  # streaming from seqno 1
    bad(c, encode_message(batch(2, 3)), "expected 1")


def test_the_same_batch_twice():
    c = reach(R, State.STREAMING)
    assert deliver(encode_message(batch(1, 3)), c) == [batch(1, 3)]
    bad(c, encode_message(batch(1, 3)), "expected 4")


def test_batch_with_a_gap_inside():
    frames = journal_frames(1, 2) + journal_frames(4, 1)
    bad(reach(R, State.STREAMING), encode_message(TxnBatch(1, 3, frames)), "where 3 was expected")


def test_batch_whose_claimed_range_does_not_match_its_frames():
    bad(reach(R, State.STREAMING), encode_message(TxnBatch(1, 5, journal_frames(1, 3))), "claims")


def test_empty_batch():
    bad(reach(R, State.STREAMING), encode_message(TxnBatch(1, 0, b"")), "claims")


def test_batch_with_a_flipped_payload_bit():
    frames = bytearray(journal_frames(1, 3))
    frames[-3] ^= 0x10
    bad(reach(R, State.STREAMING), encode_message(TxnBatch(1, 3, bytes(frames))), "checksum")


# -- the handshake's frame limit ---------------------------------------------------------------------
# Before streaming, a frame may be at most HANDSHAKE_FRAME_BYTES (Hello, Start and Error are small).
# Every connection used to accept a 64 MiB first frame from a peer nobody had vouched for yet: a
# receiver buffered up to 64 MiB per connection still in its handshake (eight connections: 500 MiB).

@pytest.mark.parametrize("role,state", [(R, State.IDLE), (R, State.WAIT_START), (S, State.HELLO_SENT)])
def test_a_large_frame_before_streaming_is_refused_at_its_prefix(role, state):
    c = reach(role, state)
    c.receive_data(FRAME_PREFIX.pack(HANDSHAKE_FRAME_BYTES + 2, 1))
    with pytest.raises(RemoteProtocolError, match="handshake"):
        c.next_event()
    assert_stuck_in_error(c)


def test_handshake_messages_up_to_the_limit_still_pass():
    big = hello("A")
    big.history = [HistoryEntry(i + 1, "A" * 40, i) for i in range(5000)]  # ~300 KB of history
    c = Connection(R)
    c.receive_data(encode_message(big))
    assert c.next_event() == big


def test_streaming_keeps_the_full_frame_limit():
    src, rcv = handshake(src_seqno=3000, rcv_seqno=0)
    b = batch(1, 3000, value_bytes=600)
    data = src.send(b)
    assert len(data) > HANDSHAKE_FRAME_BYTES
    rcv.receive_data(data)
    assert rcv.next_event() == b and rcv.next_event() is NEED_DATA


# -- Hypothesis: the parser under hostile input -----------------------------------------------------

def drain(conn: Connection, chunks: list[bytes], eof: bool) -> tuple[list, Exception | None]:
    """Feed chunks (then EOF), taking events out after each; stop at the first protocol error."""
    events: list = []
    try:
        for ch in [c for c in chunks if c] + ([b""] if eof else []):  # b"" is end of stream
            conn.receive_data(ch)
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA or ev is State.CLOSED:
                    break
                events.append(ev)
    except RemoteProtocolError as e:
        return events, e
    return events, None


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


fuzz_targets = st.sampled_from([(R, State.IDLE), (R, State.WAIT_START), (R, State.STREAMING),
                                (S, State.HELLO_SENT), (S, State.STREAMING)])


def assert_failed_cleanly(conn: Connection, events: list, err: Exception | None) -> None:
    """Either the input was (harmlessly) incomplete, or it failed with RemoteProtocolError and the
    connection is stuck in ERROR; every batch that came out is intact."""
    expect = 1
    for ev in events:
        if isinstance(ev, TxnBatch):
            check_batch_independently(ev, expect)
            expect = ev.last_seqno + 1
    if err is not None:
        assert conn.state is State.ERROR
        assert_stuck_in_error(conn)


@FUZZ
@given(target=fuzz_targets, data=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 2000), max_size=8),
       eof=st.booleans())
def test_random_bytes(target, data, cuts, eof):
    conn = reach(*target)
    events, err = drain(conn, chunked(data, cuts), eof)
    assert_failed_cleanly(conn, events, err)
    if eof and err is None:
        assert conn.next_event() is State.CLOSED  # EOF mid-frame would have raised


frame_types = st.one_of(st.sampled_from(sorted(MESSAGE_TYPES)), st.integers(0, 255))


@FUZZ
@given(target=fuzz_targets, t=frame_types, compressed=st.booleans(), body=st.binary(max_size=600),
       length_delta=st.integers(-3, 3), eof=st.booleans())
def test_plausible_prefix_with_random_body(target, t, compressed, body, length_delta, eof):
    """A well-formed prefix (so the parser gets past it) around a random body."""
    conn = reach(*target)
    ty = (t | COMPRESSED) if compressed else t
    data = FRAME_PREFIX.pack(max(0, len(body) + 1 + length_delta), ty & 0xFF) + body
    events, err = drain(conn, [data], eof)
    assert_failed_cleanly(conn, events, err)
    if (ty & ~COMPRESSED) not in MESSAGE_TYPES:
        assert err is not None and ("unknown message type" in str(err) or "frame length" in str(err))


@FUZZ
@given(length=st.integers(0, 2**32 - 1), t=st.integers(0, 255), max_frame=st.sampled_from([16, 4096, 1 << 20]))
def test_lengths_outside_the_limit_are_refused_at_once(length, t, max_frame):
    conn = reach(R, State.STREAMING)
    conn.max_frame_bytes = max_frame
    events, err = drain(conn, [FRAME_PREFIX.pack(length, t)], eof=False)
    assert events == []
    if length <= 1 or length - 1 > max_frame or (t & ~COMPRESSED) not in MESSAGE_TYPES:
        assert err is not None  # (length 1: a complete frame with an empty body, which is no message)
        assert_stuck_in_error(conn)
    else:
        assert err is None and conn.next_event() is NEED_DATA  # waits for the body


@FUZZ
@given(n=st.integers(1, 6), value_bytes=st.integers(0, 200), cut=st.integers(0, 10_000))
def test_truncated_frames_wait_then_fail_at_end_of_stream(n, value_bytes, cut):
    conn = reach(R, State.STREAMING)
    data = encode_message(batch(1, n, value_bytes))
    cut = cut % len(data)
    events, err = drain(conn, [data[:cut]], eof=False)
    assert events == [] and err is None and conn.next_event() is NEED_DATA
    events, err = drain(conn, [], eof=True)
    assert events == []
    if cut == 0:
        assert err is None and conn.state is State.CLOSED
    else:
        assert isinstance(err, RemoteProtocolError)
        assert_stuck_in_error(conn)


corruptions = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(1, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("drop_frame"), st.integers(0, 100), st.just(0)),
    st.tuples(st.just("swap_frames"), st.integers(0, 100), st.just(0)),
)


def _split(data: bytes):
    """``(seqno, frame)`` of each frame of intact bytes, by their headers (independent of the code under test)."""
    off = 0
    while off < len(data):
        hdr = parse_header(data, off)
        yield hdr.seqno, data[off:off + hdr.total]
        off += hdr.total


def corrupt(frames: bytes, how: tuple[str, int, int]) -> bytes:
    kind, pos, arg = how
    parts = [f for _, f in _split(frames)]
    if kind == "flip":
        p = pos % len(frames)
        return frames[:p] + bytes([frames[p] ^ arg]) + frames[p + 1:]
    if kind == "cut":
        return frames[: len(frames) - 1 - pos % len(frames)]
    if kind == "insert":
        p = pos % (len(frames) + 1)
        return frames[:p] + bytes([arg]) + frames[p:]
    if kind == "drop_frame":
        del parts[pos % len(parts)]
        return b"".join(parts)
    i = pos % len(parts)
    j = (i + 1) % len(parts)
    parts[i], parts[j] = parts[j], parts[i]
    return b"".join(parts)


@FUZZ
@given(good=st.integers(0, 4), n=st.integers(2, 6), how=corruptions, compress=st.sampled_from([0, 3]),
       cuts=st.lists(st.integers(0, 10**5), max_size=6))
def test_nothing_is_returned_from_a_damaged_batch(good, n, how, compress, cuts):
    """``good`` intact batches, then one whose journal frames were damaged, then another intact one:
    the intact ones come out, the damaged one raises, nothing after it is parsed."""
    src, rcv = handshake(src_seqno=100, rcv_seqno=0, compress_level=compress)
    batches = [batch(1 + 3 * i, 3) for i in range(good)]
    first = 1 + 3 * good
    damaged_frames = corrupt(journal_frames(first, n), how)
    assume(damaged_frames != journal_frames(first, n))
    damaged = TxnBatch(first, first + n - 1, damaged_frames)
    after = batch(first + n, 2)
    data = b"".join(src.send(b) for b in batches) + src.send(damaged) + src.send(after)
    events, err = drain(rcv, chunked(data, cuts), eof=False)
    assert events == batches
    assert isinstance(err, RemoteProtocolError)
    assert_stuck_in_error(rcv)


@FUZZ
@given(expect=st.integers(1, 50), first=st.integers(-5, 60), n=st.integers(1, 4))
def test_out_of_order_batches(expect, first, n):
    assume(first != expect)
    src, rcv = handshake(src_seqno=100, rcv_seqno=expect - 1)
    b = TxnBatch(first, first + n - 1, journal_frames(max(first, 0), n)) if first >= 0 else \
        TxnBatch(first, first + n - 1, b"")
    events, err = drain(rcv, [encode_message(b)], eof=False)
    assert events == [] and isinstance(err, RemoteProtocolError)
    assert_stuck_in_error(rcv)


# Strategies for every message, with arbitrary contents.
names = st.text(min_size=1, max_size=12)
seqnos = st.integers(1, 2**40)
floats = st.floats(allow_nan=False, allow_infinity=False)
entries = st.lists(st.builds(HistoryEntry, st.integers(1, 2**40), names, st.integers(0, 2**62), names,
                             st.integers(0, 15), st.integers(0, 2**40)), max_size=4)
hellos = st.builds(Hello, st.just(PROTOCOL_VERSION), names, names, st.booleans(), names, st.integers(0, 2**40),
                   entries, st.dictionaries(names, st.one_of(st.booleans(), st.integers(-5, 5), names), max_size=3))
starts = st.builds(Start, seqnos, st.integers(0, 2**40), entries)
heartbeats = st.builds(Heartbeat, st.integers(0, 2**31), floats, st.integers(0, 2**40))
acks = st.builds(HeartbeatAck, st.integers(0, 2**31), floats, st.integers(0, 2**40), st.integers(0, 2**40))
xoffs = st.builds(Xoff, st.integers(0, 2**40))
xons = st.builds(Xon, seqnos)
errors_ = st.builds(Error, names, st.text(max_size=50), st.integers(-1, 2**40))
batches_any = st.builds(lambda f, n: batch(f, n), st.integers(1, 1000), st.integers(1, 3))
any_message = st.one_of(hellos, starts, heartbeats, acks, xoffs, xons, batches_any)


@FUZZ
@given(target=st.sampled_from([(r, s_) for r in (S, R) for s_ in live_states(r)]), msg=any_message)
def test_messages_in_the_wrong_state(target, msg):
    role, state = target
    assume((role, state, RECV, type(msg)) not in TRANSITIONS)
    conn = reach(role, state)
    events, err = drain(conn, [encode_message(msg)], eof=False)
    assert events == [] and isinstance(err, RemoteProtocolError)
    assert_stuck_in_error(conn)


@st.composite
def conversations(draw):
    """A legal conversation after the handshake: what the source sends and what the receiver sends."""
    start_at = draw(st.integers(1, 10_000))
    down: list = []
    nxt = start_at
    for kind in draw(st.lists(st.sampled_from(["batch", "heartbeat"]), max_size=12)):
        if kind == "batch":
            n = draw(st.integers(1, 5))
            down.append(batch(nxt, n, draw(st.integers(0, 300))))
            nxt += n
        else:
            down.append(draw(heartbeats))
    up = draw(st.lists(st.one_of(acks, xoffs, xons), max_size=8))
    end = draw(st.one_of(st.none(), errors_))
    return start_at, down, up, end


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), src_hello=hellos, rcv_hello=hellos, compress=st.sampled_from([0, 1, 3]),
       cuts_down=st.lists(st.integers(0, 10**6), max_size=20), cuts_up=st.lists(st.integers(0, 10**6), max_size=20))
def test_any_legal_conversation_round_trips_through_any_chunking(conv, src_hello, rcv_hello, compress, cuts_down,
                                                                 cuts_up):
    start_at, down, up, end = conv
    src, rcv = Connection(S, compress_level=compress), Connection(R)

    def over(wire: bytes, cuts: list[int], to: Connection, eof: bool = False) -> list:
        events, err = drain(to, chunked(wire, cuts), eof)
        assert err is None
        return events

    assert over(src.send(src_hello), cuts_down, rcv) == [src_hello]
    assert over(rcv.send(rcv_hello), cuts_up, src) == [rcv_hello]
    start = Start(start_at, start_at - 1, src_hello.history)
    assert over(src.send(start), cuts_down, rcv) == [start]

    wire_down = b"".join(src.send(m) for m in down)
    assert over(b"".join(rcv.send(m) for m in up), cuts_up, src) == up
    if end is not None:
        wire_down += src.send(end)
    assert over(wire_down, cuts_down, rcv, eof=True) == down + ([end] if end is not None else [])
    assert rcv.state is State.CLOSED  # by the Error, or else by the end of stream
    assert (rcv.bytes_in, src.bytes_in) == (src.bytes_out, rcv.bytes_out)


# -- the client protocol's framing ------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(reqs=st.lists(st.tuples(st.integers(0, 2**31), st.sampled_from(["get", "commit", "info"]),
                               st.dictionaries(names, st.one_of(st.integers(-2**63, 2**63 - 1), names, st.none()), max_size=3)),
                     max_size=10),
       cuts=st.lists(st.integers(0, 10**5), max_size=10))
def test_client_frames_round_trip_through_any_chunking(reqs, cuts):
    fb = FrameBuffer()
    out = []
    for ch in chunked(b"".join(client_encode(list(r)) for r in reqs), cuts):
        fb.feed(ch)
        while (body := fb.next()) is not None:
            out.append(tuple(body))
    assert out == reqs


def test_client_frame_oversized_or_malformed():
    fb = FrameBuffer(max_frame_bytes=100)
    fb.feed(struct.pack("<I", 101))
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        fb.next()
    fb = FrameBuffer()
    fb.feed(struct.pack("<I", 1) + b"\xc1")
    with pytest.raises(RemoteProtocolError, match="malformed"):
        fb.next()


def test_errors_are_protocol_errors():
    assert issubclass(RemoteProtocolError, ProtocolError) and issubclass(LocalProtocolError, ProtocolError)
    assert (RemoteProtocolError.code, LocalProtocolError.code) == ("REMOTE_PROTOCOL", "LOCAL_PROTOCOL")


def test_the_documented_state_tables_are_the_code():
    """docs/protocol.md §3 lists every transition of TRANSITIONS, and nothing else."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    rows = set()
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ("source", "receiver"):
            rows.add(tuple(cells))
    code = {(r.value, s_.value, d, t.__name__, n.value) for (r, s_, d, t), n in TRANSITIONS.items()}
    assert rows == code, (sorted(rows - code), sorted(code - rows))


def test_a_received_batch_compares_equal_and_not_unequal_to_the_batch_sent():
    # next_event gives a CheckedTxnBatch (with its frame ends): == and != must agree, both ways.
    src, rcv = handshake(10, 4)
    sent = batch(5, 3)
    [got] = deliver(src.send(sent), rcv)
    assert got == sent and sent == got
    assert not (got != sent) and not (sent != got)
    other = batch(5, 2)
    assert got != other and other != got and not (got == other)
