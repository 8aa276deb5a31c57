"""History records compared: where two instances last agreed, and whether they may connect.

GT.M's rule: going back through both instances' history, find the most recent seqno that both
generated from the same originating instance. Here a history record is identified by its ``uid``
(given when an instance starts originating a range, and carried unchanged to every instance that
receives the range), so "the same root primary" means "the same record": this also tells apart two
ranges that one primary originated before and after an online rollback.

Replication kinds, decided from the two Hellos:

- **BC**: both alike (both BC, or both supplementary): same LMS group; seqnos are shared.
- **SI**: a BC source feeding a supplementary receiver: the receiver compares and positions
  itself in the source's seqno space through the stream it gives the source's LMS group
  (``si_stream_for``): its Hello carries that stream's last ``stream_seqno`` and history, and it
  applies what it receives under its own seqnos. Over its life a supplementary instance may receive
  from up to 15 groups (streams 1..15, one at a time); a stream stays tied to its group, and stream 0
  is the instance's own transactions.
- A supplementary source never feeds a BC instance.

Pure functions: no I/O, used by both Source and Receiver Servers and by rollback.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..instance.instance_file import HistoryRecord, InstanceFile, StreamInfo
from ..protocol.messages import CAPABILITIES, PROTOCOL_VERSION, HistoryEntry, Hello, RefusalCode, StreamEntry

SI_STREAM = 1  # the stream a supplementary instance gives the first BC group it receives from
MAX_SI_STREAM = 15  # streams 1..15 carry what BC groups originate; stream 0 is the instance's own


def to_entries(history: list[HistoryRecord]) -> list[HistoryEntry]:
    return [HistoryEntry(h.start_seqno, h.root_primary, h.uid, h.role, h.stream, h.stream_start) for h in history]


def to_records(entries: list[HistoryEntry], upstream: str) -> list[HistoryRecord]:
    return [HistoryRecord(start_seqno=e.start_seqno, root_primary=e.root_primary, role="replicating",
                          upstream=upstream, stream=e.stream, stream_start=e.stream_start, uid=e.uid)
            for e in entries]


def stream_entries(info: InstanceFile) -> list[StreamEntry]:
    return [StreamEntry(s.stream, s.source_group, to_entries(s.history)) for s in info.streams.values()]


def streams_from(entries: list[StreamEntry], upstream: str, positions: dict[int, int]) -> dict[int, StreamInfo]:
    """A supplementary standby's streams, from its supplementary source's Start (all of them); the
    root primary of each is the one of its newest history record."""
    return {e.stream: StreamInfo(stream=e.stream, source_group=e.source_group,
                                 root_primary=e.history[-1].root_primary if e.history else "",
                                 last_stream_seqno=positions.get(e.stream, 0),
                                 history=to_records(e.history, upstream)) for e in entries}


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
                 role=info.role, seqno=seqno, history=to_entries(info.history), flags={**CAPABILITIES, **flags})


def si_stream_for(info: InstanceFile, group: str) -> int | Refusal:
    """The SI stream a supplementary instance receives LMS group ``group``'s transactions on: the one
    already recorded for that group, else the lowest free number in 1..MAX_SI_STREAM (the first group
    gets stream 1). A 16th group is refused: a stream is never reused for another group, since its
    seqnos and history are that group's."""
    for n, st in sorted(info.streams.items()):
        if st.source_group == group:
            return n
    free = [n for n in range(1, MAX_SI_STREAM + 1) if n not in info.streams]
    if free:
        return free[0]
    groups = ", ".join(f"{n}: {st.source_group}" for n, st in sorted(info.streams.items()))
    return Refusal(RefusalCode.NO_FREE_STREAM,
                   f"{info.name} already receives {MAX_SI_STREAM} SI streams (groups {groups}); a stream stays "
                   f"tied to its group, so group {group!r} cannot get one: feed {info.name} from one of these "
                   f"groups, or load {group!r}'s data into another supplementary instance")


