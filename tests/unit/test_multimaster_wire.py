"""The replicator wire: frames round-trip, order is enforced, and any bytes either parse or raise a
protocol error that leaves the wire broken (fuzzed)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from multisite.errors import LocalProtocolError, RemoteProtocolError
from multisite.multimaster.wire import (NEED_DATA, Changes, ChangePage, DocWire, Hello, HelloOk, ListDbs, Refused,
                                        Side, State, Want)


def _pair():
    return DocWire(Side.INITIATOR), DocWire(Side.RESPONDER)


def test_a_session_alternates_requests_and_replies():
    i, r = _pair()
    r.receive_data(i.send(Hello(1, "A", "127.0.0.1:1")))
    assert r.next_event() == Hello(1, "A", "127.0.0.1:1")
    i.receive_data(r.send(HelloOk(1, "B")))
    assert i.next_event() == HelloOk(1, "B")
    r.receive_data(i.send(Changes("r" * 16, 0, 10)))
    assert isinstance(r.next_event(), Changes)
    i.receive_data(r.send(ChangePage([("u" * 32, 1, 2, "o")], 5, False)))
    assert i.next_event().entries == [("u" * 32, 1, 2, "o")]
    assert i.state is State.READY and i.next_event() is NEED_DATA


def test_out_of_turn_messages_break_the_wire():
    i, r = _pair()
    with pytest.raises(LocalProtocolError, match="Hello"):
        i.send(ListDbs())
    i, r = _pair()
    r.receive_data(i.send(Hello(1, "A")))
    r.next_event()
    i.receive_data(r.send(HelloOk(1, "B")))
    i.next_event()
    r.receive_data(i.send(ListDbs()))
    r.next_event()
    with pytest.raises(LocalProtocolError, match="DbList or Refused"):
        r.send(Want([]))
    assert r.state is State.ERROR


def test_a_refused_hello_ends_the_session():
    i, r = _pair()
    r.receive_data(i.send(Hello(9, "A")))
    r.next_event()
    i.receive_data(r.send(Refused("PROTOCOL", "version")))
    assert isinstance(i.next_event(), Refused) and i.state is State.DONE


def test_oversized_and_truncated_frames_are_refused():
    i, r = _pair()
    r.receive_data(b"\xff\xff\xff\x7f\x01")
    with pytest.raises(RemoteProtocolError, match="frame of"):
        r.next_event()
    i, r = _pair()
    frame = i.send(Hello(1, "A"))
    r.receive_data(frame[:-1])
    assert r.next_event() is NEED_DATA
    r.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        r.next_event()


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_a_protocol_error(data):
    r = DocWire(Side.RESPONDER)
    r.receive_data(data)
    r.receive_data(b"")
    try:
        while True:
            ev = r.next_event()
            if ev is None or ev is NEED_DATA:
                break
    except RemoteProtocolError:
        assert r.state is State.ERROR
