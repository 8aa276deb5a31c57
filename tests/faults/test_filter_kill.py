"""SIGKILL a replication filter process mid-stream, while a writer commits on the primary.

Out-filter (the Source Server's): the link stops in state ``error`` with a ``FILTER`` error naming
the seqno and the batch that was not sent; the secondary holds exactly the batches before it.
In-filter (the Receiver Server's): the batch is refused (an ``Error FILTER`` to the source) and
nothing of it goes into the receive pool. Either way, a restart with a working filter resumes at
the secondary's seqno: every transaction is applied exactly once (a contiguous journal, the same
data as the primary's).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from multisite.testing.checks import assert_contiguous_journal, log_text, replicated_data, wait_until
from multisite.testing.cluster import Cluster
from multisite.testing.filters import filter_command

WRITES = 3000


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, durability="group")
    yield c
    c.stop_all()


def _writer(node, stop: threading.Event) -> threading.Thread:
    """Commits until ``stop`` (so that the filter is killed mid-stream), then ``WRITES`` more."""
    def run() -> None:
        with node.client() as db:
            i = 0
            while not stop.is_set():
                db.set("people", ("p", i), {"name": f"Ann Lee{i}"})
                i += 1
            for j in range(i, i + WRITES):
                db.set("people", ("p", j), {"name": f"Ann Lee{j}"})
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _setup(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    with a.client() as db:
        db.create_region("people")
    return a, b


def test_sigkill_of_the_out_filter_stops_the_link_and_a_restart_resumes_exactly_once(cluster):
    a, b = _setup(cluster)
    b.start_receiver()
    a.start_source(b, filter=filter_command("identity"))
    stop = threading.Event()
    w = _writer(a, stop)
    wait_until(lambda: b.seqno() > 300, what="B receiving")
    pid = a.call("source.status", secondary="B")["filter_pid"]
    os.kill(pid, signal.SIGKILL)
    st = wait_until(lambda: (s := a.call("source.status", secondary="B"))["state"] == "error" and s,
                    what="the source's error state")
    err = st["last_error"]
    m = re.search(r"^FILTER: out-filter for B .* at seqno (\d+)\b.*nothing of batch (\d+)\.\.(\d+) was sent", err)
    assert m, err
    seqno, first, last = map(int, m.groups())
    assert first <= seqno <= last
    time.sleep(0.5)  # whatever was sent before has arrived; nothing more will
    assert b.seqno() == first - 1 == st["last_sent"]
    stop.set()
    w.join(60)
    a.call("source.stop", secondary="B")
    a.start_source(b, filter=filter_command("identity"))
    n = cluster.wait_caught_up(a, b, timeout=60)
    assert n == a.seqno() > WRITES
    a.stop(), b.stop()
    assert_contiguous_journal(b.root, n)
    assert replicated_data(b.root) == replicated_data(a.root)


def test_sigkill_of_the_in_filter_refuses_the_batch_and_the_next_connection_resumes_exactly_once(cluster):
    a, b = _setup(cluster)
    b.start_receiver(filter=filter_command("identity", fmt="msgpack"), filter_format="msgpack")
    a.start_source(b)
    stop = threading.Event()
    w = _writer(a, stop)
    wait_until(lambda: b.seqno() > 300, what="B receiving")
    pid = b.call("receiver.status")["filter_pid"]
    os.kill(pid, signal.SIGKILL)
    # (``last_error`` is cleared by the next connection, which follows within a second or so: the log keeps it.)
    err = wait_until(lambda: re.search(r"ERROR .*FILTER: in-filter .* at seqno (\d+).*nothing of batch (\d+)\.\.(\d+) "
                                       r"went into the receive pool", log_text(b.root, "receiver.log")),
                     what="the receiver's filter error")
    seqno, first, last = map(int, err.groups())
    assert first <= seqno <= last
    # The source was told (an Error FILTER), and reconnects: a new filter process starts at B's seqno.
    wait_until(lambda: "reported FILTER: B: in-filter" in log_text(a.root, "source-B.log"), what="the source told")
    stop.set()
    w.join(60)
    n = cluster.wait_caught_up(a, b, timeout=60)
    assert n == a.seqno() > WRITES
    assert b.call("receiver.status")["filter_starts"] >= 2
    a.stop(), b.stop()
    assert_contiguous_journal(b.root, n)
    assert replicated_data(b.root) == replicated_data(a.root)
