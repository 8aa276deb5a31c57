"""Session policy, sans-IO: what a receiver answers a source, when it sends XOFF/XON, how long a source
waits before it reconnects, and when it gives a silent receiver up.

No sockets and no sleeps: instance files are built in memory (as in ``test_history``), the handshake is
fed Hellos and Starts, and the clock is a number the test moves. The real servers run the same objects
(``tests/integration`` checks them on the wire).
"""

from __future__ import annotations

import pytest

from multisite.errors import ProtocolError
from multisite.instance.instance_file import InstanceFile, StreamInfo
from multisite.protocol.messages import Hello, RefusalCode, Start, StreamEntry
from multisite.replication.history import (MAX_SI_STREAM, SI_STREAM, Refusal, hello_for, si_stream_for,
                                           stream_entries, to_entries, to_records)
from multisite.replication.session import (CONNECT_BACKOFF_MIN_S, REFUSED_BACKOFF_MIN_S, Accept, Adoption,
                                           ContinueStream, FlowControl, HeartbeatWatch, Position,
                                           ReceiverHandshake, RollBack, SessionEnd, SourceBackoff,
                                           StreamCheck, adopted_history, busy)

from .test_history import primary, promote, receives


# -- instances, built as test_history builds them -------------------------------------------------------

def start_for(source: InstanceFile, source_seqno: int, hello: Hello, common: int = 0) -> Start:
    """The Start a source sends after the receiver's Hello (``replication.server.source``: from its seqno + 1)."""
    return Start(hello.seqno + 1, common, to_entries(source.history), stream_entries(source))


def si_receiver(name: str = "P") -> InstanceFile:
    """A supplementary instance that has received no SI stream yet."""
    return primary(name, "supp", supplementary=True)


def _si_stream(group: str, source: InstanceFile) -> StreamInfo:
    """The SI stream a supplementary instance holds after receiving ``source``'s history."""
    return StreamInfo(stream=SI_STREAM, source_group=group, root_primary=source.name,
                      history=to_records(to_entries(source.history), upstream=source.name))


# -- the handshake: accept and the restart point -----------------------------------------------------------

def test_a_fresh_secondary_accepts_and_restarts_after_its_seqno():
    a, b = primary("A"), primary("B")
    hs = ReceiverHandshake(hello_for(a, 120), supplementary=False)
    got = hs.answer(Position(b, 0))
    assert isinstance(got, Accept) and not hs.si
    assert got.hello.name == "B" and got.hello.seqno == 0 and hs.hello is got.hello
    hs.check_start(Start(1, 0, to_entries(a.history)))


def test_a_secondary_behind_restarts_at_its_own_seqno():
    a, b = primary("A"), primary("B")
    receives(b, a)
    got = ReceiverHandshake(hello_for(a, 120), supplementary=False).answer(Position(b, 75))
    assert isinstance(got, Accept) and got.hello.seqno == 75


@pytest.mark.parametrize("from_seqno", [0, 1, 75, 77, 121])
def test_a_start_anywhere_but_right_after_the_hello_is_a_protocol_error(from_seqno):
    a, b = primary("A"), primary("B")
    receives(b, a)
    hs = ReceiverHandshake(hello_for(a, 120), supplementary=False)
    assert isinstance(hs.answer(Position(b, 75)), Accept)
    with pytest.raises(ProtocolError, match=f"start at seqno {from_seqno}, this instance needs 76"):
        hs.check_start(Start(from_seqno, 75, to_entries(a.history)))
    hs.check_start(Start(76, 75, to_entries(a.history)))


def test_a_start_before_an_accept_is_a_protocol_error():
    a, b = primary("A"), primary("B", group="other")
    hs = ReceiverHandshake(hello_for(a, 10), supplementary=False)
    assert isinstance(hs.answer(Position(b, 0)), Refusal)
    with pytest.raises(ProtocolError):
        hs.check_start(Start(1, 0, []))


# -- the handshake: refusals ---------------------------------------------------------------------------------

def refused(source: InstanceFile, s_seqno: int, receiver: InstanceFile, pos: Position, **flags) -> Refusal:
    got = ReceiverHandshake(hello_for(source, s_seqno), supplementary=receiver.supplementary, **flags).answer(pos)
    assert isinstance(got, Refusal), got
    return got


