"""Malformed input from a peer or a file ends in the project's own error, naming it, never in the
decoder's (cases the fuzzers of ``fuzz/`` found, issue 28): a string that is not UTF-8 or nesting too
deep on the wires (msgspec raises UnicodeDecodeError and RecursionError itself, past a catch of its
DecodeError), a delivery message whose sender's length runs past its end, a configuration file that
is not UTF-8, a lost-transaction file or a journal record whose checksums are right but whose content
is not what they should hold."""

from __future__ import annotations

import json
import struct
import zlib

import msgspec
import pytest

from multisite import config
from multisite.delivery import message as dmsg
from multisite.errors import (ConfigError, JournalCorrupt, LostFileCorrupt, MessageCorrupt, RemoteProtocolError)
from multisite.grid import shard_wire, wire as gwire
from multisite.journal.lostfile import LostFile, write_lost_file
from multisite.journal.reader import iter_records
from multisite.journal.records import SET, Record, Update, encode_record, frame
from multisite.journal.segments import SegmentHeader, segment_name
from multisite.multimaster import wire as mwire
from multisite.protocol.client import FrameBuffer, encode
from multisite.protocol.framing import FRAME_PREFIX

NOT_UTF8 = b"\xa3\xff\xfe\xfd"  # a msgpack string of 3 bytes that are not UTF-8
DEEP = b"\x91" * 200_000 + b"\xc0"  # a list in a list ... 200,000 deep


def _framed(tag: int, body: bytes) -> bytes:
    return FRAME_PREFIX.pack(len(body) + 1, tag) + body


def test_a_grid_wire_string_that_is_not_utf8_is_a_protocol_error():
    w = gwire.GridWire(gwire.Side.MEMBER)
    w.send(gwire.StatusRequest())
    w.receive_data(_framed(gwire.Status.__struct_config__.tag, b"\x91" + NOT_UTF8))
    with pytest.raises(RemoteProtocolError, match="malformed grid message"):
        w.next_event()
    assert w.state is gwire.State.ERROR


def test_a_grid_wire_message_nested_too_deep_is_a_protocol_error():
    w = gwire.GridWire(gwire.Side.CATALOG)
    body = b"\x94\xa5drain\x81\xa1a" + DEEP + b"\xc0\xc0"  # Operate(op, args={"a": [[[...]]]}, user, password)
    w.receive_data(_framed(gwire.Operate.__struct_config__.tag, body))
    with pytest.raises(RemoteProtocolError, match="malformed grid message"):
        w.next_event()


def test_a_replicator_wire_string_that_is_not_utf8_is_a_protocol_error():
    w = mwire.DocWire(mwire.Side.RESPONDER)
    w.receive_data(_framed(mwire.Hello.__struct_config__.tag, b"\x93\x01" + NOT_UTF8 + b"\xa0"))
    with pytest.raises(RemoteProtocolError, match="malformed replicator message"):
        w.next_event()


@pytest.mark.parametrize("body", [b"\x91" + NOT_UTF8, b"\x91" + DEEP], ids=["not-utf8", "nested-too-deep"])
def test_a_grid_data_message_that_does_not_decode_is_a_protocol_error(body):
    w = shard_wire.DataWire(server=False)
    w.receive_data(_framed(shard_wire.Opened.__struct_config__.tag, body))
    with pytest.raises(RemoteProtocolError, match="malformed grid data message"):
        w.next_event()
    assert w.broken


def test_a_client_frame_string_that_is_not_utf8_is_a_protocol_error():
    buf = FrameBuffer()
    body = b"\x93\x01" + NOT_UTF8 + b"\x80"
    buf.feed(struct.pack("<I", len(body)) + body)
    with pytest.raises(RemoteProtocolError, match="malformed client frame"):
        buf.next()
    buf.feed(encode([2, "info", {}]))
    assert buf.next() == [2, "info", {}]


def _sealed(data: bytes) -> bytes:
    """``data`` with its last 4 bytes the CRC of the rest, as a sender writes them."""
    return data[:-4] + zlib.crc32(data[:-4]).to_bytes(4, "little")


def test_a_delivery_message_whose_sender_runs_past_its_end_is_corrupt():
    data = bytearray(dmsg.encode(dmsg.Message("HQ", "P", 1, 0, 10, txs=[])))
    struct.pack_into("<H", data, len(dmsg.MAGIC) + 1, 40_000)
    with pytest.raises(MessageCorrupt, match="names a sender of 40000 bytes"):
        dmsg.decode(_sealed(bytes(data)), "m1")


