"""Delivery messages (delivery.message): the bytes round-trip, damage and truncation are
MessageCorrupt, a wrong key or a clear message on a keyed link is MessageAuthFailed; the name form."""

from __future__ import annotations

import os

import pytest

from multisite.delivery.message import Message, Tx, decode, encode, parse_key, peek_sender
from multisite.errors import DeliveryConfigError, MessageAuthFailed, MessageCorrupt
from multisite.journal.records import SET, Update


def _msg() -> Message:
    return Message("HQ", "paris", 2, 923200, 923357, 0, 1, start=100, confirm=5,
                   txs=[Tx(923357, 7, [Update(SET, "orders", ("o", 1), b"\x81\xa1v\x01", None)])])


def test_a_message_round_trips_clear_and_encrypted_and_is_named_like_the_seed():
    m = _msg()
    assert m.name == "(2-0000923200-0000923357-0)"
    assert decode(encode(m), "m") == m
    key = os.urandom(32)
    data = encode(m, key)
    assert peek_sender(data, "m") == "HQ"
    assert decode(data, "m", key) == m


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_a_truncated_message_is_corrupt_and_named(cut):
    data = encode(_msg())
    with pytest.raises(MessageCorrupt, match="inbox/x.msg"):
        decode(data[:-cut], "inbox/x.msg")


def test_a_flipped_byte_is_corrupt():
    data = bytearray(encode(_msg()))
    data[len(data) // 2] ^= 0x40
    with pytest.raises(MessageCorrupt, match="damaged or truncated"):
        decode(bytes(data), "x.msg")


def test_a_wrong_key_or_a_clear_message_on_a_keyed_link_fails_authentication():
    k1, k2 = os.urandom(32), os.urandom(32)
    with pytest.raises(MessageAuthFailed, match="failed authentication"):
        decode(encode(_msg(), k1), "x.msg", k2)
    with pytest.raises(MessageAuthFailed, match="not encrypted"):
        decode(encode(_msg()), "x.msg", k1)
    with pytest.raises(MessageAuthFailed, match="no key"):
        decode(encode(_msg(), k1), "x.msg")


def test_a_key_must_be_64_hex_digits():
    assert parse_key("ab" * 32, "k") == bytes([0xAB]) * 32
    with pytest.raises(DeliveryConfigError, match="64 hex digits"):
        parse_key("abc", "--key")