def test_a_source_started_for_another_instance_is_refused_before_any_remedy():
    """The source's Hello names the secondary it was started for: a misaddressed receiver refuses
    it first, before a rollback --autorollback would make (nothing of this instance changes)."""
    a, b = primary("A"), primary("B")
    promote(a, 5)  # B would otherwise need a rollback to follow A
    got = ReceiverHandshake(hello_for(a, 10, secondary="C"), supplementary=False, autorollback=True).answer(
        Position(b, 20))
    assert isinstance(got, Refusal) and got.code is RefusalCode.WRONG_NAME, got
    assert "started for secondary 'C', but this is instance 'B'" in got.message
    assert isinstance(ReceiverHandshake(hello_for(a, 10, secondary="B"), supplementary=False).answer(
        Position(primary("B"), 0)), Accept)


def test_same_name_is_refused():
    a, twin = primary("A"), primary("A")
    r = refused(a, 10, twin, Position(twin, 0), autorollback=True)
    assert r.code is RefusalCode.SAME_NAME and r.common_seqno == -1


def test_another_group_is_refused_in_bc():
    a, b = primary("A"), primary("B", group="other")
    assert refused(a, 10, b, Position(b, 0), autorollback=True).code is RefusalCode.GROUP_MISMATCH


def with_streams(p: InstanceFile, groups: list[str]) -> InstanceFile:
    """``p`` has received streams 1, 2, ... from ``groups``, in that order."""
    for n, g in enumerate(groups, 1):
        p.streams[n] = StreamInfo(stream=n, source_group=g, root_primary=f"O{n}",
                                  history=to_records(to_entries(primary(f"O{n}", g).history), upstream=f"O{n}"))
    return p


def test_the_first_group_gets_stream_1_a_known_group_its_stream_a_new_one_the_next_free():
    assert si_stream_for(si_receiver(), "g1") == 1  # as when stream 1 was the only one
    p = with_streams(si_receiver(), ["g1", "g2", "g3"])
    assert [si_stream_for(p, g) for g in ("g1", "g2", "g3", "g4")] == [1, 2, 3, 4]
    del p.streams[2]  # a gap (never made by multisite itself) is filled first
    assert si_stream_for(p, "g4") == 2 and si_stream_for(p, "g3") == 3


def test_a_16th_group_is_refused_with_the_groups_it_has():
    p = with_streams(si_receiver(), [f"g{i}" for i in range(1, MAX_SI_STREAM + 1)])
    assert si_stream_for(p, "g15") == 15
    r = si_stream_for(p, "g16")
    assert isinstance(r, Refusal) and r.code is RefusalCode.NO_FREE_STREAM
    assert "P already receives 15 SI streams" in r.message and "1: g1" in r.message and "15: g15" in r.message
    assert "'g16'" in r.message
    # at the handshake: refused even with --autorollback and --noresync, and it is no group mismatch
    o16 = primary("O16", "g16")
    got = refused(o16, 10, p, Position(p, 50, {n: 3 for n in range(1, 16)}), autorollback=True, noresync=True)
    assert got.code is RefusalCode.NO_FREE_STREAM
    # one of its 15 groups is still welcome, on its own stream
    hs = ReceiverHandshake(hello_for(primary("O7", "g7"), 3), supplementary=True)
    assert isinstance(hs.answer(Position(p, 50, {7: 0})), Accept) and hs.stream == 7


def test_an_si_receiver_takes_a_second_group_on_stream_2_in_that_streams_numbering():
    a, a2 = primary("A", "g1"), primary("A2", group="g2")
    p = si_receiver()
    p.streams[SI_STREAM] = _si_stream("g1", a)
    hs = ReceiverHandshake(hello_for(a2, 10), supplementary=True)
    got = hs.answer(Position(p, 500, {0: 480, SI_STREAM: 20}))
    assert isinstance(got, Accept) and hs.stream == 2
    assert got.hello.seqno == 0 and got.hello.history == []  # stream 2's position, not stream 1's
    start = Start(1, 0, to_entries(a2.history))
    hs.check_start(start)
    adoption = adopted_history(p, hello_for(a2, 10), start, hs.stream, {SI_STREAM: 20})
    adoption.apply(p)
    assert sorted(p.streams) == [1, 2] and p.streams[2].source_group == "g2" and p.streams[1].source_group == "g1"
    assert [h.uid for h in p.streams[2].history] == [h.uid for h in a2.history]
    # the first group again: stream 1, at its own position
    hs1 = ReceiverHandshake(hello_for(a, 30), supplementary=True)
    got1 = hs1.answer(Position(p, 510, {SI_STREAM: 20, 2: 10}))
    assert isinstance(got1, Accept) and hs1.stream == 1 and got1.hello.seqno == 20


