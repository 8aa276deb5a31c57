"""The link machine (delivery.machine) with the message cutting (delivery.build.cut), without I/O: a
sender and a receiver joined by a network that loses, duplicates and reorders messages both ways,
and agents that restart (losing what was not stored) at any step. Every transaction must be applied
exactly once, in offset order, and the four offsets must keep their invariants after every step;
once the network heals, everything arrives."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multisite.delivery.build import cut
from multisite.delivery.machine import CONTROL, DUPLICATE, Receiver, ReceiveState, Sender, SendState
from multisite.delivery.message import Message, Tx
from multisite.errors import OffsetMismatch
from multisite.journal.records import SET, Update

START = 1000


class Link:
    """A sender, a receiver, the journal and the network between them, as a plain model."""

    def __init__(self, message_bytes: int):
        self.message_bytes = message_bytes
        self.journal: list[Tx] = []  # the sender's transactions, in offset order
        self.sstate = SendState(log_sent=START, confirm_sent=START, start=START)
        self.sender = Sender("R", copy.deepcopy(self.sstate), probe_after_polls=2)
        self.rstate = ReceiveState()
        self.receiver = Receiver("S", copy.deepcopy(self.rstate), gap_polls_before_resend=2)
        self.to_receiver: list[Message] = []  # in flight
        self.inbox: list[Message] = []  # arrived, not yet applied (on disk)
        self.to_sender: list[Message] = []
        self.applied: list[int] = []  # offsets applied, in order
        self.resend_from: int | None = None

    def commit(self, size: int) -> None:
        off = (self.journal[-1].offset if self.journal else START) + 10 + size
        ups = [Update(SET, "r", (len(self.journal), i), b"x" * 40) for i in range(size)]
        self.journal.append(Tx(off, len(self.journal) + 1, ups))

    # -- the sender's poll ----------------------------------------------------------------------
    def sender_poll(self, crash: bool) -> None:
        snd = self.sender
        for m in self.to_sender_arrived():
            if m.confirm:
                snd.on_confirm(m.confirm)
            if m.resend:
                snd.on_resend(m.resend_from)
        after = snd.scan_from()
        txs = [tx for tx in self.journal if tx.offset > after]
        sent = False
        for d in cut(after, txs, self.message_bytes):
            self.to_receiver.append(Message("S", "R", snd.state.gen, d.prev, d.last, d.seq, d.parts, start=START,
                                            sent_upto=max(d.last, snd.state.log_sent), txs=d.txs))
            sent = True
            if d.seq == d.parts - 1:
                snd.sent(d.last)
        if not sent and snd.end_poll():
            pos = snd.state.log_sent
            self.to_receiver.append(Message("S", "R", snd.state.gen, pos, pos, start=START, sent_upto=pos, probe=True))
        snd.check()
        if crash:  # the state was not stored: the restarted agent reads the old one
            self.sender = Sender("R", copy.deepcopy(self.sstate), probe_after_polls=2)
        else:
            self.sstate = copy.deepcopy(snd.state)

    def to_sender_arrived(self) -> list[Message]:
        got, self.to_sender = self.to_sender, []
        return got

    # -- the receiver's poll --------------------------------------------------------------------
    def receiver_poll(self, crash_after_applies: int | None) -> None:
        rcv = self.receiver
        rcv.restart()
        probe = False
        keep = []
        for m in self.inbox:
            v = rcv.offer(m)
            probe |= m.probe
            if v not in (DUPLICATE, CONTROL):
                keep.append(m)
        self.inbox = keep
        applied = 0
        while (parts := rcv.ready()) is not None:
            if crash_after_applies is not None and applied == crash_after_applies:
                self._restart_receiver()
                return
            txs = rcv.transactions(parts)
            for tx in txs:
                assert not self.applied or tx.offset > self.applied[-1], "out of order or twice"
                self.applied.append(tx.offset)
            rcv.applied(parts)
            self.rstate.log_received = rcv.state.log_received  # stored in the same commit as the data
            self.inbox = [m for m in self.inbox if m.last > rcv.position]
            applied += 1
        if applied:
            rcv.confirm()
        resend = rcv.end_poll()
        self.rstate = copy.deepcopy(rcv.state)
        if applied or probe or resend is not None:
            pos = rcv.state.confirm_received
            self.to_sender.append(Message("R", "S", 0, 0, 0, confirm=pos, resend=resend is not None,
                                          resend_from=resend or 0))
        rcv.check()

    def _restart_receiver(self) -> None:
        self.receiver = Receiver("S", copy.deepcopy(self.rstate), gap_polls_before_resend=2)

    # -- the network ----------------------------------------------------------------------------
    def deliver(self, i: int) -> None:
        if self.to_receiver:
            self.inbox.append(self.to_receiver.pop(i % len(self.to_receiver)))

    def lose(self, i: int) -> None:
        if self.to_receiver:
            self.to_receiver.pop(i % len(self.to_receiver))

    def duplicate(self, i: int) -> None:
        if self.to_receiver:
            self.to_receiver.append(self.to_receiver[i % len(self.to_receiver)])

    def lose_back(self, i: int) -> None:
        if self.to_sender:
            self.to_sender.pop(i % len(self.to_sender))

    def check(self) -> None:
        s, r = self.sender.state, self.receiver.state
        assert s.confirm_sent <= s.log_sent
        assert r.confirm_received <= r.log_received
        offsets = {tx.offset for tx in self.journal} | {START}
        assert r.log_received == 0 or r.log_received in offsets  # an offset of the sender's journal
        assert s.confirm_sent in offsets and s.log_sent in offsets
        assert self.applied == sorted(set(self.applied))
        assert s.confirm_sent <= max(r.log_received, START)  # nothing confirmed that was not applied


ACTIONS = st.one_of(
    st.tuples(st.just("commit"), st.integers(1, 6)),
    st.tuples(st.just("send"), st.booleans()),
    st.tuples(st.just("receive"), st.one_of(st.none(), st.integers(0, 2))),
    st.tuples(st.just("deliver"), st.integers(0, 50)),
    st.tuples(st.just("lose"), st.integers(0, 50)),
    st.tuples(st.just("duplicate"), st.integers(0, 50)),
    st.tuples(st.just("lose_back"), st.integers(0, 50)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=60), st.sampled_from([150, 400, 2000]))
def test_every_transaction_is_applied_once_in_offset_order_under_loss_duplication_reordering_restarts(actions,
                                                                                                       mbytes):
    link = Link(mbytes)
    for what, arg in actions:
        if what == "commit":
            link.commit(arg)
        elif what == "send":
            link.sender_poll(crash=arg)
        elif what == "receive":
            link.receiver_poll(arg)
        else:
            getattr(link, what)(arg)
        link.check()
    # The network heals: messages are delivered as sent, agents poll in turn.
    for _ in range(60):
        link.sender_poll(crash=False)
        while link.to_receiver:
            link.deliver(0)
        link.receiver_poll(None)
        link.check()
        if link.applied == [tx.offset for tx in link.journal] and link.sender.state.confirm_sent == (
                link.journal[-1].offset if link.journal else START):
            break
    assert link.applied == [tx.offset for tx in link.journal]
    assert link.sender.state.confirm_sent == link.sender.state.log_sent


def test_a_confirmation_past_log_sent_moves_it_unless_past_the_journal():
    s = Sender("R", SendState(log_sent=10, confirm_sent=5, start=5))
    with pytest.raises(OffsetMismatch):
        s.on_confirm(30, journal_end=20)  # never sent: the sides disagree
    assert s.on_confirm(8) and s.state.confirm_sent == 8
    assert not s.on_confirm(7)  # an old confirmation changes nothing
    # sent by a run killed before it stored log_sent: the confirmation says how far it got
    assert s.on_confirm(15, journal_end=20) and (s.state.log_sent, s.state.confirm_sent) == (15, 15)


def test_a_resend_goes_back_to_confirm_sent_at_least_and_starts_a_new_generation():
    s = Sender("R", SendState(log_sent=50, confirm_sent=20, start=5))
    assert s.on_resend(0) == 20
    assert (s.state.log_sent, s.state.confirm_sent, s.state.gen) == (20, 20, 1)
    s.sent(50)
    assert s.on_resend(30) == 30 and s.state.confirm_sent == 30


def test_a_resend_request_is_served_once_however_often_its_message_is_read():
    s = Sender("R", SendState(log_sent=50, confirm_sent=20, start=5))
    assert s.on_resend(20, request=1) == 20 and s.state.gen == 1
    s.sent(50)
    # the same request again (its message waits in the inbox, or came twice): no second resend
    assert s.on_resend(20, request=1) is None and (s.state.log_sent, s.state.gen) == (50, 1)
    assert s.on_resend(20, request=2) == 20 and s.state.gen == 2  # a new request is served
    r = Receiver("S", ReceiveState(), gap_polls_before_resend=1)
    r.state.seen_upto = 10  # the sender sent past what arrived: a gap
    assert r.end_poll() == 0 and r.state.resend_id == 1


def test_a_message_waits_for_its_predecessor_and_a_duplicate_is_dropped():
    r = Receiver("S", ReceiveState())
    m1 = Message("S", "R", 0, 100, 110, start=100, txs=[Tx(110, 1, [])])
    m2 = Message("S", "R", 0, 110, 120, start=100, txs=[Tx(120, 2, [])])
    assert r.offer(m2) == "waiting" and r.ready() is None
    assert r.offer(m1) == "waiting"
    got = r.ready()
    assert got == [m1]
    r.applied(got)
    assert r.ready() == [m2]
    r.applied([m2])
    assert r.offer(m1) == DUPLICATE and r.state.log_received == 120


def test_a_gap_asks_for_a_resend_from_confirm_received_with_backoff():
    r = Receiver("S", ReceiveState(log_received=110, confirm_received=105, start=100), gap_polls_before_resend=2)
    r.offer(Message("S", "R", 0, 130, 140, start=100, txs=[Tx(140, 4, [])]))
    assert r.end_poll() is None
    assert r.end_poll() == 105
    assert [r.end_poll() for _ in range(4)] == [None, None, None, 105]  # twice as long the second time
