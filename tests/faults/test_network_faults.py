"""Network faults between Source and Receiver Server: drops, delays, stalls, cuts, refusals.

A fault proxy (``multisite.testing.faultproxy``, a child process) sits between A's Source Server
and B's Receiver Server. Whatever it does to the byte stream, B must end identical to A with a
contiguous journal, without anyone restarting anything: the servers notice (a protocol error, a
reset, a heartbeat timeout), reconnect and catch up by themselves.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from multisite.errors import ConnectionLost
from multisite.testing.checks import assert_contiguous_journal, assert_same_data, log_text, wait_until
from multisite.testing.cluster import Cluster, Node
from multisite.testing.faultproxy import ProxyProcess

HEARTBEAT_INTERVAL_S = 0.2
HEARTBEAT_TIMEOUT_S = 1.5
SEED = int(os.environ.get("MULTISITE_FAULT_SEED", "20261121"))


def port_outside_the_ephemeral_range() -> int:
    """A free port below Linux's ephemeral range (32768..): while the proxy refuses, its port is
    closed, and an ephemeral one could be handed to another process's socket meanwhile (it
    happened: the source then reached some other test's receiver)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


@pytest.fixture
def link(tmp_path, request):
    """A → proxy → B, streaming; yields (cluster, a, b, proxy); stops everything after."""
    cluster = Cluster(tmp_path, durability="group")
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    proxy = ProxyProcess("127.0.0.1", b.receiver_port, listen_port=port_outside_the_ephemeral_range(),
                         seed=SEED).start()
    try:
        a.start_source(b, port=proxy.port, heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
                       heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        wait_until(lambda: source(a)["state"] == "streaming", what="the first connection")
        yield cluster, a, b, proxy
    finally:
        proxy.stop()
        cluster.stop_all()


def source(a: Node) -> dict:
    return a.call("source.status", secondary="B")


def write(a: Node, n: int, start: int = 0, value_bytes: int = 100) -> int:
    with a.client() as db:
        db.create_region("acct")
        for i in range(start, start + n):
            if i % 3 == 0:
                with db.transaction() as tx:
                    tx.set("acct", ("t", i), i)
                    tx.set("acct", ("t", i, "x"), "y" * value_bytes)
                last = tx.seqno
            else:
                last = db.set("acct", ("s", i), "v" * value_bytes)
    return last


class BackgroundWriter:
    """Commits on A from a thread while the test plays with the network."""

    def __init__(self, a: Node):
        self.a, self.n, self.error = a, 0, None
        self._halt = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "BackgroundWriter":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._t.join(30)

    def _run(self) -> None:
        try:
            with self.a.client() as db:
                db.create_region("acct")
                while not self._halt.is_set():
                    db.set("acct", ("bg", self.n), "z" * (self.n % 300))
                    self.n += 1
        except (ConnectionLost, OSError) as e:  # A never goes down in these tests
            self.error = e


def converge(cluster: Cluster, a: Node, b: Node, proxy: ProxyProcess) -> int:
    """Heal the network, let B catch up by itself, stop, compare."""
    proxy.heal()
    last = cluster.wait_caught_up(a, b, timeout=60)
    wait_until(lambda: source(a)["state"] == "streaming", what="streaming again")
    cluster.stop_all()
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)
    return last


def test_dropped_bytes_are_detected_and_the_stream_recovers(link):
    cluster, a, b, proxy = link
    proxy.drop(0.15, direction="both")
    with BackgroundWriter(a) as w:
        wait_until(lambda: proxy.stats()["upstream"]["bytes_dropped"] > 0 and source(a)["connects"] >= 3,
                   timeout_s=60, what="drops and reconnections")
    assert w.error is None and w.n > 0
    dropped = proxy.stats()
    assert dropped["upstream"]["bytes_dropped"] + dropped["downstream"]["bytes_dropped"] > 0
    converge(cluster, a, b, proxy)
    # Each damaged stream was noticed: a protocol error on one side or a heartbeat timeout.
    logs = log_text(b.root, "receiver.log") + log_text(a.root, "source-B.log")
    assert any(w_ in logs for w_ in ("REMOTE_PROTOCOL", "heartbeat", "protocol error")), logs[-2000:]


def test_delays_slow_the_stream_but_break_nothing(link):
    cluster, a, b, proxy = link
    a.call("source.stop", secondary="B")  # again with the default timeout: no false alarm on a loaded machine
    a.start_source(b, port=proxy.port, heartbeat_interval_s=HEARTBEAT_INTERVAL_S, heartbeat_timeout_s=5.0)
    wait_until(lambda: source(a)["state"] == "streaming", what="connected")
    proxy.delay(0.08, direction="both")  # well below the heartbeat timeout
    last = write(a, 300)
    cluster.wait_caught_up(a, b, timeout=60)
    st = wait_until(lambda: (s := source(a))["last_confirmed"] == last and s, what="confirmation")
    assert st["connects"] == 1 and st["last_error"] is None  # no reconnection was needed
    assert b.call("receiver.status")["connections"] == 2  # the fixture's source, then this one
    converge(cluster, a, b, proxy)