def test_si_remedies_name_the_stream_of_the_sources_group():
    a = primary("A", "g2")
    p = with_streams(si_receiver(), ["g1", "g2"])
    p.streams[2].history = to_records(to_entries(a.history), upstream="A")
    a.truncate_history(90)
    a.add_history(91, "A", "originating")
    pos = Position(p, 500, {1: 70, 2: 100})
    got = ReceiverHandshake(hello_for(a, 95), supplementary=True, noresync=True).answer(pos)
    assert got == ContinueStream(2, 90, got.why)
    got = ReceiverHandshake(hello_for(a, 95), supplementary=True, autorollback=True).answer(pos)
    assert got == RollBack(90, 2, got.why) and got.si


def test_a_supplementary_source_never_feeds_a_bc_receiver():
    p, b = primary("P", supplementary=True), primary("B")
    assert refused(p, 10, b, Position(b, 0)).code is RefusalCode.SUPPLEMENTARY_MISMATCH


def test_a_receiver_ahead_of_the_common_point_is_refused_without_autorollback():
    a, b = primary("A"), primary("B")
    receives(b, a)
    promote(a, 90)  # A originates a new range from 91; B holds the old 91..100
    r = refused(a, 95, b, Position(b, 100))
    assert r.code is RefusalCode.ROLLBACK_NEEDED and r.common_seqno == 90 and "--autorollback" in r.message


def test_busy_names_the_source_being_served():
    r = busy("A")
    assert r.code is RefusalCode.BUSY and r.message == "receiver already has a source (A)" and r.common_seqno == -1


# -- the handshake: ROLLBACK_NEEDED and its remedies -------------------------------------------------------------

def diverged() -> tuple[InstanceFile, InstanceFile]:
    """B received 1..100 from A; A was rolled back to 90 and originated again (a new record)."""
    a, b = primary("A"), primary("B")
    receives(b, a)
    a.truncate_history(90)
    a.add_history(91, "A", "originating")
    return a, b


def test_autorollback_rolls_back_to_the_common_point_then_accepts():
    a, b = diverged()
    hs = ReceiverHandshake(hello_for(a, 95), supplementary=False, autorollback=True)
    got = hs.answer(Position(b, 100))
    assert got == RollBack(90, None, got.why) and "shares history with A only up to seqno 90" in got.why
    b.truncate_history(90)  # what the rollback does to B
    after = hs.answer(Position(b, 90))
    assert isinstance(after, Accept) and after.hello.seqno == 90
    hs.check_start(Start(91, 90, to_entries(a.history)))


def test_a_remedy_is_offered_once():
    """A rollback that did not reach the common point is a refusal, not a second rollback."""
    a, b = diverged()
    hs = ReceiverHandshake(hello_for(a, 95), supplementary=False, autorollback=True)
    assert isinstance(hs.answer(Position(b, 100)), RollBack)
    again = hs.answer(Position(b, 100))
    assert isinstance(again, Refusal) and again.code is RefusalCode.ROLLBACK_NEEDED and again.common_seqno == 90


def test_noresync_does_nothing_for_a_bc_receiver():
    a, b = diverged()
    assert refused(a, 95, b, Position(b, 100), noresync=True).code is RefusalCode.ROLLBACK_NEEDED
    got = ReceiverHandshake(hello_for(a, 95), supplementary=False, noresync=True, autorollback=True) \
        .answer(Position(b, 100))
    assert isinstance(got, RollBack) and not got.si


