"""Guaranteed message delivery between two Message Agents, as one simulated world.

Two instances, X and Y, each publishing to the other: every link has the real sans-IO halves
(``delivery.machine.Sender`` on one side, ``Receiver`` on the other) and real messages
(``delivery.message.encode``/``decode``: msgpack, zstd, the CRC). The agent's poll
(``delivery/server/agent.py``: receive the inbox, apply what is ready, confirm, send) is mirrored
here, with its storage rules: ``log_received`` is stored in the same commit as what it covers, the
senders' and receivers' other counters at the end of a poll; a crash goes back to what was stored,
and the inbox (a folder) survives it. The transport loses, duplicates, delays and reorders messages.

Invariants, after every step:

- ``delivered-exactly-once-in-offset-order``: what a receiver applied is exactly the sender's
  journal up to its ``log_received``, in order, each transaction once;
- ``confirm-sent-at-most-log-sent``: ``confirm_sent <= log_sent`` (``Sender.check``), and
  ``confirm_received <= log_received`` (``Receiver.check``);
- ``confirmed-means-applied``: a sender's ``confirm_sent`` never passes what its recipient applied;
- ``delivery-completes``: at the end, with the transport fixed and some polls, everything is applied
  and confirmed both ways.
"""

from __future__ import annotations

import copy

from ...delivery.machine import (
    CONTROL,
    DUPLICATE,
    Receiver,
    ReceiveState,
    Sender,
    SendState,
)
from ...delivery.message import Message, Tx, decode, encode
from .core import Stats, Step, Violation, drive, rng_for

NAMES = ("X", "Y")
OFFSET_STEP = 100  # transaction k's COMMIT is at offset k * OFFSET_STEP (offsets grow, with gaps)
SETTLE_POLLS_MAX = 200


