"""Where a subscribing replica starts (``grid.shipping.start_point``) and the data wire's framing
(``grid.shard_wire``): decisions from seqnos and frame digests, and bytes that are not a peer's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.errors import RemoteProtocolError
from multisite.grid.shard_wire import (Commit, DataWire, Done, Failed, Frames, Open, Subscribe, Voted, encode)
from multisite.grid.shipping import StartKind, digest, start_point

D = {s: digest(f"frame {s}".encode()) for s in range(1, 200)}


def tail(lo, hi, other=()):
    return [(s, digest(b"other") if s in other else D[s]) for s in range(lo, hi + 1)]


def test_a_replica_whose_last_frame_is_the_primarys_catches_up_after_it():
    s = start_point(primary_seqno=150, journal_first=1, primary_digests=D, replica_seqno=120, replica_tail=tail(57, 120))
    assert s.kind is StartKind.CATCH_UP and s.seqno == 120


def test_a_replica_holding_frames_the_primary_does_not_cuts_back_to_the_newest_common_one():
    # it voted on a prepare the primary rolled back, then the primary committed others at those seqnos
    s = start_point(primary_seqno=150, journal_first=1, primary_digests=D, replica_seqno=122,
                    replica_tail=tail(60, 122, other={121, 122}))
    assert s.kind is StartKind.RESYNC and s.seqno == 120
    # ahead of the primary (a deposed primary's last commits with min_sync 0)
    s = start_point(primary_seqno=100, journal_first=1, primary_digests=D, replica_seqno=105, replica_tail=tail(42, 105))
    assert s.kind is StartKind.RESYNC and s.seqno == 100


def test_a_replica_that_diverged_beyond_its_tail_or_is_far_behind_copies_a_checkpoint():
    s = start_point(primary_seqno=150, journal_first=1, primary_digests=D, replica_seqno=90,
                    replica_tail=tail(27, 90, other=set(range(27, 91))))
    assert s.kind is StartKind.CHECKPOINT and "diverged" in s.why
    s = start_point(primary_seqno=150, journal_first=100, primary_digests=D, replica_seqno=50, replica_tail=tail(1, 50))
    assert s.kind is StartKind.CHECKPOINT and "starts at seqno 100" in s.why
    s = start_point(primary_seqno=150, journal_first=1, primary_digests=D, replica_seqno=10, replica_tail=tail(1, 10),
                    checkpoint_after=100)
    assert s.kind is StartKind.CHECKPOINT and "140 transactions behind" in s.why


def test_a_new_replica_replays_a_short_whole_journal_and_copies_otherwise():
    assert start_point(primary_seqno=50, journal_first=1, primary_digests={}, replica_seqno=0,
                       replica_tail=[]).kind is StartKind.CATCH_UP
    assert start_point(primary_seqno=50, journal_first=7, primary_digests={}, replica_seqno=0,
                       replica_tail=[]).kind is StartKind.CHECKPOINT
    assert start_point(primary_seqno=500, journal_first=1, primary_digests={}, replica_seqno=0, replica_tail=[],
                       checkpoint_after=100).kind is StartKind.CHECKPOINT


def test_messages_cross_the_data_wire_in_any_chunking():
    to_client = [Done(1, 9), Failed(2, "VOTED_ROLLBACK", "no", {"min_sync": 1}), Frames(10, b"abc", [3], 4)]
    to_server = [Open(1, "g"), Commit(1, 3, 0, [(1, "m", [5], b"\x01")]), Voted(4, True, 10)]
    for wire, msgs in ((DataWire(server=False), to_client), (DataWire(server=True), to_server)):
        data = b"".join(encode(m) for m in msgs)
        got = []
        for i in range(len(data)):  # a byte at a time
            wire.receive_data(data[i:i + 1])
            while (m := wire.next_event()) is not None:
                got.append(m)
        assert got == msgs


def test_each_end_refuses_what_only_the_other_may_send():
    server = DataWire(server=True)
    server.receive_data(encode(Done(1)))
    with pytest.raises(RemoteProtocolError, match="may not be sent to the container"):
        server.next_event()
    client = DataWire(server=False)
    client.receive_data(encode(Voted(1, True, 3)))
    with pytest.raises(RemoteProtocolError, match="may not be sent to the client"):
        client.next_event()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_is_a_protocol_error_or_waits_for_more_never_a_crash(data):
    for server in (True, False):
        w = DataWire(server=server)
        w.receive_data(data)
        try:
            while w.next_event() is not None:
                pass
        except RemoteProtocolError:
            assert w.broken
            with pytest.raises(RemoteProtocolError):
                w.next_event()


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_buffered_whole():
    w = DataWire(server=True, max_frame_bytes=100)
    w.receive_data(encode(Subscribe(1, "g", 0, 1, "r", "sync", 0, [(1, b"x" * 200)]))[:10])
    with pytest.raises(RemoteProtocolError, match="at most 100"):
        w.next_event()
    ok = DataWire(server=True)
    ok.receive_data(encode(Open(1, "g")))
    assert ok.next_event() == Open(1, "g")
