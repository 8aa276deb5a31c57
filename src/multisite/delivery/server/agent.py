"""The Message Agent (the seed's dbremote): one poll receives, applies, confirms and sends.

A poll, for an open instance with a delivery setup:

1. **Receive.** Read every message in the inbox folder. One that cannot be read (damaged, truncated,
   failing authentication, from an unknown user, for another instance) is moved to ``rejected/`` and
   logged, never applied. The others feed their link's ``Sender`` (confirmations, resend requests)
   and ``Receiver`` (data): duplicates and control messages are removed, the rest wait on disk.
2. **Apply.** For each link, while its ``Receiver`` has a complete next message: commit its
   transactions with the new ``log_received`` (``apply.apply_message``), then remove its files. Then
   ``confirm_received`` catches up and is committed, before any confirmation leaves (the seed's order).
3. **Send.** For each link, scan the journal from ``log_sent`` (``build``), write the messages through
   the link's outbox, then commit ``log_sent``. Every message carries the confirmation; with no data
   to send, a control message goes when there is a confirmation, a resend request or a probe to send.

A crash anywhere leaves a state a later poll continues from: applied transactions and their
``log_received`` are one commit; a message written but not recorded in ``log_sent`` is written again
(and dropped as a duplicate if the first copy arrived); a confirmation lost is asked for by the
sender's probe. See ``DESIGN.md``.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ...errors import (DeliveryConfigError, DeliveryError, MessageAuthFailed, MessageCorrupt, OffsetMismatch,
                       StorageFull)
from ...journal.durability import Durability
from ...journal.offsets import end_offset, split_offset
from .. import sysremote
from .apply import apply_message
from ..build import MESSAGE_BYTES_DEFAULT, Route, cut, scan
from ..machine import CONTROL, DUPLICATE, Receiver, Sender
from ..message import Message, decode, encode, parse_key, peek_sender
from ..sysremote import ROLE_REMOTE, Link
from .transport import Inbox, Outbox, file_name, inbox_folder, open_outbox

log = logging.getLogger("multisite.delivery")

MAX_POLL_TXS = 250_000  # transactions one link's scan reads per poll (bounds the memory of a catch-up)


@dataclass
class PollReport:
    received: int = 0
    applied_messages: int = 0
    applied_transactions: int = 0
    conflicts: int = 0
    duplicates: int = 0
    waiting: int = 0
    rejected: list[str] = field(default_factory=list)
    sent_messages: int = 0
    sent_transactions: int = 0
    resend_requests: int = 0
    controls: int = 0  # control messages taken in (confirmations, resend requests, probes)
    link_errors: list[str] = field(default_factory=list)  # links whose transport failed this poll
    controls_sent: int = 0

    @property
    def busy(self) -> bool:
        """Did the poll change anything? Messages still waiting (read again each poll) and control
        messages sent (a probe to a peer that is away goes out every few polls) do not count."""
        return bool(self.applied_messages or self.sent_messages or self.duplicates or self.rejected
                    or self.controls)


class Agent:
    """The Message Agent of one open instance (``db``)."""

    def __init__(self, db, *, message_bytes: int = MESSAGE_BYTES_DEFAULT, max_poll_txs: int = MAX_POLL_TXS,
                 clock: Callable[[], float] = time.time, outbox: Callable[[str, Path], Outbox] = open_outbox,
                 gap_polls_before_resend: int | None = None, probe_after_polls: int | None = None,
                 feeders: tuple = ()):
        """``feeders``: objects whose ``feed()`` moves messages from a wire into the inbox folder (the http
        and broker transports, in ``net``); each poll calls them first."""
        if message_bytes < 1:
            raise DeliveryConfigError(f"message_bytes must be at least 1, got {message_bytes}")
        self.db, self.clock, self.message_bytes, self.max_poll_txs = db, clock, message_bytes, max_poll_txs
        self.setup = sysremote.load(db)
        if not self.setup.role:
            raise DeliveryConfigError(f"instance {db.name} has no delivery setup: run `multisite delivery publish` "
                                      f"(consolidated) or `multisite delivery remote-setup` (remote) first")
        folder = inbox_folder(self.setup.inbox)
        if folder is None:
            raise DeliveryConfigError(f"instance {db.name}'s inbox {self.setup.inbox!r} is not a folder")
        self.inbox = Inbox(folder)
        self._outbox_factory = outbox
        self._outboxes: dict[str, Outbox] = {}
        self.keys = {u: parse_key(l.key, f"key of {u}") if l.key else None for u, l in self.setup.links.items()}
        self.senders: dict[str, Sender] = {}
        self.receivers: dict[str, Receiver] = {}
        for u in self.setup.links:
            kw = {} if probe_after_polls is None else {"probe_after_polls": probe_after_polls}
            self.senders[u] = Sender(u, sysremote.send_state(db, u), **kw)
            kw = {} if gap_polls_before_resend is None else {"gap_polls_before_resend": gap_polls_before_resend}
            self.receivers[u] = Receiver(u, sysremote.receive_state(db, u), **kw)
        self._saved = {(u, h): self._half(u, h).to_dict() for u in self.setup.links for h in ("out", "in")}
        self._files: dict[tuple[str, tuple], list[Path]] = {}
        self.feeders = list(feeders)
        self._kept: dict[str, int] = {}  # the journal segment each link's prune mark keeps
        self._regions = {u: frozenset(self.setup.publications[l.publication].regions) if l.publication in
                         self.setup.publications else frozenset() for u, l in self.setup.links.items()}
        for u, l in self.setup.links.items():
            if "://" in l.address and not l.address.startswith("file:") and not l.key:
                log.warning("the link to %s goes through %s without a key: its messages are readable and "
                            "unauthenticated on the way (subscribe with --key-file)", u, l.address)

    def _half(self, user: str, half: str):
        return self.senders[user].state if half == "out" else self.receivers[user].state

    # -- 1. receive --------------------------------------------------------------------------------
    def _receive(self, rep: PollReport, probes: set[str]) -> None:
        self._files.clear()
        for r in self.receivers.values():
            r.restart()  # what waits is re-read from the inbox: the folder is the truth
        for path in self.inbox.list():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            rep.received += 1
            try:
                sender = peek_sender(data, str(path))
                link = self.setup.links.get(sender)
                if link is None:
                    raise MessageAuthFailed(f"message {path} is from {sender!r}, not a remote user of "
                                            f"{self.db.name}: refused")
                msg = decode(data, str(path), self.keys[sender])
                if msg.recipient != self.db.name or msg.sender != sender:
                    raise MessageAuthFailed(f"message {path} is for {msg.recipient!r} from {msg.sender!r}, "
                                            f"not for {self.db.name} from {sender!r}: refused")
                self._control(msg, rep, probes)
            except (MessageCorrupt, MessageAuthFailed, OffsetMismatch) as e:
                log.error("rejected %s: %s", path, e)
                self.inbox.reject(path, str(e))
                rep.rejected.append(f"{path.name}: {e}")
                continue
            verdict = self.receivers[sender].offer(msg)
            if verdict in (DUPLICATE, CONTROL):
                rep.controls += verdict == CONTROL
                if verdict == DUPLICATE:
                    rep.duplicates += 1
                    log.info("dropped duplicate %s from %s", msg.name, sender)
                self.inbox.remove(path)
            else:
                self._files.setdefault((sender, msg.group), []).append(path)

    def _journal_end(self, offset: int, snd: Sender) -> int | None:
        """The journal's end offset, read only when a peer names an offset past ``log_sent`` (rare)."""
        return end_offset(self.db.layout.journal) if offset > snd.state.log_sent else None

    def _control(self, msg: Message, rep: PollReport, probes: set[str]) -> None:
        snd = self.senders[msg.sender]
        if msg.confirm and snd.on_confirm(msg.confirm, self._journal_end(msg.confirm, snd)):
            log.info("%s confirmed up to %s", msg.sender, msg.confirm)
        if msg.resend:
            at = snd.on_resend(msg.resend_from, self._journal_end(msg.resend_from, snd), msg.resend_id)
            if at is not None:
                log.info("%s asked for a resend after %s: resending after %s as generation %s", msg.sender,
                         msg.resend_from, at, snd.state.gen)
        if msg.probe:
            probes.add(msg.sender)

    # -- 2. apply ----------------------------------------------------------------------------------
    def _apply(self, rep: PollReport) -> set[str]:
        confirmed = set()
        for user, rcv in self.receivers.items():
            link = self.setup.links[user]
            applied = False
            while (parts := rcv.ready()) is not None:
                now = self.clock()
                txs = rcv.transactions(parts)
                new = replace(rcv.state, log_received=parts[0].last, time_received=now, gap_polls=0, resends=0)
                res = apply_message(self.db, user, txs, sysremote.state_op(user, "in", new),
                                    check_conflicts=link.peer_role == ROLE_REMOTE, now=now,
                                    regions_allowed=self._regions[user])
                rcv.applied(parts, now)
                self._saved[(user, "in")] = rcv.state.to_dict()
                applied = True
                rep.applied_messages += 1
                rep.applied_transactions += res.transactions
                rep.conflicts += res.conflicts
                log.info("applied %s from %s: %d transactions, %d updates, %d conflicts (log_received %s)",
                         parts[0].name, user, res.transactions, res.updates, res.conflicts, rcv.state.log_received)
                if res.refused:
                    log.warning("refused %d update(s) from %s in %s to regions outside publication %s",
                                res.refused, user, parts[0].name, link.publication)
                for p in self._files.pop((user, parts[0].group), []):
                    self.inbox.remove(p)
            for (u, group), paths in list(self._files.items()):
                if u == user and group[2] <= rcv.position:  # wholly applied already: duplicates
                    for p in paths:
                        self.inbox.remove(p)
                    rep.duplicates += len(paths)
                    del self._files[(u, group)]
            rep.waiting += rcv.waiting()
            if applied:
                rcv.confirm()
                confirmed.add(user)
        self._save("in")
        return confirmed

    # -- 3. send -----------------------------------------------------------------------------------
    def _outbox(self, link: Link) -> Outbox:
        if link.user not in self._outboxes:
            spool = self.db.layout.root / "delivery" / "outbox" / link.user
            self._outboxes[link.user] = self._outbox_factory(link.address, spool)
        return self._outboxes[link.user]

    def _send(self, rep: PollReport, confirmed: set[str], probes: set[str]) -> None:
        for user in self.senders:
            try:
                self._send_link(user, rep, confirmed, probes)
            except (DeliveryError, DeliveryConfigError, StorageFull) as e:  # this link cannot send now: the others go on
                rep.link_errors.append(f"{user}: {e}")
                log.error("sending to %s failed: %s (log_sent stays at %s; sent again next poll)", user, e,
                          self.senders[user].state.log_sent)
        self._save("out")
        self._save("in")  # the receivers' gap counters
        for user, snd in self.senders.items():
            index = split_offset(snd.state.confirm_sent)[0]
            if self._kept.get(user) != index:
                sysremote.keep_journal_for(self.db, user, snd.state.confirm_sent)
                self._kept[user] = index

    def _send_link(self, user: str, rep: PollReport, confirmed: set[str], probes: set[str]) -> None:
        jdir = self.db.layout.journal
        snd = self.senders[user]
        link, rcv = self.setup.links[user], self.receivers[user]
        resend_from = rcv.end_poll()
        if resend_from is not None:
            rep.resend_requests += 1
            log.info("gap from %s (log_received %s, %d waiting, sender at %s): asking for a resend after %s",
                     user, rcv.state.log_received, rcv.waiting(), rcv.state.seen_upto, resend_from)
        pub = self.setup.publications[link.publication]
        route = Route.of(link, pub, snd.scan_from())
        scan(jdir, route, self.max_poll_txs)
        now = self.clock()
        sent_any = False
        outbox = self._outbox(link)
        if hasattr(outbox, "retry"):
            outbox.retry()  # what an earlier poll could not deliver goes first
        for d in cut(route.after, route.txs, self.message_bytes, route.advance_to, route.sizes):
            msg = self._message(user, d.prev, d.last, now, resend_from, txs=d.txs, seq=d.seq, parts=d.parts)
            outbox.send(file_name(msg), encode(msg, self.keys[user]))
            sent_any = True
            rep.sent_messages += 1
            log.info("sent %s to %s: %d transactions", msg.name, user, len(d.txs))
            if d.seq == d.parts - 1:
                rep.sent_transactions += len(d.txs) if d.parts == 1 else 1
                snd.sent(d.last, now)
        probe = snd.end_poll() if not sent_any else False
        if not sent_any and (user in confirmed or user in probes or resend_from is not None or probe):
            pos = snd.state.log_sent
            msg = self._message(user, pos, pos, now, resend_from, probe=probe)
            outbox.send(file_name(msg), encode(msg, self.keys[user]))
            rep.controls_sent += 1
            log.info("sent control %s to %s: confirm %s%s%s", msg.name, user, msg.confirm,
                     f", resend after {resend_from}" if resend_from is not None else "",
                     ", probe" if probe else "")
        snd.check()

    def _message(self, user: str, prev: int, last: int, now: float, resend_from: int | None, *,
                 txs=(), seq: int = 0, parts: int = 1, probe: bool = False) -> Message:
        snd, rcv = self.senders[user].state, self.receivers[user].state
        return Message(sender=self.db.name, recipient=user, gen=snd.gen, prev=prev, last=last, seq=seq,
                       parts=parts, start=snd.start, confirm=rcv.confirm_received,
                       resend=resend_from is not None, resend_from=resend_from or 0, probe=probe,
                       sent_upto=max(snd.log_sent, last), time=now, txs=list(txs),
                       resend_id=rcv.resend_id if resend_from is not None else 0)

    def _save(self, half: str) -> None:
        """Commit the rows of ``half`` that changed since they were last stored (one transaction)."""
        ops, saved = [], {}
        for user in self.setup.links:
            d = self._half(user, half).to_dict()
            if self._saved.get((user, half)) != d:
                ops.append(sysremote.state_op(user, half, self._half(user, half)))
                saved[(user, half)] = d
        if ops:
            self.db.commit_updates(ops)
            self._saved.update(saved)

    # -- the poll ----------------------------------------------------------------------------------
    def poll(self) -> PollReport:
        """One round: receive, apply, confirm, send. The cyclic garbage collector is off meanwhile: a
        poll makes millions of small objects (decoded transactions) and no cycles, and its passes
        over them cost as much as decoding them."""
        was = gc.isenabled()
        gc.disable()
        try:
            return self._poll()
        finally:
            if was:
                gc.enable()

    def _poll(self) -> PollReport:
        rep = PollReport()
        probes: set[str] = set()
        for f in self.feeders:
            f.feed()
        self._receive(rep, probes)
        confirmed = self._apply(rep)
        if self.db.durability is Durability.NONE:
            # nothing is confirmed, and no offset leaves, before it is on disk: after a power cut a
            # confirmed transaction would be gone here, or an offset reused for another one
            self.db.flush()
        self._send(rep, confirmed, probes)
        return rep

    def close(self) -> None:
        for ob in self._outboxes.values():
            ob.close()
        self._outboxes.clear()
        for f in self.feeders:
            f.close()
        self.feeders.clear()
