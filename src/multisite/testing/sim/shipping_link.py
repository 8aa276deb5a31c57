"""One replication link (a Source Server on ``src`` feeding the Receiver Server of ``dst``) over a
simulated TCP connection, driving the real sans-IO pieces.

Both ends are ``protocol.connection.Connection`` objects exchanging real bytes (frames, msgpack,
zstd when the seed asks for compression); the handshake is the Receiver's ``ReceiverHandshake`` with
``--autorollback`` and the Source's ``check_peer`` / ``common_point``; the history a receiver takes
over is ``adopted_history``; the source gives a silent receiver up by ``HeartbeatWatch``. What the
Source and Receiver Servers do around them (``replication/server/``) is mirrored here, step for
step: a rollback or an adopted history ends the sessions of the instance's own sources (the
server's ``kick_sources``), a source streams only hardened frames, a receiver journals and fsyncs a
batch before it confirms it.

The connection is a byte stream: in order, never duplicated; a step delivers any part of what is in
flight (frames split anywhere), a cut ends both sides, a partition holds the bytes back.
"""

from __future__ import annotations

import errno

from ...errors import ProtocolError
from ...protocol.connection import NEED_DATA, Connection, Role, State
from ...protocol.messages import (
    Error,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Start,
    TxnBatch,
    Xoff,
    Xon,
)
from ...replication.history import (
    check_peer,
    check_secondary_name,
    common_point,
    stream_entries,
)
from ...replication.session import (
    Accept,
    HeartbeatWatch,
    Position,
    ReceiverHandshake,
    RollBack,
    adopted_history,
)
from .core import Violation
from .shipping_node import Node, NodeCrashed

HEARTBEAT_TIMEOUT_S = 2.0


