"""Streamed compression on the replication wire: one zstd stream per connection, flushed per batch.

Two ``Connection`` objects joined in memory (no sockets). What must hold:

- it is agreed in the Hellos: both sides of this version stream; with an older peer (a Hello without
  ``zstd_stream``) each batch is its own zstd frame as before, and both ways still replicate;
- many small batches round-trip unchanged and, streamed, take far fewer bytes than compressed one by
  one (the point: small batches at low rates compress as well as large ones);
- a damaged, truncated, reordered or over-long streamed batch raises ``RemoteProtocolError`` (the
  connection ends, the servers reconnect) and nothing of it is returned;
- any chunking of the byte stream gives the same batches.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multisite.errors import LocalProtocolError, RemoteProtocolError
from multisite.journal.records import FRAME_HEADER_SIZE, SET, Record, Update, encode_record, frame
from multisite.protocol import packed
from multisite.protocol.connection import NEED_DATA, Connection, Role, State
from multisite.protocol.messages import (CAPABILITIES, COMPRESSED, FRAME_PREFIX, STREAM_LENGTH, STREAMED,
                                         ZSTD_STREAM_FLAG, Heartbeat, Hello, HistoryEntry, Start, TxnBatch,
                                         encode_message, encode_streamed)

S, R = Role.SOURCE, Role.RECEIVER
HISTORY = [HistoryEntry(1, "A", 12345)]


def txn_frames(first: int, n: int) -> bytes:
    """``n`` single-update journal frames like a small bank workload's (a key and a short value)."""
    return b"".join(encode_record(Record(s, 0, s, "A", 1700000000.0 + s / 5000,
                                         [Update(SET, "acct", ("k", s * 7919 % 100003), {"n": s, "v": "x" * 16})]))
                    for s in range(first, first + n))


def batches(sizes: list[int], first: int = 1) -> list[TxnBatch]:
    out = []
    for n in sizes:
        out.append(TxnBatch(first, first + n - 1, txn_frames(first, n)))
        first += n
    return out


def hello(name: str, seqno: int, flags: dict) -> Hello:
    return Hello(1, name, "default", False, "primary" if name == "A" else "secondary", seqno, HISTORY, flags)


def pump(data: bytes, conn: Connection) -> list:
    conn.receive_data(data)
    out = []
    while (ev := conn.next_event()) is not NEED_DATA and ev is not State.CLOSED:
        out.append(ev)
    return out


def joined(level: int = 3, *, source_flags: dict = CAPABILITIES,
           receiver_flags: dict = CAPABILITIES) -> tuple[Connection, Connection]:
    """Source and receiver streaming from seqno 1; either side may be 'older' (no capability flags)."""
    src, rcv = Connection(S, compress_level=level), Connection(R)
    pump(src.send(hello("A", 10_000, dict(source_flags))), rcv)
    pump(rcv.send(hello("B", 0, dict(receiver_flags))), src)
    pump(src.send(Start(1, 0, HISTORY)), rcv)
    assert src.state is rcv.state is State.STREAMING
    return src, rcv


SMALL = [1, 2, 1, 3, 1, 1, 2, 1] * 40  # what 5,000 tx/s looks like to a source: a few per batch


def test_both_sides_of_this_version_agree_on_streaming():
    src, rcv = joined()
    assert src.streamed_compression and rcv.streamed_compression
    assert src.send(batches([3])[0])[4] & STREAMED


@pytest.mark.parametrize("sizes,factor", [(SMALL, 2.0), ([4] * 120, 3.0)], ids=["1-3 per batch", "4 per batch"])
def test_many_small_batches_round_trip_streamed_and_shrink(sizes, factor):
    """A few transactions per batch, the shape of 5,000 tx/s: at least ``factor`` fewer bytes than
    uncompressed (the frames' CRCs and commit times are what no compressor removes)."""
    src, rcv = joined(3)
    sent = batches(sizes)
    wire = [src.send(b) for b in sent]
    assert all(w[4] == TxnBatch.__struct_config__.tag | STREAMED for w in wire)
    got = pump(b"".join(wire), rcv)
    assert got == sent
    assert [g.ends for g in got] == [[e for _, e in _ends(b)] for b in sent]
    plain = sum(len(encode_message(b)) for b in sent)
    assert sum(map(len, wire)) * factor <= plain, (sum(map(len, wire)), plain)