def si_diverged() -> tuple[InstanceFile, InstanceFile]:
    """P (supplementary) received A's 1..100 on its SI stream; A was rolled back to 90 and went on."""
    a = primary("A", "g1")
    p = si_receiver()
    p.streams[SI_STREAM] = _si_stream("g1", a)
    a.truncate_history(90)
    a.add_history(91, "A", "originating")
    return a, p


def test_si_noresync_continues_the_stream_from_the_common_point():
    a, p = si_diverged()
    hs = ReceiverHandshake(hello_for(a, 95), supplementary=True, noresync=True, autorollback=True)
    assert hs.si
    got = hs.answer(Position(p, 500, {SI_STREAM: 100}))  # P's own seqno (500) counts its own transactions too
    assert got == ContinueStream(SI_STREAM, 90, got.why) and "up to seqno 90" in got.why
    after = hs.answer(Position(p, 500, {SI_STREAM: 90}))  # the stream's seqno set to 90, nothing rolled back
    assert isinstance(after, Accept) and after.hello.seqno == 90 and after.hello.flags["si"] is True


def test_si_autorollback_without_noresync_rolls_back_in_the_stream_seqnos():
    a, p = si_diverged()
    got = ReceiverHandshake(hello_for(a, 95), supplementary=True, autorollback=True).answer(
        Position(p, 500, {SI_STREAM: 100}))
    assert isinstance(got, RollBack) and got.stream == SI_STREAM and got.common_seqno == 90


def test_si_without_flags_is_refused():
    a, p = si_diverged()
    r = refused(a, 95, p, Position(p, 500, {SI_STREAM: 100}))
    assert r.code is RefusalCode.ROLLBACK_NEEDED and r.common_seqno == 90


# -- SI against BC ---------------------------------------------------------------------------------------

def test_a_supplementary_receiver_of_a_bc_source_answers_in_the_streams_seqnos():
    a = primary("A", "g1")
    p = si_receiver()
    hs = ReceiverHandshake(hello_for(a, 40), supplementary=True)
    got = hs.answer(Position(p, 500, {SI_STREAM: 0}))
    assert hs.si and isinstance(got, Accept)
    assert got.hello.seqno == 0 and got.hello.supplementary and got.hello.history == []
    hs.check_start(Start(1, 0, to_entries(a.history)))


def test_a_supplementary_standby_of_a_supplementary_source_is_bc():
    p = primary("P", "supp", supplementary=True)
    q = primary("Q", "supp", supplementary=True)
    receives(q, p)
    hs = ReceiverHandshake(hello_for(p, 60), supplementary=True)
    got = hs.answer(Position(q, 50, {SI_STREAM: 7}))
    assert not hs.si and isinstance(got, Accept) and got.hello.seqno == 50


# -- history adoption ------------------------------------------------------------------------------------

def test_bc_adopts_the_source_history_once():
    a, b = primary("A"), primary("B")
    promote(a, 40)
    hello = hello_for(b, 0)
    start = start_for(a, 50, hello)
    got = adopted_history(b, hello_for(a, 50), start, None, {})
    assert isinstance(got, Adoption) and not got.si and got.upstream == "A"
    assert [(h.uid, h.start_seqno, h.role, h.upstream) for h in got.history] == \
        [(h.uid, h.start_seqno, "replicating", "A") for h in a.history]
    got.apply(b)
    assert b.history == got.history and b.receiving_from == "A" and b.streams == {}
    assert adopted_history(b, hello_for(a, 50), start, None, {}) is None


def test_bc_adopts_a_supplementary_sources_streams_with_this_instances_positions():
    a = primary("A", "g1")
    p, q = primary("P", "supp", supplementary=True), primary("Q", "supp", supplementary=True)
    p.streams[SI_STREAM] = _si_stream("g1", a)
    start = start_for(p, 60, hello_for(q, 0))
    assert start.streams == [StreamEntry(SI_STREAM, "g1", to_entries(p.streams[SI_STREAM].history))]
    got = adopted_history(q, hello_for(p, 60), start, None, {SI_STREAM: 33})
    got.apply(q)
    assert q.streams[SI_STREAM].last_stream_seqno == 33 and q.streams[SI_STREAM].source_group == "g1"
    assert adopted_history(q, hello_for(p, 60), start, None, {SI_STREAM: 33}) is None
    # A new stream history (A rolled back and went on) is a change even with the same own history.
    a.add_history(91, "A", "originating")
    p.streams[SI_STREAM] = _si_stream("g1", a)
    assert adopted_history(q, hello_for(p, 95), start_for(p, 95, hello_for(q, 60)), None, {SI_STREAM: 33})