class Link:
    def __init__(self, world, src: Node, dst: Node):
        self.world, self.src, self.dst = world, src, dst
        self.s: Connection | None = None
        self.r: Connection | None = None
        self.to_dst = bytearray()
        self.to_src = bytearray()
        self.closed_at_src = self.closed_at_dst = False

    # -- life ----------------------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.s is not None

    def _src_now(self) -> float:
        """The source's clock (each instance's clock is skewed and drifts: ``core.Clock``)."""
        return self.src.clock.read(self.world.now)

    def _dst_now(self) -> float:
        return self.dst.clock.read(self.world.now)

    def blocked(self) -> bool:
        iso = self.world.isolated
        return self.src.name in iso or self.dst.name in iso

    def connect(self) -> None:
        if self.open or not (self.src.up and self.dst.up) or self.blocked():
            return
        self.s = Connection(Role.SOURCE, compress_level=self.world.compress_level)
        self.r = Connection(Role.RECEIVER)
        self.to_dst.clear(), self.to_src.clear()
        self.me = self.src.hello(secondary=self.dst.name)
        self.to_dst += self.s.send(self.me)
        self.hs: ReceiverHandshake | None = None
        self.streaming = False
        self.next_seqno = 0
        self.xoff = False
        self.watch = HeartbeatWatch(HEARTBEAT_TIMEOUT_S, self._src_now())
        self.r_last_byte = self._dst_now()
        self.hb_seq = 0
        self.world.stats.note("connects")

    def close(self) -> None:
        self.s = self.r = None
        self.to_dst.clear(), self.to_src.clear()

    # -- the network ---------------------------------------------------------------------------------
    def deliver(self, to_dst: bool, permille: int) -> None:
        """Move part of the bytes in flight one way (at least one byte, at most all)."""
        if not self.open or self.blocked():
            return
        buf = self.to_dst if to_dst else self.to_src
        if not buf:
            return
        n = max(1, len(buf) * permille // 1000)
        data = bytes(buf[:n])
        del buf[:n]
        if to_dst:
            self.r_last_byte = self._dst_now()
            self.r.receive_data(data)
            self._events(self.r, self._at_receiver)
        else:
            self.watch.answered(self._src_now())
            self.s.receive_data(data)
            self._events(self.s, self._at_source)

    def _events(self, conn: Connection, handle) -> None:
        """Take every whole message out of ``conn`` and handle it, while the link stays open (a handler
        may close it: a refusal, a crash)."""
        while self.open and conn in (self.r, self.s):
            try:
                ev = conn.next_event()
            except ProtocolError as e:
                raise Violation("protocol-never-fails", f"{self.src.name}->{self.dst.name}: {e}") from None
            if ev is NEED_DATA:
                return
            if ev is State.CLOSED:
                self.close()
                return
            handle(ev)

    def _send_src(self, msg) -> None:
        self.to_dst += self.s.send(msg)

    def _send_dst(self, msg) -> None:
        self.to_src += self.r.send(msg)

    # -- the source's side ---------------------------------------------------------------------------
    def _at_source(self, ev) -> None:
        if isinstance(ev, Error):
            self.world.stats.note(f"refused:{ev.code}")
            self.close()
        elif isinstance(ev, Hello):
            refusal = (check_secondary_name(ev, self.dst.name, source=self.src.name, address="sim")
                       or check_peer(self.me, ev, i_am="source"))
            if refusal is not None:
                self.world.stats.note(f"source-refused:{refusal.code}")
                self._send_src(Error(refusal.code, refusal.message, refusal.common_seqno))
                self.close()
                return
            common = common_point(self.me.history, self.me.seqno, ev.history, ev.seqno)
            self.next_seqno = ev.seqno + 1
            self._send_src(Start(self.next_seqno, common, self.me.history, stream_entries(self.src.info)))
            self.streaming = True
        elif isinstance(ev, HeartbeatAck):
            self.watch.answered(self._src_now())
        elif isinstance(ev, Xoff):
            self.xoff = True
        elif isinstance(ev, Xon):
            self.xoff, self.next_seqno = False, ev.from_seqno

    def pump(self, max_txns: int) -> int:
        """Send the next frames the journal pool holds (up to ``max_txns``): hardened ones, or in group
        mode every one written (the pool takes a batch before its fdatasync); how many went."""
        if not (self.open and self.streaming and not self.xoff and self.src.up):
            return 0
        j = self.src.journal
        first = self.next_seqno
        ready = j.seqno if self.world.durability == "group" else j.durable_seqno  # what the journal pool holds
        last = min(ready, first + max_txns - 1)
        if last < first:
            return 0
        self._send_src(TxnBatch(first, last, b"".join(j.frames[first - 1:last])))
        self.next_seqno = last + 1
        return last - first + 1

    def heartbeat(self) -> None:
        if self.open and self.streaming:
            self.hb_seq += 1
            self._send_src(Heartbeat(self.hb_seq, self._src_now(), self.src.journal.durable_seqno))

    def timeouts(self) -> None:
        """The source gives a silent receiver up; the receiver a silent source."""
        if self.open and (self.watch.lost(self._src_now()) or self._dst_now() - self.r_last_byte > HEARTBEAT_TIMEOUT_S * 2):
            self.world.stats.note("timeouts")
            self.close()

    # -- the receiver's side -------------------------------------------------------------------------
    def _at_receiver(self, ev) -> None:
        dst, world = self.dst, self.world
        if isinstance(ev, Error):
            self.close()
        elif isinstance(ev, Hello):
            self._handshake(ev)
        elif isinstance(ev, Start):
            try:
                self.hs.check_start(ev)
            except ProtocolError as e:
                raise Violation("start-fits-hello", f"{self.src.name}->{dst.name}: {e}") from None
            adoption = adopted_history(dst.info, self.peer, ev, None, {})
            if adoption is not None:
                adoption.apply(dst.info)
                self._save(dst)
                world.kick_sources(dst)  # the server's kick_sources: its secondaries must learn the history
        elif isinstance(ev, TxnBatch):
            self._apply(ev)
        elif isinstance(ev, Heartbeat):
            s = dst.journal.seqno
            self._send_dst(HeartbeatAck(ev.seq, ev.sent_at, s, s))

    def _handshake(self, peer: Hello) -> None:
        dst, world = self.dst, self.world
        self.peer = peer
        self.hs = ReceiverHandshake(peer, supplementary=False, autorollback=True)
        answer = self.hs.answer(Position(dst.info, dst.journal.seqno))
        if isinstance(answer, RollBack):
            world.rollback(dst, answer.common_seqno)
            if not dst.up:
                return
            answer = self.hs.answer(Position(dst.info, dst.journal.seqno))
        if isinstance(answer, Accept):
            self._send_dst(answer.hello)
        else:
            world.stats.note(f"receiver-refused:{answer.code}")
            self._send_dst(Error(answer.code, answer.message, answer.common_seqno))
            self.close()

    def _apply(self, batch) -> None:
        dst, world = self.dst, self.world
        if batch.first_seqno != dst.journal.seqno + 1:
            raise Violation("batches-continue-the-journal", f"{dst.name} at seqno {dst.journal.seqno} got a "
                            f"batch from {batch.first_seqno} (from {self.src.name})")
        frames = [fr for _, fr in batch.run().frames()]
        ids = [world.frame_id(fr, dst, batch.first_seqno + i) for i, fr in enumerate(frames)]
        try:
            dst.receive(frames, ids)
        except NodeCrashed:
            world.crash(dst, 0)
            return
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            world.stats.note("enospc")
            self._send_dst(Error("REMOTE_PROTOCOL", "receive failed: no space"))
            self.close()
            return
        s = dst.journal.seqno
        self._send_dst(HeartbeatAck(0, 0.0, s, s))

    def _save(self, node: Node) -> None:
        try:
            node.save_info()
        except OSError:
            self.world.crash(node, 0)
