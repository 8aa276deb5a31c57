"""Framing and records: every damaged header or payload is detected, records round-trip."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multisite.journal import records as R

SMALL_INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
KEYS = st.lists(st.one_of(SMALL_INTS, st.text(max_size=8)), min_size=1, max_size=4).map(tuple)
DOCS = st.binary(max_size=40)


def _frame_of(payload: bytes, seqno: int = 7) -> bytes:
    return R.frame(seqno, payload)


def test_frame_layout_and_header_parse():
    payload = b"hello journal"
    data = _frame_of(payload, seqno=42)
    assert len(data) == R.FRAME_HEADER_SIZE + len(payload)
    hdr = R.parse_header(data)
    assert (hdr.length, hdr.seqno, hdr.total) == (len(payload), 42, len(data))
    assert R.payload_ok(hdr, data, 0)
    assert data[R.FRAME_HEADER_SIZE:] == payload


def test_header_parses_at_an_offset_inside_a_buffer():
    a, b = _frame_of(b"first", 1), _frame_of(b"second record", 2)
    buf = b"\0" * 64 + a + b
    h1 = R.parse_header(buf, 64)
    h2 = R.parse_header(buf, 64 + h1.total)
    assert (h1.seqno, h2.seqno) == (1, 2)
    assert R.payload_ok(h1, buf, 64) and R.payload_ok(h2, buf, 64 + h1.total)


def test_every_single_bit_flip_in_the_header_is_detected():
    data = _frame_of(b"payload bytes", 123456)
    for byte in range(R.FRAME_HEADER_SIZE):
        for bit in range(8):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            assert R.parse_header(bytes(bad)) is None, f"flip of bit {bit} in header byte {byte} not detected"


def test_every_single_bit_flip_in_the_payload_is_detected():
    data = _frame_of(b"some payload of a record", 9)
    hdr = R.parse_header(data)
    for byte in range(R.FRAME_HEADER_SIZE, len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            assert R.parse_header(bytes(bad)) == hdr  # the header is intact ...
            assert not R.payload_ok(hdr, bytes(bad), 0)  # ... the payload is not


def test_a_length_beyond_the_limit_is_rejected_even_with_a_valid_checksum():
    head = struct.pack("<IQI", R.MAX_RECORD_BYTES + 1, 1, 0)
    data = head + struct.pack("<I", zlib.crc32(head))
    assert R.parse_header(data) is None


def test_a_truncated_payload_fails_its_checksum():
    data = _frame_of(b"0123456789", 3)
    hdr = R.parse_header(data)
    assert not R.payload_ok(hdr, data[:-1], 0)


@st.composite
def updates(draw):
    op = draw(st.sampled_from([R.SET, R.KILL, R.ZKILL]))
    region = draw(st.text(min_size=1, max_size=10))
    key = draw(KEYS)
    if op == R.SET:
        return R.Update(op, region, key, draw(DOCS), draw(st.none() | DOCS))
    if op == R.ZKILL:
        return R.Update(op, region, key, None, draw(st.none() | DOCS))
    return R.Update(op, region, key, None, None, draw(st.lists(st.tuples(KEYS, DOCS), max_size=4)))


RECORDS = st.builds(
    R.Record,
    seqno=st.integers(1, 2**63 - 1),
    stream=st.integers(0, 15),
    stream_seqno=st.integers(0, 2**63 - 1),
    origin=st.text(min_size=1, max_size=12),
    time=st.floats(0, 4e9, allow_nan=False),
    updates=st.lists(updates(), min_size=1, max_size=6),
)


@given(RECORDS)
def test_record_round_trip_through_a_frame(rec):
    data = R.encode_record(rec)
    hdr = R.parse_header(data)
    assert hdr.seqno == rec.seqno
    assert R.payload_ok(hdr, data, 0)
    back = R.decode_payload(data[R.FRAME_HEADER_SIZE:])
    assert back == rec
    assert R.update_count(back) == len(rec.updates)


def test_op_names_and_codes_agree():
    assert {R.OP_CODES[n] for n in R.OP_NAMES.values()} == {R.SET, R.KILL, R.ZKILL}


@pytest.mark.parametrize("payload", [b"", b"x" * 70_000])
def test_empty_and_large_payloads_frame(payload):
    data = _frame_of(payload, 5)
    hdr = R.parse_header(data)
    assert hdr.length == len(payload) and R.payload_ok(hdr, data, 0)