def test_si_adopts_the_history_of_its_stream_and_keeps_its_own():
    a = primary("A", "g1")
    p = si_receiver()
    own = list(p.history)
    start = Start(1, 0, to_entries(a.history))
    got = adopted_history(p, hello_for(a, 10), start, SI_STREAM, {SI_STREAM: 0})
    got.apply(p)
    st = p.streams[SI_STREAM]
    assert (st.source_group, st.root_primary, st.last_stream_seqno) == ("g1", "A", 0)
    assert [h.uid for h in st.history] == [h.uid for h in a.history]
    assert p.history == own and p.receiving_from == "A"
    assert adopted_history(p, hello_for(a, 10), start, SI_STREAM, {SI_STREAM: 0}) is None


# -- XOFF and XON ----------------------------------------------------------------------------------------

def test_xoff_once_above_high_water_and_xon_once_below_low_water():
    f = FlowControl(low_bytes=100)
    assert not f.xoff(above_high=False)
    assert not f.xon(pool_bytes=10, connected=True)  # no XON without an XOFF
    assert f.xoff(above_high=True) and f.xoff_sent
    assert not f.xoff(above_high=True)  # already sent
    assert not f.xon(pool_bytes=100, connected=True)  # not below low-water yet
    assert f.xon(pool_bytes=99, connected=True) and not f.xoff_sent
    assert not f.xon(pool_bytes=0, connected=True)  # once
    assert f.xoff(above_high=True)  # and again when the pool fills again


def test_no_xon_to_a_source_that_is_gone_and_a_new_session_starts_clear():
    f = FlowControl(low_bytes=100)
    assert f.xoff(above_high=True)
    assert not f.xon(pool_bytes=0, connected=False) and f.xoff_sent  # status still shows the XOFF
    f.reset()
    assert not f.xoff_sent and f.xoff(above_high=True)


# -- the Source Server's reconnect pause ----------------------------------------------------------------------

def pauses(b: SourceBackoff, ends: list[SessionEnd], now: float = 0.0) -> list[float]:
    out = []
    for how in ends:
        b.connecting()
        b.ended(how, now)
        out.append(b.next_pause())
    return out


def test_failed_connects_double_the_pause_up_to_the_maximum():
    b = SourceBackoff(max_s=2.0)
    assert CONNECT_BACKOFF_MIN_S == 0.05
    assert pauses(b, [SessionEnd.LOST] * 8) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_refusal_or_an_internal_error_waits_at_least_a_second():
    assert REFUSED_BACKOFF_MIN_S == 1.0
    for how in (SessionEnd.REFUSED, SessionEnd.FAILED):
        assert pauses(SourceBackoff(max_s=4.0), [how, how, how, how]) == [1.0, 2.0, 4.0, 4.0]
        # A longer pause is kept: the floor only raises it.
        assert pauses(SourceBackoff(max_s=8.0), [SessionEnd.LOST] * 6 + [how]) == \
            [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2]


def test_the_refusal_floor_is_kept_even_above_a_smaller_maximum():
    """As before the extraction: the floor wins for one pause, the doubling then stops at the maximum."""
    assert pauses(SourceBackoff(max_s=0.5), [SessionEnd.REFUSED, SessionEnd.LOST]) == [1.0, 0.5]


def test_a_clean_end_starts_short_again():
    b = SourceBackoff(max_s=2.0)
    pauses(b, [SessionEnd.LOST] * 6)
    assert pauses(b, [SessionEnd.CLEAN]) == [0.05]


def test_a_session_that_streamed_the_maximum_pause_resets_it():
    """The bug the integration test was written for: failures early in a server's life left every
    later reconnect (even after hours of streaming) at the longest pause."""
    b = SourceBackoff(max_s=4.0)
    assert pauses(b, [SessionEnd.LOST] * 8)[-1] == 4.0
    b.connecting()
    b.streaming(now=1000.0)
    b.ended(SessionEnd.LOST, now=1004.0)  # streamed exactly max_s
    assert b.next_pause() == 0.05
    assert pauses(b, [SessionEnd.LOST] * 2, now=1005.0) == [0.1, 0.2]  # then doubles again