def stall_right_after_an_answer(proxy: ProxyProcess, timeout_s: float = 10.0) -> float:
    """Stall both ways just after a heartbeat answer got through the proxy; return a time before
    which the last answer the source can have heard had not yet left the proxy.

    The proxy counts a chunk as forwarded in the same event-loop step as it writes it (no await in
    between), so a count read at some moment says what had been written to the source by then. An
    answer that the count did not include yet at a read started at ``t`` reached the source after
    ``t``, whatever the scheduling of the three processes; so did any later one."""
    def answered() -> int:
        return proxy.stats()["downstream"]["bytes_forwarded"]

    t = time.monotonic()
    seen = answered()
    deadline = t + timeout_s
    while True:
        t_next = time.monotonic()
        now = answered()
        if now > seen:
            break
        t = t_next  # still `seen` at a read started at t_next: the next answer passes after it
        assert t_next < deadline, f"no heartbeat answer passed the proxy within {timeout_s} s"
    proxy.stall()
    return t


def test_a_stall_is_detected_by_the_heartbeat_timeout(link):
    cluster, a, b, proxy = link
    first = write(a, 50)
    cluster.wait_caught_up(a, b)
    answered_after = stall_right_after_an_answer(proxy)  # nothing passes either way; nothing is closed
    more = write(a, 100, start=50)
    st = wait_until(lambda: (s := source(a))["last_error"] and "heartbeat" in s["last_error"] and s,
                    timeout_s=20, what="a heartbeat timeout")
    # Not before the timeout: the source heard its last answer after `answered_after`.
    assert time.monotonic() - answered_after > HEARTBEAT_TIMEOUT_S
    assert st["state"] != "streaming"
    assert "heartbeat" in log_text(a.root, "source-B.log")
    assert b.seqno() == first < more  # nothing got through the stall
    proxy.resume()
    # The source reconnects by itself (the held bytes of the abandoned connection may reach B first).
    wait_until(lambda: source(a)["connects"] >= 2, what="a new connection")
    cluster.wait_caught_up(a, b, timeout=60)
    converge(cluster, a, b, proxy)


def test_one_way_stall_of_the_answers_is_detected_too(link):
    """Batches still flow to B, but its heartbeat answers are held: the source must give up."""
    cluster, a, b, proxy = link
    proxy.stall(direction="downstream")
    write(a, 30)
    wait_until(lambda: "heartbeat" in (source(a)["last_error"] or ""), timeout_s=20, what="a heartbeat timeout")
    proxy.resume(direction="downstream")
    converge(cluster, a, b, proxy)


def test_cuts_are_survived(link):
    cluster, a, b, proxy = link
    with BackgroundWriter(a) as w:
        for k in range(5):
            accepted = proxy.stats()["connections_accepted"]
            wait_until(lambda: source(a)["state"] == "streaming", timeout_s=30, what="streaming")
            assert proxy.cut() >= 1
            proxy.wait_for_accepted(accepted + 1, timeout_s=30)  # the source came back by itself
    assert w.error is None and w.n > 0
    assert proxy.stats()["connections_cut"] >= 5
    # the proxy accepts the source's sixth connection before the source counts it (after its handshake)
    wait_until(lambda: source(a)["connects"] >= 6, timeout_s=30, what="the source's sixth connection")
    converge(cluster, a, b, proxy)


def test_refused_connections_are_retried(link):
    cluster, a, b, proxy = link
    proxy.refuse(True)
    proxy.cut()
    more = write(a, 100)
    # The cut itself shows first ("connection reset"); then every reconnect meets the closed port.
    st = wait_until(lambda: (s := source(a))["last_error"] and "refused" in s["last_error"].lower() and s,
                    timeout_s=20, what="the refusal seen by the source")
    assert st["state"] == "connecting" and b.seqno() < more
    proxy.refuse(False)
    converge(cluster, a, b, proxy)


def test_random_network_chaos(link):
    """A seeded sequence of every fault while a writer commits; then heal and compare."""
    cluster, a, b, proxy = link
    rng = random.Random(SEED)
    done = []
    with BackgroundWriter(a) as w:
        for _ in range(12):
            fault = rng.choice(["drop", "delay", "stall", "stall-up", "cut", "refuse", "bandwidth"])
            done.append(fault)
            if fault == "drop":
                proxy.drop(rng.uniform(0.05, 0.3), direction=rng.choice(["upstream", "downstream", "both"]))
            elif fault == "delay":
                proxy.delay(rng.uniform(0.0, 0.2))
            elif fault == "stall":
                proxy.stall()
            elif fault == "stall-up":
                proxy.stall(direction="upstream")
            elif fault == "cut":
                proxy.cut()
            elif fault == "refuse":
                proxy.refuse(True)
                proxy.cut()
            else:
                proxy.bandwidth(rng.choice([20_000, 100_000]))
            time.sleep(rng.uniform(0.2, 2.0))  # let the fault act for a random while
            proxy.heal()
            time.sleep(rng.uniform(0.0, 0.5))
    assert w.error is None and w.n > 0
    converge(cluster, a, b, proxy)
    print(f"seed {SEED}: {', '.join(done)}; {w.n} background commits")


def test_a_slow_link_with_a_backlog_still_makes_progress(link):
    """200 KB/s is a slow WAN link, not a dead one: B must catch up, if slowly."""
    cluster, a, b, proxy = link
    a.call("source.stop", secondary="B")
    with a.client() as db:
        db.create_region("acct")
        for i in range(120):
            with db.transaction() as tx:
                for j in range(10):
                    tx.set("acct", (i, j), "x" * 1000)  # ~1.2 MB in all: 6 s at 200 KB/s
    proxy.bandwidth(200_000, direction="upstream")
    a.start_source(b, port=proxy.port, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0)
    cluster.wait_caught_up(a, b, timeout=20)  # 6 s of transfer at that rate