def si_hello_for(info: InstanceFile, stream_seqno: int, *, stream: int) -> Hello:
    """A supplementary receiver's Hello to a BC source: its position in the source's seqno space
    (``stream``'s last stream seqno and history)."""
    st = info.streams.get(stream)
    hist = to_entries(st.history) if st else []
    return Hello(version=PROTOCOL_VERSION, name=info.name, group=info.group, supplementary=True, role=info.role,
                 seqno=stream_seqno, history=hist, flags={**CAPABILITIES, "si": True})


def is_si(source_supplementary: bool, receiver_supplementary: bool) -> bool:
    return receiver_supplementary and not source_supplementary


@dataclass(frozen=True)
class Refusal:
    code: RefusalCode
    message: str
    common_seqno: int = -1


def check_secondary_name(peer: Hello, secondary: str, *, source: str, address: str) -> Refusal | None:
    """A Source Server started for ``secondary`` must be answered by that instance: another name at
    ``address`` is a wrong address or a wrong ``--secondary``, and streaming to it would file that
    instance's position under the configured name (and feed an instance nobody meant to)."""
    if peer.name == secondary:
        return None
    return Refusal(RefusalCode.WRONG_NAME,
                   f"source {source} was started for secondary {secondary!r}, but the receiver at {address} is "
                   f"instance {peer.name!r}; nothing was sent. If {peer.name} is the secondary meant, start the "
                   f"source with --secondary {peer.name} (multisite source stop DIR --secondary {secondary}, then "
                   f"multisite source start DIR --secondary {peer.name} --connect {address}); otherwise point "
                   f"--connect at {secondary}'s receiver (multisite source activate DIR --secondary {secondary} "
                   f"--connect HOST:PORT)")


def check_pair(source: Hello, receiver: Hello, *, si_source_group: str | None = None) -> Refusal | None:
    """The group and identity rules for a source/receiver pair, and the history check.

    ``si_source_group``: the group a supplementary receiver already takes its SI stream from.
    In SI mode ``receiver`` must be the receiver's SI Hello (stream position and history)."""
    if source.name == receiver.name:
        return Refusal(RefusalCode.SAME_NAME, f"peer instance is named {source.name!r} like this one; every "
                                              f"instance needs its own name")
    if source.supplementary and not receiver.supplementary:
        return Refusal(RefusalCode.SUPPLEMENTARY_MISMATCH, f"{source.name} is a supplementary instance and "
                       f"{receiver.name} a BC instance: a supplementary instance never feeds a BC instance")
    if is_si(source.supplementary, receiver.supplementary):
        if si_source_group and si_source_group != source.group:
            return Refusal(RefusalCode.GROUP_MISMATCH, f"{receiver.name} receives its SI stream from LMS group "
                           f"{si_source_group!r}; {source.name} is in group {source.group!r}, and an instance "
                           f"never joins a second group")
    elif source.group != receiver.group:
        return Refusal(RefusalCode.GROUP_MISMATCH, f"{source.name} belongs to LMS group {source.group!r} and "
                                                   f"{receiver.name} to {receiver.group!r}; BC replication stays "
                                                   f"within a group")
    common = common_point(source.history, source.seqno, receiver.history, receiver.seqno)
    if receiver.seqno > common:
        return Refusal(RefusalCode.ROLLBACK_NEEDED,
                       f"{receiver.name} is at seqno {receiver.seqno} but shares history with {source.name} only up "
                       f"to seqno {common}; roll {receiver.name} back first (multisite rollback DIR --fetchresync "
                       f"HOST:PORT) or start its receiver with --autorollback", common)
    return None


def check_peer(me: Hello, peer: Hello, *, i_am: str, si_source_group: str | None = None) -> Refusal | None:
    source, receiver = (me, peer) if i_am == "source" else (peer, me)
    return check_pair(source, receiver, si_source_group=si_source_group)