class Agent:
    def __init__(self, name: str, peer: str, max_txs: int):
        self.name, self.peer, self.max_txs = name, peer, max_txs
        self.journal: list[int] = []  # COMMIT offsets of this instance's transactions
        self.applied: list[int] = []  # offsets applied from the peer, in order (stored with log_received)
        self.inbox: list[Message] = []  # message files waiting in the inbox folder (decoded once, on arrival)
        self.stored_send = SendState()
        self.stored_recv = ReceiveState()
        self.up = True
        self.load()

    def load(self) -> None:
        """(Re)start: the states as stored; what waited in memory is gone, the inbox is read again."""
        self.snd = Sender(self.peer, copy.copy(self.stored_send))
        self.rcv = Receiver(self.peer, copy.copy(self.stored_recv))
        self.up = True

    # -- the poll (agent.py's _poll) ---------------------------------------------------------------
    def poll(self, out: list[bytes], now: float, *, store: bool = True) -> None:
        """One poll; ``store`` False: the process dies after sending, before it stored its counters
        (the messages are in the transport, ``log_sent`` as it was)."""
        probes = self._receive()
        confirmed = self._apply(now)
        self._send(out, confirmed, probes, now)
        if store:
            self.stored_send = copy.copy(self.snd.state)
            self.stored_recv = copy.copy(self.rcv.state)

    def _receive(self) -> bool:
        self.rcv.restart()
        probe, keep = False, []
        for msg in self.inbox:
            if msg.confirm:
                self.snd.on_confirm(msg.confirm, self.journal[-1] if self.journal else 0)
            if msg.resend:
                self.snd.on_resend(msg.resend_from, self.journal[-1] if self.journal else 0, msg.resend_id)
            probe |= msg.probe
            if self.rcv.offer(msg) not in (DUPLICATE, CONTROL):
                keep.append(msg)
        self.inbox = keep
        return probe

    def _apply(self, now: float) -> bool:
        applied = False
        while (parts := self.rcv.ready()) is not None:
            for tx in self.rcv.transactions(parts):
                self.applied.append(tx.offset)
            self.rcv.applied(parts, now)
            self.stored_recv = copy.copy(self.rcv.state)  # log_received in the same commit
            applied = True
        pos = self.rcv.position
        self.inbox = [m for m in self.inbox if m.last > pos]
        if applied:
            self.rcv.confirm()
        self.stored_recv = copy.copy(self.rcv.state)  # agent.py's _save("in") ends _apply, before any send
        return applied

    def _send(self, out: list[bytes], confirmed: bool, probes: bool, now: float) -> None:
        resend_from = self.rcv.end_poll()
        after = self.snd.scan_from()
        todo = [o for o in self.journal if o > after][:self.max_txs * 4]
        sent_any = False
        for i in range(0, len(todo), self.max_txs):
            chunk = todo[i:i + self.max_txs]
            prev = self.snd.state.log_sent
            out.append(encode(self._message(prev, chunk[-1], now, resend_from, chunk)))
            self.snd.sent(chunk[-1], now)
            sent_any = True
        probe = self.snd.end_poll() if not sent_any else False
        if not sent_any and (confirmed or probes or resend_from is not None or probe):
            pos = self.snd.state.log_sent
            out.append(encode(self._message(pos, pos, now, resend_from, [], probe=probe)))
        self.snd.check()

    def _message(self, prev: int, last: int, now: float, resend_from: int | None, offsets: list[int], *,
                 probe: bool = False) -> Message:
        snd, rcv = self.snd.state, self.rcv.state
        return Message(sender=self.name, recipient=self.peer, gen=snd.gen, prev=prev, last=last, start=snd.start,
                       confirm=rcv.confirm_received, resend=resend_from is not None, resend_from=resend_from or 0,
                       probe=probe, sent_upto=max(snd.log_sent, last), time=now,
                       txs=[Tx(o, o // OFFSET_STEP, []) for o in offsets],
                       resend_id=rcv.resend_id if resend_from is not None else 0)


class DeliveryWorld:
    def __init__(self, seed: int):
        cfg = rng_for(seed, "config")
        max_txs = cfg.choice((1, 3, 10))
        self.stats = Stats()
        self.now = 0.0
        self.agents = {"X": Agent("X", "Y", max_txs), "Y": Agent("Y", "X", max_txs)}
        self.wire: list[tuple[str, bytes]] = []  # (recipient, message) in the transport

    def apply(self, step: Step) -> None:
        kind, *a = step
        getattr(self, f"step_{kind}")(*a)

    def step_commit(self, i: int, n: int) -> None:
        a = self.agents[NAMES[i]]
        for _ in range(n):
            a.journal.append((len(a.journal) + 1) * OFFSET_STEP)
        self.stats.txns += n

    def step_poll(self, i: int) -> None:
        a = self.agents[NAMES[i]]
        if not a.up:
            return
        out: list[bytes] = []
        a.poll(out, self.now)
        self.wire += [(a.peer, m) for m in out]
        self.now += 0.01

    def _pick(self, k: int) -> int | None:
        return k % len(self.wire) if self.wire else None

    def step_deliver(self, k: int) -> None:
        i = self._pick(k)
        if i is not None:
            to, m = self.wire.pop(i)
            self.agents[to].inbox.append(decode(m, "sim"))

    def step_drop(self, k: int) -> None:
        i = self._pick(k)
        if i is not None:
            self.wire.pop(i)
            self.stats.note("dropped")

    def step_dup(self, k: int) -> None:
        i = self._pick(k)
        if i is not None:
            self.wire.append(self.wire[i])
            self.stats.note("duplicated")

    def step_crash(self, i: int, in_poll: bool) -> None:
        a = self.agents[NAMES[i]]
        if in_poll:
            out: list[bytes] = []
            a.poll(out, self.now, store=False)
            self.wire += [(a.peer, m) for m in out]
        a.load()
        self.stats.note("crashes")

    # -- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        for a in self.agents.values():
            peer = self.agents[a.peer]
            upto = a.rcv.state.log_received
            want = [o for o in peer.journal if o <= upto]
            if a.applied != want:
                dup = len(a.applied) != len(set(a.applied))
                raise Violation("delivered-exactly-once-in-offset-order",
                                f"{a.name} applied {len(a.applied)} transactions from {peer.name} "
                                f"({'with duplicates' if dup else 'out of order or with a gap'}); log_received "
                                f"{upto} covers {len(want)}")
            try:
                a.snd.check()
                a.rcv.check()
            except AssertionError as e:
                raise Violation("confirm-sent-at-most-log-sent", f"{a.name}: {e}") from None
            if a.snd.state.confirm_sent > peer.stored_recv.log_received:
                raise Violation("confirmed-means-applied",
                                f"{a.name} counts {a.snd.state.confirm_sent} confirmed, {peer.name} applied up to "
                                f"{peer.stored_recv.log_received}")

    def finish(self) -> None:
        """The transport delivers everything from now on; poll both until quiet."""
        for _ in range(SETTLE_POLLS_MAX):
            for i in range(2):
                self.step_poll(i)
                while self.wire:
                    self.step_deliver(0)
                self.check()
            done = all(a.rcv.state.log_received == (self.agents[a.peer].journal or [0])[-1]
                       and a.snd.state.confirm_sent == (a.journal or [0])[-1] for a in self.agents.values())
            if done:
                return
        raise Violation("delivery-completes", "after polls on a clean transport: " + "; ".join(
            f"{a.name} log_received {a.rcv.state.log_received}/{(self.agents[a.peer].journal or [0])[-1]}, "
            f"confirm_sent {a.snd.state.confirm_sent}/{(a.journal or [0])[-1]}" for a in self.agents.values()))


def generate(seed: int, n: int) -> list[Step]:
    r = rng_for(seed, "steps")
    weights = [("commit", 10), ("poll", 20), ("deliver", 25), ("drop", 2), ("dup", 2), ("crash", 1)]
    kinds = [k for k, w in weights for _ in range(w)]
    steps: list[Step] = []
    for _ in range(n):
        k = r.choice(kinds)
        if k == "commit":
            steps.append(("commit", r.randrange(2), r.randint(1, 5)))
        elif k == "poll":
            steps.append(("poll", r.randrange(2)))
        elif k == "crash":
            steps.append(("crash", r.randrange(2), r.random() < 0.5))
        else:
            steps.append((k, r.randrange(1 << 16)))
    return steps


class Delivery:
    name = "delivery"

    def generate(self, seed: int, n: int) -> list[Step]:
        return generate(seed, n)

    def replay(self, seed: int, steps: list[Step]) -> Stats:
        return drive(DeliveryWorld(seed), steps)
