"""The ordering and confirmation logic of one link (this instance and one remote user), without I/O.

Two halves, each a small state machine over the four offsets of the seed's SYSREMOTEUSER row:

- ``Sender`` keeps ``log_sent`` (the offset of the last COMMIT sent) and ``confirm_sent`` (the last one
  the recipient confirmed). It says where the next scan of the journal starts, takes confirmations and
  resend requests, and asks for a probe (a message saying how far it has sent) when a link stays
  unconfirmed, so that a receiver whose last message was lost learns that it misses something.
- ``Receiver`` keeps ``log_received`` (the offset of the last COMMIT applied) and ``confirm_received``
  (the last one confirmed back). It is offered every message that arrives, in any order, any number
  of times; it answers which complete message (group of parts) applies next, drops what is at or
  below ``log_received`` (duplicates) and keeps the rest waiting; when a gap stays for some polls it
  asks for a resend from ``confirm_received``, backing off while the resend is on its way.

Both are fed by the Message Agent (``agent.py``), which does the reading, applying and writing, and
stores the states (``SendState``, ``ReceiveState``) crash-safely in the instance: ``log_received`` in the
same commit as the transactions it covers, so a restart neither loses nor repeats one. What is waiting
is not state: the messages stay in the transport until applied and are offered again after a restart.

Invariants (checked by ``check``, and under Hypothesis in the tests): ``confirm_sent <= log_sent``; the
offsets never go back except ``log_sent`` on a resend, and then not below ``confirm_sent``;
``confirm_received <= log_received``; ``log_received`` is the subscription's start or the ``last`` of an
applied message, an offset of a COMMIT in the sender's journal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import OffsetMismatch
from .message import Message, Tx

PROBE_AFTER_POLLS = 3  # polls of an unconfirmed link before the sender says how far it has sent
GAP_POLLS_BEFORE_RESEND = 2  # polls of a gap before the receiver asks for a resend
MAX_GAP_POLLS_BEFORE_RESEND = 64  # the backoff's limit while resends are on their way


@dataclass
class SendState:
    log_sent: int = 0
    confirm_sent: int = 0
    start: int = 0  # the subscription's first offset (log_sent and confirm_sent began there)
    gen: int = 0
    idle_polls: int = 0
    time_sent: float = 0.0
    resend_seen: int = 0  # the last resend request served (a request waiting or duplicated is served once)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReceiveState:
    log_received: int = 0
    confirm_received: int = 0
    start: int = 0
    seen_upto: int = 0
    gap_polls: int = 0
    resends: int = 0  # resend requests since the last progress (the backoff's exponent)
    time_received: float = 0.0
    resend_id: int = 0  # numbers this side's resend requests, so that the sender serves each once

    def to_dict(self) -> dict:
        return asdict(self)


class Sender:
    """The outgoing half of a link."""

    def __init__(self, user: str, state: SendState, *, probe_after_polls: int = PROBE_AFTER_POLLS):
        self.user, self.state, self.probe_after_polls = user, state, probe_after_polls

    def scan_from(self) -> int:
        """The offset after which the next scan of the journal starts."""
        return self.state.log_sent

    def sent(self, last: int, now: float = 0.0) -> None:
        """Messages up to ``last`` were handed to the transport."""
        st = self.state
        if last < st.log_sent:
            raise OffsetMismatch(f"link to {self.user}: sent up to {last}, behind log_sent {st.log_sent}")
        if last > st.log_sent:
            st.log_sent, st.time_sent = last, now

    def _catch_up(self, offset: int, journal_end: int | None, what: str) -> None:
        """``offset`` is past ``log_sent``: messages up to it were sent by a run that died before it
        stored ``log_sent`` (the recipient has them). Past the journal's end it is someone else's."""
        st = self.state
        if journal_end is not None and offset > journal_end:
            raise OffsetMismatch(f"{self.user} {what} offset {offset}, past the end of this journal ({journal_end}): "
                                 f"the two sides' state does not agree (restored from a backup?); re-extract "
                                 f"{self.user}")
        st.log_sent = offset

    def on_confirm(self, offset: int, journal_end: int | None = None) -> bool:
        """The recipient applied everything up to ``offset``; True if ``confirm_sent`` moved."""
        st = self.state
        if offset == 0 or offset <= st.confirm_sent:
            return False
        if offset > st.log_sent:
            self._catch_up(offset, journal_end, "confirms")
        st.confirm_sent, st.idle_polls = offset, 0
        return True

    def on_resend(self, offset: int, journal_end: int | None = None, request: int = 0) -> int | None:
        """The recipient asks for everything after ``offset`` (its ``confirm_received``; 0: from the start)
        again: ``log_sent`` goes back to it (never below ``confirm_sent``), and the next messages
        are a new generation. Returns where the resend starts, or None for a request (numbered
        ``request``) already served: a message carrying it may wait, or come twice, and must not
        make the sender resend its whole backlog each time it is read."""
        st = self.state
        if request and request == st.resend_seen:  # (not "<=": a re-extracted remote numbers from 1 again)
            return None
        st.resend_seen = request
        if offset > st.log_sent:
            self._catch_up(offset, journal_end, "asks for a resend after")
        at = max(offset, st.confirm_sent)
        st.confirm_sent = at
        st.log_sent = at
        st.gen += 1
        st.idle_polls = 0
        return at

    def end_poll(self) -> bool:
        """One poll is over; True when the sender should send a probe (its ``log_sent``)."""
        st = self.state
        if st.log_sent <= st.confirm_sent:
            st.idle_polls = 0
            return False
        st.idle_polls += 1
        if st.idle_polls >= self.probe_after_polls:
            st.idle_polls = 0
            return True
        return False

    def check(self) -> None:
        st = self.state
        assert 0 <= st.confirm_sent <= st.log_sent, (st.confirm_sent, st.log_sent)


DUPLICATE, WAITING, CONTROL = "duplicate", "waiting", "control"


class Receiver:
    """The incoming half of a link."""

    def __init__(self, user: str, state: ReceiveState, *, gap_polls_before_resend: int = GAP_POLLS_BEFORE_RESEND):
        self.user, self.state = user, state
        self.gap_polls_before_resend = gap_polls_before_resend
        self.pending: dict[tuple[int, int, int, int], dict[int, Message]] = {}

    @property
    def position(self) -> int:
        """Everything up to this offset was applied (the subscription's start before any message)."""
        return max(self.state.log_received, self.state.start)

    def offer(self, msg: Message) -> str:
        """A message arrived (again, perhaps): DUPLICATE (drop it), CONTROL (no data: consumed), or
        WAITING (kept until ``ready`` hands it out)."""
        st = self.state
        if msg.start and not st.start:
            st.start = msg.start
        st.seen_upto = max(st.seen_upto, msg.sent_upto, msg.last)
        if not msg.is_data:
            return CONTROL
        if msg.last <= self.position:
            return DUPLICATE
        self.pending.setdefault(msg.group, {})[msg.seq] = msg
        return WAITING

    def ready(self) -> list[Message] | None:
        """The parts of the next complete message to apply (it starts at or before ``position`` and
        goes past it), or None. Groups wholly at or below ``position`` are dropped meanwhile."""
        pos = self.position
        best = None
        for group in list(self.pending):
            gen, prev, last, parts = group
            if last <= pos:
                del self.pending[group]
                continue
            if prev <= pos and len(self.pending[group]) == parts and (best is None or last < best[2]):
                best = group
        if best is None:
            return None
        got = self.pending[best]
        return [got[i] for i in range(best[3])]

    def transactions(self, parts: list[Message]) -> list[Tx]:
        """The transactions of a complete message still to apply: parts of one transaction joined,
        those at or below ``position`` skipped (a resend may overlap what was applied)."""
        pos = self.position
        if len(parts) == 1:
            return [tx for tx in parts[0].txs if tx.offset > pos]
        first = parts[0].txs[0]
        updates = [u for p in parts for tx in p.txs for u in tx.updates]
        return [Tx(first.offset, first.seqno, updates)] if first.offset > pos else []

    def applied(self, parts: list[Message], now: float = 0.0) -> int:
        """The message was applied (and ``log_received`` stored with it): the new ``log_received``."""
        st = self.state
        last = parts[0].last
        if last <= self.position:
            raise OffsetMismatch(f"message {parts[0].name} from {self.user} applied twice")
        st.log_received, st.time_received = last, now
        st.gap_polls = st.resends = 0
        self.pending.pop(parts[0].group, None)
        return last

    def waiting(self) -> int:
        return sum(len(v) for v in self.pending.values())

    def end_poll(self) -> int | None:
        """One poll is over (everything ready was applied). When a gap stays (messages wait that cannot
        apply, or the sender said it sent past what arrived) for some polls, the offset to ask the
        sender to resend after: ``confirm_received`` (0 if nothing was confirmed yet)."""
        st = self.state
        gap = bool(self.pending) or st.seen_upto > self.position
        if not gap:
            st.gap_polls = st.resends = 0
            return None
        st.gap_polls += 1
        if st.gap_polls < min(self.gap_polls_before_resend << st.resends, MAX_GAP_POLLS_BEFORE_RESEND):
            return None
        st.gap_polls = 0
        st.resends += 1
        st.resend_id += 1
        return st.confirm_received

    def confirm(self) -> int:
        """``confirm_received`` catches up with ``log_received``: the offset to confirm."""
        st = self.state
        st.confirm_received = st.log_received
        return st.confirm_received

    def restart(self) -> None:
        """The agent restarted: what waited in memory is gone (it is still in the transport)."""
        self.pending.clear()

    def check(self) -> None:
        st = self.state
        assert 0 <= st.confirm_received <= st.log_received, (st.confirm_received, st.log_received)
