"""Session policy of the Receiver and Source Servers, sans-IO.

The asyncio servers in ``net/`` do the I/O: sockets, executor calls into the instance, the clock,
logging. Every decision a replication session takes is here instead, in plain objects fed with
values (this instance's position, the peer's messages, the time as a number), so that a unit test
checks each outcome without sockets or sleeps (habit 6 in STYLE.md: the clock is injected).

- ``busy``: the refusal of a second source.
- ``ReceiverHandshake``: what a Receiver Server answers a source's Hello: accept (with the Hello that
  fixes the restart point), refuse, roll back to the common point first (``--autorollback``), or
  continue its SI stream from there (``--noresync``); a supplementary receiver first chooses the SI
  stream of the source's group (``history.si_stream_for``); then whether the source's Start fits,
  and the history the receiver takes over from it (``adopted_history``).
- ``FlowControl``: when the receiver sends XOFF, and when XON.
- ``InlineApply``: whether the receiver applies what it just received on its own loop or wakes the
  Update Process's thread.
- ``SourceBackoff``: how long a Source Server waits before it connects again.
- ``HeartbeatWatch``: when a source gives a silent receiver up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from ..errors import ProtocolError
from ..instance.instance_file import HistoryRecord, InstanceFile, StreamInfo
from ..protocol.messages import Hello, RefusalCode, Start
from .history import (Refusal, check_peer, hello_for, is_si, si_hello_for, si_stream_for, streams_from,
                      to_records)

CONNECT_BACKOFF_MIN_S = 0.05  # first pause after a failed connect; doubled up to connect_backoff_max_s
REFUSED_BACKOFF_MIN_S = 1.0  # a refusal (or a bug) repeats at once: never retry it faster than this


# -- receiver: the handshake -------------------------------------------------------------------------

@dataclass(frozen=True)
class Position:
    """Where this instance stands when it answers a source: its instance file, its seqno, and its
    last stream seqno per SI stream (a stream missing is at 0)."""

    info: InstanceFile
    seqno: int
    stream_seqnos: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Accept:
    """Send ``hello``: the stream restarts at ``hello.seqno + 1`` (in the source's seqnos)."""

    hello: Hello


@dataclass(frozen=True)
class RollBack:
    """``--autorollback``: roll back to ``common_seqno`` (in SI, a seqno of ``stream``, the source's
    numbering; in BC, ``stream`` is None and seqnos are shared), then ask again."""

    common_seqno: int
    stream: int | None
    why: str  # the ROLLBACK_NEEDED message that called for it

    @property
    def si(self) -> bool:
        return self.stream is not None


@dataclass(frozen=True)
class ContinueStream:
    """SI ``--noresync``: keep this instance's transactions and set ``stream``'s seqno to ``seqno``,
    then ask again."""

    stream: int
    seqno: int
    why: str


Answer = Accept | Refusal | RollBack | ContinueStream


def busy(active_peer: str | None) -> Refusal:
    """The refusal for a second source while one is served (the same source reconnecting replaces its
    old connection instead: the receiver's server decides that, since it owns the connections)."""
    return Refusal(RefusalCode.BUSY, f"receiver already has a source ({active_peer})")


class ReceiverHandshake:
    """One source's handshake, as the receiver decides it.

    ``answer(position)`` gives an ``Accept`` or a ``Refusal``, or first a remedy (``RollBack`` or
    ``ContinueStream``) for a ROLLBACK_NEEDED when the configuration allows one. The caller applies
    the remedy and calls ``answer`` again with the new position; a remedy is offered once, so a second
    ROLLBACK_NEEDED is a refusal and not a loop. After an ``Accept``, ``check_start`` checks the source's
    Start against the Hello sent."""

    def __init__(self, peer: Hello, *, supplementary: bool, autorollback: bool = False, noresync: bool = False):
        self.peer = peer
        self.si = is_si(peer.supplementary, supplementary)  # a BC source feeding this supplementary instance
        self.autorollback, self.noresync = autorollback, noresync
        self.hello: Hello | None = None  # what this instance sent, once accepted
        self.stream: int | None = None  # SI: the stream this source's group feeds (chosen by ``answer``)
        self._remedied = False

    def position_hello(self, pos: Position) -> tuple[Hello | None, Refusal | None]:
        """This instance's Hello for the peer (in SI mode: the position and history of the stream of
        the peer's group) and the refusal that calls for, if any (no Hello when this supplementary
        instance has no stream left for the peer's group)."""
        info = pos.info
        if self.si:
            stream = si_stream_for(info, self.peer.group)
            if isinstance(stream, Refusal):
                return None, stream
            self.stream = stream
            me = si_hello_for(info, pos.stream_seqnos.get(stream, 0), stream=stream)
            group = info.streams[stream].source_group if stream in info.streams else None
        else:
            me, group = hello_for(info, pos.seqno), None
        return me, check_peer(me, self.peer, i_am="receiver", si_source_group=group)

    def answer(self, pos: Position) -> Answer:
        wanted = self.peer.flags.get("secondary")  # whom the source was started for (older sources: none)
        if isinstance(wanted, str) and wanted != pos.info.name != self.peer.name:  # (a twin: SAME_NAME below)
            # Before anything else: a misaddressed source must not make this instance roll back.
            return Refusal(RefusalCode.WRONG_NAME,
                           f"source {self.peer.name} was started for secondary {wanted!r}, but this is instance "
                           f"{pos.info.name!r}: refused before any rollback or change here; start the source with "
                           f"--secondary {pos.info.name}, or point it at {wanted}'s receiver")
        me, refusal = self.position_hello(pos)
        if refusal is None:
            self.hello = me
            return Accept(me)
        if refusal.code is RefusalCode.ROLLBACK_NEEDED and not self._remedied:
            # noresync first: an SI receiver that asked to keep its own transactions keeps them even
            # if autorollback is set too.
            if self.si and self.noresync:
                self._remedied = True
                return ContinueStream(self.stream, refusal.common_seqno, refusal.message)
            if self.autorollback:
                self._remedied = True
                return RollBack(refusal.common_seqno, self.stream, refusal.message)
        return refusal

    def check_start(self, start: Start) -> None:
        """The source must start right after the seqno this instance sent: anything else would skip or
        repeat transactions."""
        if self.hello is None:
            raise ProtocolError("a Start before this instance accepted the source")
        if start.from_seqno != self.hello.seqno + 1:
            raise ProtocolError(f"source wants to start at seqno {start.from_seqno}, this instance needs "
                                f"{self.hello.seqno + 1}")


@dataclass(frozen=True)
class Adoption:
    """The history a receiver takes over from its source (``apply`` it inside ``update_info``):
    BC: its history and all its SI streams; SI: the history of the one stream it receives (``streams``
    holds only that one; the others stay as they are)."""

    si: bool
    upstream: str
    history: list[HistoryRecord]
    streams: dict[int, StreamInfo]

    def apply(self, info: InstanceFile) -> None:
        if self.si:
            info.streams.update(self.streams)
        else:
            info.history = self.history
            info.streams = self.streams
        info.receiving_from = self.upstream


def _ids(history: list[HistoryRecord]) -> list[tuple[int, int]]:
    return [(h.uid, h.start_seqno) for h in history]


def _stream_ids(streams: dict[int, StreamInfo]) -> list:
    """What identifies the SI streams an instance holds: numbers, groups and history records."""
    return [(n, s.source_group, _ids(s.history)) for n, s in sorted(streams.items())]


def adopted_history(info: InstanceFile, peer: Hello, start: Start, si_stream: int | None,
                    stream_seqnos: Mapping[int, int]) -> Adoption | None:
    """What this instance records after ``start``, or None if it holds that already.

    It now holds (a prefix of) the source's history: that becomes its own, or in SI mode (``si_stream``
    the stream the handshake chose for the source's group) the history of that stream, so that it can
    feed a further secondary with the same record identities.
    ``stream_seqnos``: this instance's last stream seqno per stream (missing means 0)."""
    new = to_records(start.history, upstream=peer.name)
    si = si_stream is not None
    if si:
        cur = info.streams.get(si_stream)
        if cur is not None and cur.source_group == peer.group and _ids(cur.history) == _ids(new):
            return None
        streams = {si_stream: StreamInfo(stream=si_stream, source_group=peer.group, root_primary=peer.name,
                                         last_stream_seqno=stream_seqnos.get(si_stream, 0), history=new)}
    else:
        streams = streams_from(start.streams, peer.name, stream_seqnos)
        if _ids(info.history) == _ids(new) and _stream_ids(info.streams) == _stream_ids(streams):
            return None
    return Adoption(si, peer.name, new, streams)


# -- receiver: flow control ----------------------------------------------------------------------------

class FlowControl:
    """XOFF once when a batch leaves the receive pool above its high-water mark; XON once the Update
    Process has drained it below ``low_bytes`` (and only to a source still connected: a new session
    starts with ``reset``)."""

    def __init__(self, low_bytes: int):
        self.low_bytes = low_bytes
        self.xoff_sent = False

    def reset(self) -> None:
        self.xoff_sent = False

    def xoff(self, above_high: bool) -> bool:
        """After a batch went into the pool: True means send XOFF now."""
        if above_high and not self.xoff_sent:
            self.xoff_sent = True
            return True
        return False

    def xon(self, pool_bytes: int, connected: bool) -> bool:
        """After the Update Process took from the pool: True means send XON now."""
        if self.xoff_sent and connected and pool_bytes < self.low_bytes:
            self.xoff_sent = False
            return True
        return False


class ConfirmPacer:
    """When to confirm applied batches to the source (an unsolicited heartbeat answer): at once if
    the last confirmation went out at least ``interval_s`` ago, else ``interval_s`` after it, one
    answer for everything applied meanwhile. At streaming rates (a batch every few milliseconds)
    each apply is confirmed at once without a timer and a second wakeup of the event loop; a burst of
    applies still costs one answer per ``interval_s``. The caller gives the time (seconds of a
    monotonic clock)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.last_sent = float("-inf")
        self.pending = False  # a confirmation is due (sent now or scheduled) and not yet sent

    def due(self, now: float) -> float | None:
        """After an apply: the delay before confirming (0.0: now), or None if one is already due."""
        if self.pending:
            return None
        self.pending = True
        return max(0.0, self.last_sent + self.interval_s - now)

    def sent(self, now: float) -> None:
        self.pending = False
        self.last_sent = now


# -- receiver: where a streamed batch is applied -------------------------------------------------------

# The receiver applies what one read brought on its own event loop (no hand-off to the Update Process's
# thread and back: two thread wake-ups per batch, a quarter of a streamed batch's CPU on the secondary,
# issue 27) only while recent applies, their fdatasync included, took at most this long: the loop also
# answers heartbeats, the control socket and this instance's own Source Servers, and is blocked meanwhile.
INLINE_APPLY_MAX_S = 0.005
# ... and only for this many transactions waiting: a streamed read holds a few; a catch-up read (up to
# 1 MiB, thousands) is the Update Process's, which applies it while the loop reads the next.
INLINE_APPLY_MAX_FRAMES = 256
APPLY_EWMA_WEIGHT = 0.2  # weight of the newest apply in the running estimate of their duration


class InlineApply:
    """Whether the batches waiting in the receive pool are applied on the receiver's loop (``ok``) or
    handed to the Update Process's thread: on the loop only while the Update Process is running and
    healthy (a batch it failed on stays its to retry or report), at most ``max_frames`` wait, and the
    running estimate of an apply's duration (``took``, from either place; unknown until the first) is
    at most ``max_s``. The caller gives the durations (seconds)."""

    def __init__(self, max_s: float = INLINE_APPLY_MAX_S, max_frames: int = INLINE_APPLY_MAX_FRAMES,
                 weight: float = APPLY_EWMA_WEIGHT):
        self.max_s, self.max_frames, self.weight = max_s, max_frames, weight
        self.ewma_s: float | None = None

    def ok(self, waiting_frames: int, update_ready: bool) -> bool:
        ewma = self.ewma_s
        return (update_ready and 0 < waiting_frames <= self.max_frames and ewma is not None
                and ewma <= self.max_s)

    def took(self, seconds: float) -> None:
        """An apply (journal write, store, fdatasync) took ``seconds``."""
        ewma = self.ewma_s
        self.ewma_s = seconds if ewma is None else ewma + self.weight * (seconds - ewma)


def idle_for(now: float, last_byte_at: float, timeout_s: float) -> bool:
    """Nothing from the source for ``timeout_s`` (the source or the network is gone)."""
    return now - last_byte_at >= timeout_s


# -- source: reconnecting and heartbeats ---------------------------------------------------------------

class SessionEnd(Enum):
    """How a Source Server's session ended, as far as the reconnect pause cares."""

    CLEAN = "clean"  # returned without an error
    LOST = "lost"  # the network, the peer or a deactivate: retry soon
    REFUSED = "refused"  # an Error from the receiver or a refusal here: it would repeat at once
    FAILED = "failed"  # an unexpected error (a bug) in the session: likewise


class SourceBackoff:
    """The pause before a Source Server connects again.

    It starts at ``min_s`` and doubles after every pause up to ``max_s``; after a refusal or an
    internal error it is at least ``REFUSED_BACKOFF_MIN_S``. A session that streamed for ``max_s`` or
    longer ends the run of failures: the next connect comes after ``min_s``, not after the longest
    pause earlier failures (in this server's life) built up. A session ends by an error almost
    always (a cut, a timeout, a deactivate), so a clean end alone would never reset it.

    The caller gives the time (``now``, in seconds of a monotonic clock)."""

    def __init__(self, max_s: float, min_s: float = CONNECT_BACKOFF_MIN_S):
        self.min_s, self.max_s = min_s, max_s
        self.pause_s = min_s
        self.streaming_since: float | None = None  # when the current session began streaming

    def connecting(self) -> None:
        self.streaming_since = None

    def streaming(self, now: float) -> None:
        self.streaming_since = now

    def ended(self, how: SessionEnd, now: float) -> None:
        if how is SessionEnd.CLEAN:
            self.pause_s = self.min_s
        elif how in (SessionEnd.REFUSED, SessionEnd.FAILED):
            self.pause_s = max(self.pause_s, REFUSED_BACKOFF_MIN_S)
        if self.streaming_since is not None and now - self.streaming_since >= self.max_s:
            self.pause_s = self.min_s

    def next_pause(self) -> float:
        """The pause to wait now (the next one will be twice as long, up to ``max_s``)."""
        pause = self.pause_s
        self.pause_s = min(pause * 2, self.max_s)
        return pause


class StreamCheck:
    """What a secondary's heartbeat answers say about the stream: the bytes of one connection arrive in
    order, so the answer to a heartbeat written after the batch ending at seqno S reports a received
    seqno of at least S. Less means a batch vanished between the two (a middlebox that drops data
    without breaking TCP); with no later batch to show a gap, the secondary would wait on it for ever
    while every heartbeat is answered. The source then ends the connection and starts again from what
    the secondary has."""

    MAX_PENDING = 64  # heartbeats awaiting their answer; older ones are forgotten

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}  # heartbeat seq -> the last seqno written before it

    def sent(self, seq: int, last_written_seqno: int) -> None:
        """Heartbeat ``seq`` is written after every batch up to ``last_written_seqno``."""
        self._sent[seq] = last_written_seqno
        if len(self._sent) > self.MAX_PENDING:
            del self._sent[min(self._sent)]

    def answered(self, seq: int, received_seqno: int) -> str | None:
        """The answer to heartbeat ``seq``: None, or why the stream lost data."""
        expect = self._sent.pop(seq, None)
        for old in [s for s in self._sent if s < seq]:  # answered in order: those were lost with their answer
            del self._sent[old]
        if expect is None or received_seqno >= expect:
            return None
        return (f"the secondary received up to seqno {received_seqno} when it answered heartbeat {seq}, written "
                f"after the batch ending at seqno {expect}: batches were lost on the way")


class HeartbeatWatch:
    """A receiver that has answered nothing (no heartbeat answer, no "bytes arriving" answer) for
    longer than ``timeout_s`` is lost: TCP alone may wait many minutes on a stalled network."""

    def __init__(self, timeout_s: float, now: float):
        self.timeout_s = timeout_s
        self.last_answer = now

    def answered(self, now: float) -> None:
        self.last_answer = now

    def silent_s(self, now: float) -> float:
        return now - self.last_answer

    def lost(self, now: float) -> bool:
        return self.silent_s(now) > self.timeout_s
