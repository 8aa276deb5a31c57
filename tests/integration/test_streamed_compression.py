"""Streamed compression between real instance servers: small batches shrink, damage means reconnect.

A's Source Server sends to B plain and to C with ``--compress 3``, each through a fault proxy that
counts the bytes. Transactions are committed one at a time (a batch each: the low-rate case that
compressing batch by batch did badly). A frame-aware relay (a thread of this test, real TCP) then
flips one byte inside a streamed batch: the receiver must refuse it, the link must reconnect by
itself, and the secondary must end identical to the primary (nothing wrong applied).
"""

from __future__ import annotations

import socket
import threading

from multisite.protocol.messages import FRAME_PREFIX, STREAM_LENGTH, STREAMED, TxnBatch
from multisite.testing.checks import assert_contiguous_journal, assert_same_data, log_text, wait_until
from multisite.testing.cluster import Node
from multisite.testing.faultproxy import ProxyProcess


def one_at_a_time(node: Node, n: int, start: int = 0) -> int:
    """``n`` single-update transactions, each committed (and so sent) on its own."""
    with node.client() as db:
        db.create_region("acct")
        seqno = 0
        for i in range(start, start + n):
            seqno = db.set("acct", ("k", i), {"n": i, "owner": f"user{i % 97}", "state": "open"})
        return seqno


def source(a: Node, b: Node) -> dict:
    return a.call("source.status", secondary=b.name)


def test_small_batches_streamed_send_far_fewer_bytes(cluster):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    b.start_receiver()
    c.start_receiver()
    with ProxyProcess("127.0.0.1", b.receiver_port) as plain, ProxyProcess("127.0.0.1", c.receiver_port) as zstd:
        a.start_source(b, port=plain.port)
        a.start_source(c, port=zstd.port, compress=3)
        wait_until(lambda: source(a, c)["state"] == "streaming", what="C's link")
        last = one_at_a_time(a, 400)
        cluster.wait_caught_up(a, b)
        cluster.wait_caught_up(a, c)
        st = source(a, c)
        assert st["compression"] == "streamed" and source(a, b)["compression"] == "none"
        assert st["sent_batches"] >= 100, st  # mostly a transaction or two per batch: the low-rate case
        plain_bytes = plain.stats()["upstream"]["bytes_forwarded"]
        zstd_bytes = zstd.stats()["upstream"]["bytes_forwarded"]
        # One transaction a batch is the worst case (each batch its own zstd frame sent nearly all of
        # it, ~1.0x); streamed, the frames' CRCs and times are most of what is left.
        assert zstd_bytes * 2 < plain_bytes, (zstd_bytes, plain_bytes)
    cluster.stop_all()
    for s in (b, c):
        assert_same_data(a.root, s.root)
        assert_contiguous_journal(s.root, last)


def _shut(*socks: socket.socket) -> None:
    """End both directions of a relayed connection (the other pump sees the end too)."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class CorruptingRelay:
    """Forwards source → receiver frame by frame, flipping one byte in the zstd bytes of the
    ``nth`` streamed TxnBatch it sees (once, on the first connection); receiver → source unchanged."""

    def __init__(self, target_port: int, nth: int):
        self.target_port, self.nth = target_port, nth
        self.seen = 0
        self.corrupted = False
        self.connections = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._srv.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target_port))
            self._socks += [down, up]
            self.connections += 1
            threading.Thread(target=self._upstream, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        _shut(src, dst)

    def _upstream(self, src: socket.socket, dst: socket.socket) -> None:
        buf = bytearray()
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= FRAME_PREFIX.size:
                    length, t = FRAME_PREFIX.unpack_from(buf, 0)
                    if len(buf) < 4 + length:
                        break
                    frame = bytearray(buf[:4 + length])
                    del buf[:4 + length]
                    if t == TxnBatch.__struct_config__.tag | STREAMED and not self.corrupted:
                        self.seen += 1
                        if self.seen == self.nth:
                            z = FRAME_PREFIX.size + STREAM_LENGTH.size
                            frame[z + (len(frame) - z) // 2] ^= 0x55
                            self.corrupted = True
                    dst.sendall(frame)
        except OSError:
            pass
        _shut(src, dst)

    def close(self) -> None:
        self._srv.close()
        for s in self._socks:
            s.close()


def test_a_damaged_streamed_batch_is_refused_and_the_link_recovers(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    relay = CorruptingRelay(b.receiver_port, nth=30)
    try:
        a.start_source(b, port=relay.port, compress=3)
        last = one_at_a_time(a, 150)
        wait_until(lambda: relay.corrupted, what="a damaged streamed batch")
        last = one_at_a_time(a, 50, start=150)
        cluster.wait_caught_up(a, b)
        assert relay.connections >= 2  # the source reconnected after the refusal
        assert source(a, b)["compression"] == "streamed"
        logs = log_text(b.root, "receiver.log")
        assert "protocol error from A" in logs and "stream-compressed body" in logs or "differ" in logs, logs[-2000:]
    finally:
        cluster.stop_all()
        relay.close()
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)