def _ends(b: TxnBatch) -> list[tuple[int, int]]:
    """(seqno, end offset) of each journal frame in ``b``, read from the headers."""
    out, off, seqno = [], 0, b.first_seqno
    while off < len(b.frames):
        off += FRAME_HEADER_SIZE + int.from_bytes(b.frames[off:off + 4], "little")
        out.append((seqno, off))
        seqno += 1
    return out


def test_streamed_beats_one_frame_per_batch_on_small_batches():
    streamed, _ = joined(3)
    old, _ = joined(3, receiver_flags={})  # an older receiver: one zstd frame per batch
    assert not old.streamed_compression
    sent = batches(SMALL)
    s = sum(len(streamed.send(b)) for b in sent)
    o = sum(len(old.send(b)) for b in sent)
    assert s * 2 < o, (s, o)


@pytest.mark.parametrize("who_is_old", ["receiver", "source"])
def test_an_older_peer_still_replicates_without_streaming(who_is_old):
    kw = {f"{who_is_old}_flags": {}}
    src, rcv = joined(3, **kw)
    assert not src.streamed_compression and not rcv.streamed_compression
    sent = batches([1, 200, 2])
    wire = [src.send(b) for b in sent]
    assert not any(w[4] & STREAMED for w in wire)
    assert wire[1][4] & COMPRESSED  # large enough for the per-batch frame compression of old
    assert pump(b"".join(wire), rcv) == sent


def test_no_level_means_no_compression_even_when_both_can_stream():
    src, rcv = joined(0)
    data = src.send(batches([5])[0])
    assert not data[4] & (STREAMED | COMPRESSED)
    assert pump(data, rcv) == batches([5])


def test_heartbeats_between_streamed_batches_travel_plain():
    src, rcv = joined(3)
    b1, b2 = batches([2, 2])
    hb = src.send(Heartbeat(1, 0.0, 4))
    assert not hb[4] & (STREAMED | COMPRESSED)
    assert pump(src.send(b1) + hb + src.send(b2), rcv) == [b1, Heartbeat(1, 0.0, 4), b2]


def test_a_streamed_frame_that_was_not_agreed_is_refused():
    src, _ = joined(3)
    _, old_rcv = joined(3, source_flags={})
    with pytest.raises(RemoteProtocolError, match="not agreed"):
        pump(src.send(batches([2])[0]), old_rcv)
    assert old_rcv.state is State.ERROR


def assert_refused(rcv: Connection, data: bytes, match: str) -> None:
    rcv.receive_data(data)
    with pytest.raises(RemoteProtocolError, match=match):
        while rcv.next_event() is not NEED_DATA:
            pass
    assert rcv.state is State.ERROR
    with pytest.raises(RemoteProtocolError):
        rcv.next_event()


def reframe(frame: bytes, body: bytes) -> bytes:
    """``frame``'s type with another body (its length prefix fixed up)."""
    return FRAME_PREFIX.pack(len(body) + 1, frame[4]) + body


def test_a_damaged_streamed_batch_fails_the_connection_and_returns_nothing():
    src, rcv = joined(3)
    first, second = batches([3, 3])
    assert pump(src.send(first), rcv) == [first]
    data = bytearray(src.send(second))
    data[len(data) // 2 + 4] ^= 0xFF
    rcv.receive_data(bytes(data))
    with pytest.raises(RemoteProtocolError):
        rcv.next_event()
    assert rcv.state is State.ERROR


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_a_truncated_streamed_batch_is_refused(cut):
    src, rcv = joined(3)
    data = src.send(batches([20])[0])
    assert_refused(rcv, reframe(data, data[5:-cut]), "decompresses to|does not decompress")


def test_a_skipped_streamed_batch_is_refused():
    """The stream's pieces depend on each other: one lost in between leaves the next undecodable
    (or, if it happens to decode, its seqnos do not follow); never a wrong batch."""
    src, rcv = joined(3)
    b1, b2, b3 = batches([4, 4, 4])
    assert pump(src.send(b1), rcv) == [b1]
    src.send(b2)
    with pytest.raises(RemoteProtocolError):
        pump(src.send(b3), rcv)


def test_a_declared_length_past_the_limit_is_refused_before_decompressing():
    src, rcv = joined(3)
    rcv.max_frame_bytes = 4096
    data = src.send(batches([1])[0])
    body = STREAM_LENGTH.pack(10**9) + data[5 + STREAM_LENGTH.size:]
    assert_refused(rcv, reframe(data, body), "declares 1000000000 decompressed bytes")


def test_a_body_that_decompresses_past_its_declared_length_is_refused():
    """A 'bomb': a small streamed piece claiming a small length but expanding far beyond it."""
    src, rcv = joined(3)
    big = TxnBatch(1, 1, frame(1, b"\0" * 5_000_000))
    data = src.send(big)
    assert len(data) < 5000
    body = STREAM_LENGTH.pack(100) + data[5 + STREAM_LENGTH.size:]
    assert_refused(rcv, reframe(data, body), "past the 100 bytes it declares")


def test_a_piece_without_a_length_is_refused():
    src, rcv = joined(3)
    data = src.send(batches([1])[0])
    assert_refused(rcv, reframe(data, b"\1\2"), "has no length")


def test_a_piece_that_decompresses_to_garbage_msgpack_is_refused():
    """Well-formed zstd, wrong content: the message decoder refuses it."""
    src, rcv = joined(3)
    cobj = src._cstream  # the source's own stream, so that the receiver's decompresses it
    import zstandard
    junk = b"\xc1" * 40
    z = cobj.compress(junk) + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    frame = FRAME_PREFIX.pack(len(z) + 5, TxnBatch.__struct_config__.tag | STREAMED) + STREAM_LENGTH.pack(40) + z
    assert_refused(rcv, frame, "malformed TxnBatch")


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=25), cuts=st.lists(st.integers(1, 400), max_size=40),
       level=st.sampled_from([1, 3, 9]))
