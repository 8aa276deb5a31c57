"""History records compared: where two instances last agreed, and whether they may connect.

GT.M's rule: going back through both instances' history, find the most recent seqno that both
generated from the same originating instance. Here a history record is identified by its ``uid``
(given when an instance starts originating a range, and carried unchanged to every instance that
receives the range), so "the same root primary" means "the same record": this also tells apart two
ranges that one primary originated before and after an online rollback.

Pure functions: no I/O, used by both Source and Receiver Servers and by rollback.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..instance.instance_file import HistoryRecord, InstanceFile
from ..protocol.messages import PROTOCOL_VERSION, HistoryEntry, Hello


def to_entries(history: list[HistoryRecord]) -> list[HistoryEntry]:
    return [HistoryEntry(h.start_seqno, h.root_primary, h.uid, h.role, h.stream, h.stream_start) for h in history]


def to_records(entries: list[HistoryEntry], upstream: str) -> list[HistoryRecord]:
    return [HistoryRecord(start_seqno=e.start_seqno, root_primary=e.root_primary, role="replicating",
                          upstream=upstream, stream=e.stream, stream_start=e.stream_start, uid=e.uid)
            for e in entries]


def common_point(a: list[HistoryEntry], a_seqno: int, b: list[HistoryEntry], b_seqno: int) -> int:
    """The highest seqno up to which ``a`` and ``b`` hold the same transactions."""
    common = 0
    for i in range(min(len(a), len(b))):
        x, y = a[i], b[i]
        if (x.uid, x.start_seqno) != (y.uid, y.start_seqno):
            break
        end_a = a[i + 1].start_seqno - 1 if i + 1 < len(a) else a_seqno
        end_b = b[i + 1].start_seqno - 1 if i + 1 < len(b) else b_seqno
        common = max(common, min(end_a, end_b, a_seqno, b_seqno))
        if end_a != end_b:
            break
    return min(common, a_seqno, b_seqno)


def hello_for(info: InstanceFile, seqno: int, **flags: object) -> Hello:
    return Hello(version=PROTOCOL_VERSION, name=info.name, group=info.group, supplementary=info.supplementary,
                 role=info.role, seqno=seqno, history=to_entries(info.history), flags=dict(flags))


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    common_seqno: int = -1


def check_peer(me: Hello, peer: Hello, *, i_am: str) -> Refusal | None:
    """Group and identity rules both sides apply to the other's Hello (BC replication)."""
    if peer.name == me.name:
        return Refusal("SAME_NAME", f"peer instance is named {peer.name!r} like this one; every instance in an "
                                    f"LMS group needs its own name")
    if peer.group != me.group:
        return Refusal("GROUP_MISMATCH", f"{peer.name} belongs to LMS group {peer.group!r} and {me.name} to "
                                         f"{me.group!r}; instances replicate only within their group")
    if peer.supplementary != me.supplementary:
        return Refusal("SUPPLEMENTARY_MISMATCH",
                       f"{peer.name} is {'' if peer.supplementary else 'not '}supplementary and {me.name} is "
                       f"{'' if me.supplementary else 'not '}; BC replication needs both alike")
    source, receiver = (me, peer) if i_am == "source" else (peer, me)
    common = common_point(source.history, source.seqno, receiver.history, receiver.seqno)
    if receiver.seqno > common:
        return Refusal("ROLLBACK_NEEDED",
                       f"{receiver.name} is at seqno {receiver.seqno} but shares history with {source.name} only up "
                       f"to seqno {common}; roll {receiver.name} back first (multisite rollback DIR --fetchresync "
                       f"HOST:PORT) or start its receiver with --autorollback", common)
    return None