def test_a_delivery_message_whose_body_holds_a_string_that_is_not_utf8_is_corrupt():
    import zstandard
    good = dmsg.encode(dmsg.Message("HQ", "P", 1, 0, 10, txs=[]))
    body = zstandard.ZstdCompressor().compress(b"\x91" + NOT_UTF8)
    head = good[:len(dmsg.MAGIC) + 3 + 2]  # magic, flags, the sender's length and name ("HQ")
    data = head + struct.pack("<I", len(body)) + body + b"\0\0\0\0"
    with pytest.raises(MessageCorrupt, match="cannot be decoded"):
        dmsg.decode(_sealed(data), "m2")


def test_a_delivery_message_declaring_a_huge_decompressed_size_is_corrupt_not_allocated():
    import zstandard
    body = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"\x90"))
    # the frame header's content size field: one byte (a single-segment frame of 1 byte) made 8 bytes
    # of 2**60 by hand: a frame descriptor with FCS_flag 3 and single-segment set
    fake = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + (1 << 60).to_bytes(8, "little") + bytes(body[6:])
    assert zstandard.frame_content_size(fake) == 1 << 60
    good = dmsg.encode(dmsg.Message("HQ", "P", 1, 0, 10, txs=[]))
    head = good[:len(dmsg.MAGIC) + 3 + 2]
    data = head + struct.pack("<I", len(fake)) + fake + b"\0\0\0\0"
    with pytest.raises(MessageCorrupt, match="declares 1152921504606846976 bytes once decompressed"):
        dmsg.decode(_sealed(data), "m3")


def test_a_configuration_file_that_is_not_utf8_is_a_config_error(tmp_path):
    f = tmp_path / "site.toml"
    f.write_bytes(b'[server]\nlisten = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8 at byte 19"):
        config.load(f)


def _lost_file(tmp_path, lines: list[bytes]) -> LostFile:
    """A lost file of ``lines`` after a real header, with a right end marker (count and CRC)."""
    (tmp_path / "lost").mkdir()
    real = write_lost_file(tmp_path / "lost", instance="A", group="g", common_seqno=0, reason="test",
                           records=[Record(1, 0, 1, "A", 1.7e9, [Update(SET, "acct", ("k",), b"\x01")])])
    body = real.read_bytes().splitlines(keepends=True)[0] + b"".join(lines)
    p = tmp_path / "x.mslost"
    p.write_bytes(body + json.dumps({"end": True, "count": len(lines), "crc32": zlib.crc32(body)}).encode() + b"\n")
    return p


@pytest.mark.parametrize("line,match", [
    (b'{"seqno": 1, "stream\n', "not a JSON transaction"),
    (b'{"seqno": 1}\n', "not a transaction"),
    (b'{"seqno": 1, "stream": 0, "stream_seqno": 1, "origin": "A", "updates": [3], "payload": ""}\n',
     "is not {op, region, key"),
])
def test_a_lost_file_line_that_is_not_a_transaction_is_corrupt(tmp_path, line, match):
    with pytest.raises(LostFileCorrupt, match=match):
        LostFile.read(_lost_file(tmp_path, [line]))


def test_a_lost_file_payload_that_is_not_a_record_is_corrupt(tmp_path):
    line = (b'{"seqno": 1, "stream": 0, "stream_seqno": 1, "origin": "A", "updates": [], "payload": "AAE="}\n')
    lf = LostFile.read(_lost_file(tmp_path, [line]))
    with pytest.raises(LostFileCorrupt, match="payload of seqno 1 is not a journal record"):
        list(lf.records())


def test_a_journal_record_that_passes_its_checksums_but_does_not_decode_is_corrupt(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    good = encode_record(Record(1, 0, 1, "A", 1.7e9, [Update(SET, "acct", ("k",), b"\x01")]))
    bad = frame(2, msgspec.msgpack.encode([2, 0, 2, "A", 1.7e9, [[1, "acct", ["k"], [1]]]]))  # value not bytes
    (journal / segment_name(1)).write_bytes(SegmentHeader(1, 1, 0, 0, 1.7e9).pack() + good + bad)
    with pytest.raises(JournalCorrupt, match="record 2 passed its checksums but is not a transaction record"):
        list(iter_records(journal))


def test_a_segment_whose_first_seqno_is_the_last_u64_is_read_not_a_struct_error(tmp_path):
    from multisite.journal.recovery import recover_journal
    journal = tmp_path / "journal"
    journal.mkdir()
    last = (1 << 64) - 1
    damaged = b"\x07" * 40  # a frame header that does not check: the search for an intact frame after it
    (journal / segment_name(1)).write_bytes(SegmentHeader(1, last, 0, 0, 1.7e9).pack() + damaged)
    state = recover_journal(journal, repair=False)  # a torn tail (nothing intact after it), not struct.error
    assert state.torn_bytes == len(damaged) and state.last_seqno == last - 1
