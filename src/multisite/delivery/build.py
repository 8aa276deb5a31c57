"""Building messages: the journal's transactions after a link's ``log_sent``, filtered by its
publication, cut into messages of at most ``message_bytes``.

Each link scans the journal from its own ``log_sent`` (a far-behind link does not hold the others back);
a transaction goes to the links whose publication it touches, except the one it was received from (a remote's change goes
on to the other subscribers, not back). With a subscribe-by field, a row goes to the subscribers
whose value its new value holds; a row whose value moved away from a subscriber's is deleted there
(a ``zkill``), as SQL Remote's subscribe-by updates do. A transaction larger than ``message_bytes`` is
cut into parts: messages with the same ``prev`` and ``last`` and ``seq`` 0, 1, ... (see ``message``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..journal.offsets import iter_commits
from ..journal.records import KILL, SET, ZKILL, Update, record_decoder
from ..values import decode_value
from .message import Tx
from .sysremote import SYSTEM_REGIONS, Link, Publication, origin_user

MESSAGE_BYTES_DEFAULT = 1 << 20
ADVANCE_AFTER_SKIPPED_TXS = 1000  # see Route.advance_to
ADVANCE_AFTER_SKIPPED_BYTES = 1 << 20  # (a received message's apply is one large transaction to skip)
_UPDATE_OVERHEAD_BYTES = 24  # op, array headers and offsets of an update in a message (an estimate)


@dataclass
class Route:
    """One link's view of the scan: where it starts and what it takes."""

    link: Link
    after: int
    regions: frozenset[str]
    field: str | None
    value: str | None
    txs: list[Tx] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each transaction's estimated bytes in a message
    scanned: int = 0  # the offset of the last transaction scanned for it
    skipped: int = 0  # transactions scanned after the last one it takes
    skipped_bytes: int = 0  # and their bytes

    @classmethod
    def of(cls, link: Link, pub: Publication, after: int) -> "Route":
        return cls(link, after, frozenset(pub.regions), pub.subscribe_by, link.value, scanned=after)

    @property
    def advance_to(self) -> int:
        """Where the last message may end past the last transaction taken: the end of the scan once
        many transactions were skipped (so a later scan does not read them again), else nowhere. Not
        after every skipped one: the agent's own state commits would make a message each poll."""
        far = self.skipped >= ADVANCE_AFTER_SKIPPED_TXS or self.skipped_bytes >= ADVANCE_AFTER_SKIPPED_BYTES
        return self.scanned if far else 0


def field_matches(vb: bytes | None, fname: str, value: str) -> bool:
    """Does the encoded row ``vb`` hold ``value`` in its field ``fname`` (compared as text)?"""
    if vb is None:
        return False
    v = decode_value(vb)
    return isinstance(v, dict) and fname in v and str(v[fname]) == value


def select(route: Route, updates: list[Update], *, from_it: bool = False) -> list[Update]:
    """The updates of one transaction that go to ``route``'s subscriber. ``from_it``: the transaction
    came from that subscriber, which has its changes already: only the deletes of rows its change
    moved out of its subscription go back."""
    out = []
    regions, fname = route.regions, route.field
    for u in updates:
        if u.region not in regions:
            continue
        if fname is None or route.value is None:
            if not from_it:
                out.append(u)
            continue
        now = field_matches(u.value, fname, route.value) if u.op == SET else False
        was = field_matches(u.before, fname, route.value)
        if u.op == KILL and not was and u.killed:
            was = any(field_matches(vb, fname, route.value) for _, vb in u.killed)
        if now:
            if not from_it:
                out.append(u)
        elif was:  # gone from this subscriber's rows: deleted there
            out.append(u if u.op != SET else Update(ZKILL, u.region, u.key, None, u.before))
    return out


def scan(journal_dir: Path, route: Route, max_txs: int = 0) -> None:
    """Fill ``route.txs`` with the transactions after ``route.after`` that it takes, scanning at most
    ``max_txs`` transactions (0: to the end; the next poll goes on from where the messages end)."""
    n = 0
    for offset, seqno, payload in iter_commits(journal_dir, route.after):
        rec = record_decoder.decode(payload)
        ups = rec.updates
        data = [u for u in ups if u.region not in SYSTEM_REGIONS]
        origin = origin_user(ups) if len(data) != len(ups) else None
        route.scanned = offset
        sel = select(route, data, from_it=route.link.user == origin) if data else None
        if sel:
            route.txs.append(Tx(offset, seqno, sel))
            route.sizes.append(len(payload) if len(sel) == len(ups) else sum(update_bytes(u) for u in sel))
            route.skipped = route.skipped_bytes = 0
        else:
            route.skipped += 1
            route.skipped_bytes += len(payload)
        n += 1
        if max_txs and n >= max_txs:
            return


def update_bytes(u: Update) -> int:
    return (_UPDATE_OVERHEAD_BYTES + len(u.region) + 8 * len(u.key) + len(u.value or b"") + len(u.before or b"")
            + (sum(len(v) + 8 * len(k) for k, v in u.killed) if u.killed else 0))


@dataclass
class Draft:
    """One message to be: its offsets and transactions (the agent adds the link's header fields)."""

    prev: int
    last: int
    txs: list[Tx]
    seq: int = 0
    parts: int = 1


def cut(after: int, txs: list[Tx], message_bytes: int, scanned_to: int = 0, sizes: list[int] | None = None
        ) -> Iterator[Draft]:
    """The messages that carry ``txs`` (in offset order, all after ``after``), each under
    ``message_bytes`` (estimated) unless it is a part of one transaction cut into several. The last
    message ends at ``scanned_to`` when that is further (transactions the link does not take still
    move its ``log_sent``), so an empty route yields one message that only moves the offsets."""
    prev, batch, size = after, [], 0
    for k, tx in enumerate(txs):
        tb = sizes[k] if sizes is not None else sum(update_bytes(u) for u in tx.updates)
        if batch and size + tb > message_bytes:
            yield Draft(prev, batch[-1].offset, batch)
            prev, batch, size = batch[-1].offset, [], 0
        if tb > message_bytes and len(tx.updates) > 1:
            yield from _parts(prev, tx, message_bytes)
            prev = tx.offset
            continue
        batch.append(tx)
        size += tb
    end = max(scanned_to, batch[-1].offset if batch else prev)
    if batch or end > prev:
        yield Draft(prev, end, batch)


def _parts(prev: int, tx: Tx, message_bytes: int) -> Iterator[Draft]:
    chunks, cur, size = [], [], 0
    for u in tx.updates:
        ub = update_bytes(u)
        if cur and size + ub > message_bytes:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(u)
        size += ub
    chunks.append(cur)
    for i, ch in enumerate(chunks):
        yield Draft(prev, tx.offset, [Tx(tx.offset, tx.seqno, ch)], seq=i, parts=len(chunks))
