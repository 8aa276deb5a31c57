"""Log shipping between real instance servers: replicate, cascade, pool overflow, passive/active,
flow control, refusals, compression.

Every test ends by stopping the servers and comparing the secondaries' files with the primary's
(data key by key, and the journal record by record), so "caught up" always means "identical".
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

import multisite
from multisite import engine as database
from multisite.testing.checks import (assert_contiguous_journal, assert_same_data, journal_frames, journal_records,
                                      log_text, wait_until)
from multisite.testing.cluster import Node
from multisite.testing.faultproxy import ProxyProcess


def workload(node: Node, n: int, *, start: int = 0, value_bytes: int = 16, region: str = "acct") -> int:
    """``n`` transactions through the client API, of every kind; returns the last seqno."""
    with node.client() as db:
        db.create_region(region)
        db.create_region("other")
        seqno = 0
        for i in range(start, start + n):
            if i % 10 == 7:
                seqno = db.kill(region, ("k", i - 3))
            elif i % 10 == 9:
                seqno = db.zkill(region, ("k", i - 1))
            elif i % 5 == 0:
                with db.transaction() as tx:
                    tx.set(region, ("k", i), {"i": i, "pad": "x" * value_bytes})
                    tx.set(region, ("k", i, "child"), [i, i + 1])
                    tx.set("other", (i,), i)
                seqno = tx.seqno
            else:
                seqno = db.set(region, ("k", i), "v" * value_bytes + str(i))
        return seqno


def source_status(primary: Node, secondary: Node) -> dict:
    return primary.call("source.status", secondary=secondary.name)


def finish(cluster, primary: Node, *secondaries: Node) -> None:
    """Wait for every secondary, stop everything, compare files."""
    for s in secondaries:
        cluster.wait_caught_up(primary, s)
    last = primary.seqno()
    cluster.stop_all()
    for s in secondaries:
        assert_same_data(primary.root, s.root)
        assert_contiguous_journal(s.root, last)
    assert_contiguous_journal(primary.root, last)


def test_replicate_a_to_b(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    last = workload(a, 300)
    assert last == a.seqno() >= 300
    cluster.wait_caught_up(a, b)
    st = wait_until(lambda: (s := source_status(a, b))["last_confirmed"] == last and s, what="confirmation")
    assert st["state"] == "streaming" and st["backlog"] == 0 and st["last_sent"] == last
    assert st["reading_from"] == "pool" and st["file_reads"] == 0  # steady state: nothing read from disk
    rs = b.call("receiver.status")
    assert rs["state"] == "receiving" and rs["source"] == "A" and rs["seqno"] == last
    assert b.status()["role"] == "secondary"
    cluster.stop_all()
    data = assert_same_data(a.root, b.root)
    assert set(data) == {"acct", "other"} and len(data["acct"]) > 100
    assert_contiguous_journal(b.root, last)
    # The secondary journals the very same transactions: seqnos, origin and updates, and the very same
    # bytes (the primary's frames with their CRCs, end to end).
    assert journal_records(b.root) == journal_records(a.root)
    assert journal_frames(b.root) == journal_frames(a.root)
    with database.open(a.root) as da, database.open(b.root) as db:
        assert db.info.role == "secondary" and da.info.role == "primary"
        assert [(h.uid, h.start_seqno, h.root_primary) for h in db.info.history] == \
               [(h.uid, h.start_seqno, h.root_primary) for h in da.info.history]


def test_cascade_a_to_b_to_c(cluster):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    cluster.link(a, b)
    cluster.link(b, c)  # B, a secondary, feeds C from its own journal pool
    workload(a, 200)
    cluster.wait_caught_up(a, b)
    cluster.wait_caught_up(a, c)
    assert source_status(b, c)["reading_from"] == "pool"
    finish(cluster, a, b, c)
    assert journal_records(c.root) == journal_records(a.root)
    assert journal_frames(c.root) == journal_frames(b.root) == journal_frames(a.root)
    with database.open(a.root) as da, database.open(c.root) as dc:
        assert [(h.uid, h.start_seqno, h.root_primary) for h in dc.info.history] == \
               [(h.uid, h.start_seqno, h.root_primary) for h in da.info.history]


def test_journal_pool_overflow_reads_files_then_returns_to_the_pool(cluster):
    a = cluster.instance("A", journal_pool_bytes=64 * 1024)
    b = cluster.instance("B")
    cluster.link(a, b)
    workload(a, 20)
    cluster.wait_caught_up(a, b)
    b.stop()
    last = workload(a, 1500, start=20, value_bytes=200)  # several hundred KiB: far more than the pool
    pool = a.status()["pool"]
    assert pool["first_seqno"] > 21 and pool["bytes"] <= 64 * 1024 + 4096
    b.start()
    b.start_receiver(b.receiver_port)  # same port: the source reconnects by itself
    cluster.wait_caught_up(a, b)
    st = wait_until(lambda: (s := source_status(a, b))["reading_from"] == "pool" and s, what="back to the pool")
    assert st["file_reads"] > 0 and st["last_sent"] == last
    assert "reading journal files" in log_text(a.root, "source-B.log")
    assert "back to the journal pool" in log_text(a.root, "source-B.log")
    # Once back in the pool, new transactions come from memory only.
    reads = st["file_reads"]
    workload(a, 50, start=2000)
    cluster.wait_caught_up(a, b)
    st = source_status(a, b)
    assert st["file_reads"] == reads and st["reading_from"] == "pool"
    finish(cluster, a, b)


def test_passive_source_then_activate_then_deactivate(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    res = a.start_source(b, passive=True)
    assert res["state"] == "passive" and res["mode"] == "passive" and res["pid"] == a.pid
    first = workload(a, 50)
    st = source_status(a, b)
    assert st["state"] == "passive" and st["connects"] == 0 and st["last_sent"] == 0
    assert st["backlog"] == first
    assert b.call("receiver.status")["connections"] == 0 and b.seqno() == 0

    st = a.call("source.activate", secondary="B")
    assert st["mode"] == "active"
    cluster.wait_caught_up(a, b)
    assert source_status(a, b)["connects"] == 1

    # The reply comes once the session is closed: what is committed from then on stays unsent,
    # with no wait in between.
    assert a.call("source.deactivate", secondary="B")["state"] == "passive"
    second = workload(a, 30, start=50)
    wait_until(lambda: b.call("receiver.status")["state"] == "listening", what="receiver lost its source")
    st = source_status(a, b)
    assert st["state"] == "passive" and st["connects"] == 1 and st["last_sent"] == first
    assert b.seqno() == first

    a.call("source.activate", secondary="B")
    cluster.wait_caught_up(a, b)
    assert source_status(a, b)["connects"] == 2 and b.seqno() == second
    finish(cluster, a, b)


def test_update_process_stopped_while_data_arrives_xoff_then_nothing_lost(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver(receive_pool_bytes=64 * 1024)  # XOFF above 64 KiB, XON below 16 KiB
    a.start_source(b)
    workload(a, 10)
    cluster.wait_caught_up(a, b)
    at = b.seqno()
    res = b.call("update.stop")
    assert res["state"] == "stopped"
    last = workload(a, 1200, start=10, value_bytes=200)
    rs = wait_until(lambda: (r := b.call("receiver.status"))["xoff"] and r, what="XOFF")
    assert rs["xoffs"] >= 1 and rs["update_process"]["state"] == "stopped"
    assert rs["receive_pool_bytes"] > 64 * 1024 and rs["backlog"] > 0
    assert b.seqno() == at  # nothing applied while stopped
    wait_until(lambda: source_status(a, b)["state"] == "xoff", what="source paused by XOFF")
    assert source_status(a, b)["last_sent"] < last  # it really stopped sending

    assert b.call("update.start")["state"] == "running"
    cluster.wait_caught_up(a, b)
    rs = wait_until(lambda: (r := b.call("receiver.status"))["xoff"] is False and r, what="XON")
    assert rs["update_process"]["state"] == "running"
    assert "XOFF" in log_text(b.root, "receiver.log") and "XON" in log_text(b.root, "receiver.log")
    assert "XOFF" in log_text(a.root, "source-B.log")
    finish(cluster, a, b)


def test_a_secondary_refuses_application_updates(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    workload(a, 5)
    cluster.wait_caught_up(a, b)
    before = b.seqno()
    with multisite.connect(f"127.0.0.1:{b.client_port}") as db:
        assert db.get("acct", ("k", 1)) is not None  # reads are fine
        for attempt in (lambda: db.set("acct", ("x",), 1), lambda: db.kill("acct", ("k",)),
                        lambda: db.zkill("acct", ("k", 1))):
            with pytest.raises(multisite.NotPrimary) as ei:
                attempt()
            assert ei.value.code == "NOT_PRIMARY" and "secondary" in str(ei.value)
        with pytest.raises(multisite.NotPrimary):
            with db.transaction() as tx:
                tx.set("acct", ("y",), 2)
    assert b.seqno() == before
    finish(cluster, a, b)


def refused_both_sides(cluster, a: Node, secondary_name: str, b: Node, code: str, b_seqno: int = 0) -> None:
    st = wait_until(lambda: (s := a.call("source.status", secondary=secondary_name))["last_error"]
                    and code in s["last_error"] and s, what=f"{code} in the source's last_error")
    assert st["state"] != "streaming"
    wait_until(lambda: code in log_text(a.root, f"source-{secondary_name}.log"), what="source log")
    wait_until(lambda: code in log_text(b.root, "receiver.log"), what="receiver log")
    rs = b.call("receiver.status")
    assert rs["refusals"] >= 1 and code in rs["last_error"]
    assert b.seqno() == b_seqno


def test_receiver_refuses_a_source_from_another_group(cluster):
    a = cluster.instance("A")
    b = cluster.instance("B", group="other")
    cluster.link(a, b)
    workload(a, 5)
    refused_both_sides(cluster, a, "B", b, "GROUP_MISMATCH")


def test_receiver_refuses_an_instance_with_its_own_name(cluster, tmp_path):
    a = cluster.instance("A")
    database.create(tmp_path / "twin", "A", durability="group")
    twin = Node("A", tmp_path / "twin").start()
    cluster.nodes["twin"] = twin
    twin.start_receiver()
    workload(a, 5)
    a.call("source.start", secondary="twin", connect=f"127.0.0.1:{twin.receiver_port}",
           heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0)
    refused_both_sides(cluster, a, "twin", twin, "SAME_NAME")


def test_an_instance_cannot_be_its_own_secondary(cluster):
    a = cluster.instance("A")
    with pytest.raises(multisite.ConfigError, match="own secondary"):
        a.call("source.start", secondary="A", connect="127.0.0.1:1")


def test_zstd_compression_replicates_and_sends_fewer_bytes(cluster):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    b.start_receiver()
    c.start_receiver()
    with ProxyProcess("127.0.0.1", b.receiver_port) as plain, ProxyProcess("127.0.0.1", c.receiver_port) as zstd:
        a.start_source(b, port=plain.port)
        res = a.start_source(c, port=zstd.port, compress=3)
        assert res["compress_level"] == 3
        workload(a, 600, value_bytes=300)
        cluster.wait_caught_up(a, b)
        cluster.wait_caught_up(a, c)
        plain_bytes = plain.stats()["upstream"]["bytes_forwarded"]
        zstd_bytes = zstd.stats()["upstream"]["bytes_forwarded"]
        assert zstd_bytes * 3 < plain_bytes, (zstd_bytes, plain_bytes)
        finish(cluster, a, b, c)


def test_stopping_the_primary_sends_what_is_pending_first(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    last = workload(a, 1500, value_bytes=200)
    a.stop(timeout=20)  # returns once A's server is gone; its source sent everything before that
    # Sent is not yet applied: B's receiver and Update Process may still be working through the last
    # batch when A has exited. A is gone, so whatever B reaches now A must have sent before it stopped.
    wait_until(lambda: b.seqno() == last, what=f"B to apply what A sent before stopping (seqno {last})")
    cluster.stop_all()
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)


def test_stopping_the_primary_delivers_what_it_sent_to_a_secondary_that_is_behind(cluster):
    """The source's last close must not end in a reset: the secondary's kernel discards what it has
    not read yet when an RST comes, and B lost the tail that A had logged as sent (426 of 600)."""
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b, heartbeat_timeout_s=60.0)  # B is paused below: that must not count as a lost link
    wait_until(lambda: source_status(a, b)["state"] == "streaming", what="streaming")
    os.kill(b.pid, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (b.pid, signal.SIGCONT))
    try:
        last = workload(a, 600, value_bytes=10_000)  # megabytes: more than the sockets hold
        resume.start()  # B reads again while A's stop waits for its source to send the rest
        a.stop(timeout=30)
    finally:
        resume.cancel()
        os.kill(b.pid, signal.SIGCONT)
    wait_until(lambda: b.seqno() == last, timeout_s=60, what=f"B to apply all A sent (seqno {last})")
    cluster.stop_all()
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)


def test_statistics_are_logged_every_interval(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver(stats_interval_s=0.3)
    a.start_source(b, stats_interval_s=0.3)
    last = workload(a, 100)
    cluster.wait_caught_up(a, b)
    src = wait_until(lambda: [ln for ln in log_text(a.root, "source-B.log").splitlines()
                              if "stats:" in ln and f"current {last}" in ln], what="a source stats line")
    for word in ("backlog", "sent", "/s)", "seqno start 0", f"current {last}", "confirmed"):
        assert word in src[-1], (word, src[-1])
    rcv = wait_until(lambda: [ln for ln in log_text(b.root, "receiver.log").splitlines()
                              if "stats:" in ln and f"applied seqno {last}" in ln], what="a receiver stats line")
    for word in ("received", "/s)", f"received seqno {last}", "started at 0", "backlog"):
        assert word in rcv[-1], (word, rcv[-1])
    finish(cluster, a, b)


def test_receiver_refuses_a_source_it_is_ahead_of(cluster):
    """B originated transactions of its own before it became a secondary: A's history does not
    contain them, so B must roll back first (issue 4's --autorollback and rollback do that)."""
    a, b = cluster.instance("A"), cluster.instance("B")
    own = workload(b, 3)
    workload(a, 10)
    cluster.link(a, b)
    refused_both_sides(cluster, a, "B", b, "ROLLBACK_NEEDED", b_seqno=own)
    assert "rollback" in b.call("receiver.status")["last_error"]


def test_a_receiver_takes_one_source_at_a_time(cluster):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    cluster.link(a, b)
    workload(a, 10)
    cluster.wait_caught_up(a, b)
    c.start_source(b)  # C, a primary of its own, tries to feed B as well
    st = wait_until(lambda: (s := c.call("source.status", secondary="B"))["last_error"]
                    and "BUSY" in s["last_error"] and s, what="BUSY")
    assert st["state"] != "streaming"
    wait_until(lambda: "refusing source C" in log_text(b.root, "receiver.log"), what="the refusal in B's log")
    assert b.call("receiver.status")["source"] == "A"
    c.call("source.stop", secondary="B")
    finish(cluster, a, b)


def test_a_supplementary_receiver_confirms_in_the_sources_seqnos(cluster):
    """A supplementary instance counts its own transactions in its seqno; what it confirms to its
    source must be its SI stream's seqno, since the source keeps its journal (prune) by it. It
    confirmed its own seqno, and prune removed segments it had never received."""
    import time

    a = cluster.instance("A", group="bank", segment_bytes=4096)
    m = cluster.instance("M", group="si", supplementary=True)
    with m.client() as db:
        db.create_region("loc")
        for i in range(200):
            db.set("loc", (i,), i)  # M's own seqno goes to 200
    m.start_receiver()
    a.start_source(m)
    with a.client() as db:
        db.create_region("t")
        for i in range(3):
            db.set("t", (i,), "x" * 100)
    def m_has_them() -> bool:
        with m.client() as db:
            try:
                return len(list(db.items("t"))) == 3
            except multisite.RegionNotFound:  # not even the first of them yet
                return False

    wait_until(m_has_them, what="M applies A's 3 transactions")
    wait_until(lambda: source_status(a, m)["last_confirmed"] >= 3, what="A's slot for M confirmed")
    deadline = time.monotonic() + 1.5  # several heartbeat answers (every 0.2 s)
    while time.monotonic() < deadline:
        assert source_status(a, m)["last_confirmed"] == 3, "confirmed past what A has"
        time.sleep(0.1)


def test_the_source_learns_of_each_applied_batch_at_once_not_at_the_next_heartbeat(cluster):
    """Backlog and lag are true: the receiver confirms each batch the Update Process applied, so the
    source's backlog reaches 0 within milliseconds, with heartbeats 5 s apart (and the receiver's
    progress answers, for slow links, turned down to one every 30 s)."""
    import time

    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver(progress_interval_s=30.0)
    cluster.link(a, b, heartbeat_interval_s=5.0, heartbeat_timeout_s=30.0)
    workload(a, 5)  # the session is up and confirmed once
    cluster.wait_caught_up(a, b)
    wait_until(lambda: source_status(a, b)["backlog"] == 0, what="the first confirmation")
    seen = []
    for _ in range(3):
        last = workload(a, 20)
        t0 = time.monotonic()
        st = wait_until(lambda: (s := source_status(a, b))["last_confirmed"] == last and s, timeout_s=4.0,
                        what="the confirmation of the last batch, before any heartbeat")
        seen.append(time.monotonic() - t0)
        assert st["backlog"] == 0 and st["lag_s"] == 0.0
    assert max(seen) < 1.0, seen  # each well inside the 5 s between heartbeats
    cluster.stop_all()
    assert_same_data(a.root, b.root)