def test_any_chunking_of_a_streamed_conversation_gives_the_same_batches(sizes, cuts, level):
    src, rcv = joined(level)
    sent = batches(sizes)
    wire = b"".join(src.send(b) for b in sent)
    got, pos = [], 0
    for c in cuts + [len(wire)]:
        got += pump(wire[pos:pos + c], rcv)
        pos += c
        if pos >= len(wire):
            break
    got += pump(wire[pos:], rcv)
    assert got == sent


def test_the_capability_travels_in_the_hello_flags():
    assert CAPABILITIES[ZSTD_STREAM_FLAG] is True
    h = hello("A", 1, dict(CAPABILITIES))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(h), type=Hello).flags[ZSTD_STREAM_FLAG] is True


def streamed_body(src: Connection, body: bytes) -> bytes:
    """``body`` as the source's next streamed TxnBatch frame (well-formed zstd, any content)."""
    import zstandard
    return encode_streamed(TxnBatch.__struct_config__.tag, body, src._cstream, zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def test_a_payload_that_differs_from_the_primarys_crc_is_refused():
    """The frame headers are rebuilt on the receiver; the primary's CRCs still vouch for the payloads."""
    src, rcv = joined(3)
    b = batches([3])[0]
    p = msgspec.msgpack.decode(packed.pack(b.first_seqno, b.frames), type=packed.PackedBatch)
    p.payloads = p.payloads[:-1] + bytes([p.payloads[-1] ^ 1])
    assert_refused(rcv, streamed_body(src, msgspec.msgpack.encode(p)), "differ from the primary's")


@pytest.mark.parametrize("change,match", [
    (lambda p: setattr(p, "lengths", []), "carries no transaction"),
    (lambda p: setattr(p, "lengths", p.lengths[:-1]), "add up to"),
    (lambda p: setattr(p, "lengths", [p.lengths[0] + 1] + p.lengths[1:]), "add up to"),
    (lambda p: setattr(p, "payloads", p.payloads + b"x"), "add up to"),
])
def test_a_packed_batch_whose_lengths_do_not_fit_is_refused(change, match):
    src, rcv = joined(3)
    b = batches([3])[0]
    p = msgspec.msgpack.decode(packed.pack(b.first_seqno, b.frames), type=packed.PackedBatch)
    change(p)
    assert_refused(rcv, streamed_body(src, msgspec.msgpack.encode(p)), match)


def test_a_packed_batch_for_other_seqnos_is_refused():
    """Seqnos do not travel: the receiver frames the batch where its stream stands, and the primary's
    header CRCs (which cover the seqno) say that those are not the seqnos it journaled."""
    src, rcv = joined(3)
    b = batches([3], first=5)[0]
    assert_refused(rcv, streamed_body(src, packed.pack(5, b.frames)), "differ from the primary's")


def test_the_source_refuses_to_stream_a_batch_out_of_order():
    src, _ = joined(3)
    with pytest.raises(LocalProtocolError, match="stands at seqno 1"):
        src.send(batches([2], first=3)[0])
    assert src.state is State.ERROR