def test_a_short_session_keeps_the_pause():
    b = SourceBackoff(max_s=4.0)
    pauses(b, [SessionEnd.LOST] * 8)
    b.connecting()
    b.streaming(now=1000.0)
    b.ended(SessionEnd.LOST, now=1003.99)
    assert b.next_pause() == 4.0


def test_a_long_session_ended_by_a_refusal_also_resets():
    """The receiver's Error after a long stream (e.g. its update process found a gap): the stream was
    healthy for a while, so the reset wins over the refusal floor, as in the server before."""
    b = SourceBackoff(max_s=4.0)
    pauses(b, [SessionEnd.LOST] * 8)
    b.connecting()
    b.streaming(now=0.0)
    b.ended(SessionEnd.REFUSED, now=10.0)
    assert b.next_pause() == 0.05


def test_only_the_session_that_streamed_counts():
    """``connecting`` forgets the last session's stream: a failed connect after it does not reset."""
    b = SourceBackoff(max_s=4.0)
    b.connecting()
    b.streaming(now=0.0)
    b.ended(SessionEnd.LOST, now=100.0)
    assert b.next_pause() == 0.05
    assert pauses(b, [SessionEnd.LOST] * 3, now=200.0) == [0.1, 0.2, 0.4]


# -- heartbeats ------------------------------------------------------------------------------------------

def test_a_heartbeat_answer_behind_the_batches_written_before_it_means_batches_were_lost():
    c = StreamCheck()
    c.sent(1, 520)
    assert c.answered(1, 520) is None  # everything written before heartbeat 1 arrived before it
    c.sent(2, 521)
    why = c.answered(2, 520)  # batch 521 vanished on the way: nothing else would ever show it
    assert why is not None and "521" in why and "520" in why


def test_stream_check_forgets_heartbeats_whose_answers_were_lost_and_bounds_what_it_keeps():
    c = StreamCheck()
    c.sent(1, 10)
    c.sent(2, 20)
    assert c.answered(2, 25) is None  # 1's answer never came: forgotten, not held against a later one
    assert c.answered(1, 0) is None
    assert c.answered(7, 0) is None  # an answer to a heartbeat it never recorded
    for seq in range(1, 1000):
        c.sent(seq, seq)
    assert len(c._sent) <= StreamCheck.MAX_PENDING


def test_a_receiver_silent_longer_than_the_timeout_is_lost():
    w = HeartbeatWatch(timeout_s=5.0, now=100.0)
    assert not w.lost(105.0) and w.silent_s(105.0) == 5.0  # exactly the timeout: not yet
    assert w.lost(105.1)
    w.answered(104.0)
    assert not w.lost(109.0) and w.lost(109.5) and w.silent_s(109.5) == 5.5


# -- receiver: a read's batches applied on its loop, or by the Update Process's thread ---------------

def test_inline_apply_waits_for_a_measured_apply_and_a_ready_update_process():
    from multisite.replication.session import InlineApply

    p = InlineApply(max_s=0.005, max_frames=256)
    assert not p.ok(4, update_ready=True)  # no apply measured yet: the thread's first
    p.took(0.001)
    assert p.ok(4, update_ready=True)
    assert not p.ok(4, update_ready=False)  # stopped, holding for room, or retrying a failed batch
    assert not p.ok(0, update_ready=True)  # nothing waits


def test_inline_apply_leaves_catch_up_reads_and_slow_applies_to_the_thread():
    from multisite.replication.session import InlineApply

    p = InlineApply(max_s=0.005, max_frames=256, weight=0.5)
    p.took(0.001)
    assert p.ok(256, update_ready=True) and not p.ok(257, update_ready=True)
    p.took(0.011)  # a slow fdatasync: the estimate 0.006 is past the bound
    assert abs(p.ewma_s - 0.006) < 1e-12 and not p.ok(4, update_ready=True)
    p.took(0.002)  # short again (applies on the thread keep measuring): back on the loop
    assert p.ok(4, update_ready=True)
