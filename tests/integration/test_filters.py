"""Replication filters with real processes: the filter runner's pipes, out- and in-filters on a
link, failures that stop the link naming the seqno, and the rolling upgrade end to end."""

from __future__ import annotations

import logging
import time
import re

import msgspec
import pytest

from multisite.errors import ConfigError, FilterError
from multisite.journal.reader import iter_records
from multisite.journal.records import SET, FrameRun, Record, Update, encode_record
from multisite.replication.server.filter_process import Filter
from multisite.replication.filters import FilterSpec
from multisite.testing.checks import journal_records, log_text, wait_until
from multisite.testing.filters import downgrade_person, filter_command
from multisite.values import encode_value

UPGRADE_FN = "multisite.testing.filters:upgrade_person"
LOG = logging.getLogger("test")


def _run(first: int, n: int, size: int = 10) -> FrameRun:
    recs = [Record(first + i, 0, 0, "A", 1.0, [Update(SET, "people", ("p", first + i),
                                                     encode_value({"name": "Ann Lee", "pad": "x" * size}))])
            for i in range(n)]
    return FrameRun.of([(r.seqno, encode_record(r)) for r in recs])


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_filter_process_is_pipelined_through_large_batches(tmp_path, fmt):
    f = Filter(FilterSpec.parse(filter_command("identity", fmt=fmt), fmt), "test filter", LOG, tmp_path / "err")
    try:
        for first in (1, 3001):  # 3000 transactions of ~1 KiB: far more than a pipe holds, both ways
            run = _run(first, 3000, 1000)
            out = f.apply(run)
            assert (out.first_seqno, out.data, out.ends) == (run.first_seqno, run.data, run.ends)
        assert f.starts == 1  # one process for the session
    finally:
        f.close()


@pytest.mark.parametrize("mode, match", [
    (("crash-after", "3"), r"exited with code 3 at seqno 4"),
    (("hang-after", "2"), r"no answer for seqno 3 within 0.5 s"),
    (("wrong-seqno",), r"out of step: it answered seqno 2 for seqno 1"),
    (("extra",), r"out of step: it answered seqno 1 for seqno 2"),
    (("garbage",), r"answered seqno 1 with malformed JSON"),
])
def test_a_broken_filter_process_fails_naming_the_seqno_and_is_killed(tmp_path, mode, match):
    f = Filter(FilterSpec.parse(filter_command(*mode), timeout_s=0.5), "test filter", LOG, tmp_path / "err")
    f.check()
    pid = f.pid
    with pytest.raises(FilterError, match=match):
        f.apply(_run(1, 5))
    assert f.pid is None
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(pid, 0)


def test_a_stale_batchs_failure_kills_only_its_own_process(tmp_path):
    """A session that ended mid-batch leaves its worker thread in ``apply``; when that batch then
    fails, the process of the next session (started meanwhile) must live on."""
    import threading

    f = Filter(FilterSpec.parse(filter_command("hang-after", "1"), timeout_s=1.0), "test filter", LOG, tmp_path / "err")
    failed: list[BaseException] = []

    def stale() -> None:
        try:
            f.apply(_run(1, 3))
        except FilterError as e:
            failed.append(e)

    t = threading.Thread(target=stale)
    t.start()
    deadline = time.monotonic() + 10
    while f.pid is None:  # the stale batch's process is up
        assert time.monotonic() < deadline
        time.sleep(0.01)
    old = f._proc
    f._proc = None  # the session ended (its kill is the next session's business)
    new = f._start()  # the next session's process
    t.join(20)
    try:
        assert failed and "no answer for seqno 2" in str(failed[0])
        assert old.poll() is not None  # the stale batch's process was killed...
        assert f._proc is new and new.poll() is None  # ...and the next session's was not
    finally:
        f.close()
        old.kill()


def test_a_filter_command_that_cannot_start_is_refused_at_start(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    with pytest.raises(ConfigError, match="cannot start out-filter for B"):
        a.start_source(b, filter="/nonexistent/filter --x")
    with pytest.raises(ConfigError, match="cannot load 'nope'"):
        a.start_source(b, filter="multisite.testing.filters:nope")


def _people(node) -> dict:
    with node.client() as db:
        return {k: v for k, v in db.items("people")}


def test_an_out_filter_sends_transformed_transactions_under_the_same_seqnos(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    a.start_source(b, filter=filter_command("drop", fmt="msgpack"), filter_format="msgpack")
    with a.client() as db:
        db.create_region("people")
        for i in range(20):
            db.set("people", ("p", i), {"name": f"P {i}"})
    cluster.wait_caught_up(a, b)
    st = a.call("source.status", secondary="B")
    assert st["filter"].endswith("drop --format msgpack") and st["filtered"] == 20 and st["filter_pid"]
    assert "out-filter" in log_text(a.root, "source-B.log")
    b.stop()
    assert [(seqno, origin, ups) for seqno, _, _, origin, ups in journal_records(b.root)] == \
        [(i, "A", []) for i in range(1, 21)]


def test_a_filter_that_fails_on_the_source_stops_the_link_naming_the_seqno(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver()
    with a.client() as db:
        db.create_region("people")
        for i in range(5):
            db.set("people", ("p", i), {"name": f"P {i}"})
    a.start_source(b, filter=filter_command("crash-after", "3"))
    st = wait_until(lambda: (s := a.call("source.status", secondary="B"))["state"] == "error" and s,
                    what="the source's error state")
    assert re.search(r"FILTER: out-filter for B .* exited with code 3 at seqno 4; .*; nothing of batch 1..5 was "
                     r"sent", st["last_error"]), st["last_error"]
    assert st["connects"] == 1 and st["last_sent"] == 0
    assert "fix the filter" in log_text(a.root, "source-B.log")
    assert b.seqno() == 0  # nothing of the batch was sent
    a.call("source.stop", secondary="B")
    a.start_source(b, filter=filter_command("identity"))
    cluster.wait_caught_up(a, b)
    assert _people(b) == _people(a)


def test_a_filter_that_fails_on_the_receiver_refuses_the_batch_naming_the_seqno(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver(filter=filter_command("wrong-seqno"))
    with a.client() as db:
        db.create_region("people")
        db.set("people", ("p", 1), {"name": "Ann Lee"})
    a.start_source(b)
    err = wait_until(lambda: a.call("source.status", secondary="B")["last_error"], what="the source's error")
    assert "FILTER: B: in-filter" in err and "seqno 1" in err and "batch 1..1 went into the receive pool" in err
    rst = b.call("receiver.status")
    assert rst["last_error"].startswith("FILTER:") and rst["filter"].endswith("wrong-seqno")
    assert b.seqno() == 0


def test_a_slow_in_filter_keeps_the_link_alive_while_it_works_through_a_batch(cluster):
    """Each answer within --filter-timeout, but a batch takes longer than the source's heartbeat
    timeout: the receiver must keep answering meanwhile, not let the source give the link up."""
    a, b = cluster.instance("A"), cluster.instance("B")
    b.start_receiver(filter=filter_command("slow", "60"))
    with a.client() as db:
        db.create_region("people")
        for i in range(40):  # one batch of 40 transactions: about 2.4 s in the filter
            db.set("people", ("p", i), {"name": "Ann Lee"})
    a.start_source(b, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0)
    cluster.wait_caught_up(a, b)
    st = a.call("source.status", secondary="B")
    assert st["connects"] == 1 and not st["last_error"], st
    assert b.call("receiver.status")["filter_starts"] == 1


def test_rolling_upgrade_end_to_end(cluster):
    """A runs the old application ({"name": "Ann Lee"}), B the new one ({"first": "Ann", "last": "Lee"}).
    B catches up from A through an in-filter while A runs; the application switches over to B; A,
    down for its upgrade window and still on the old version when it returns, catches up from B's
    journal files through B's out-filter, which turns new shapes back into old ones."""
    a, b = cluster.instance("A"), cluster.instance("B")
    with a.client() as db:
        db.create_region("people")
        for i in range(30):
            db.set("people", ("p", i), {"name": f"Ann Lee{i}"})
    b.start_receiver(filter=UPGRADE_FN)
    a.start_source(b)
    with a.client() as db:  # A keeps running while B catches up
        for i in range(30, 40):
            db.set("people", ("p", i), {"name": f"Bo Tan{i}"})
        db.zkill("people", ("p", 0))
    cluster.wait_caught_up(a, b)
    on_b = _people(b)
    assert on_b[("p", 1)] == {"first": "Ann", "last": "Lee1"} and on_b[("p", 35)] == {"first": "Bo", "last": "Tan35"}
    assert ("p", 0) not in on_b and len(on_b) == 39
    # Switch over: A's source sends what is pending and stops; B becomes the primary.
    a.call("source.stop", secondary="B")
    b.call("receiver.stop")
    b.call("role", role="primary")
    switch = b.seqno()
    assert switch == a.seqno() == 41
    a.stop()  # A's upgrade window: B takes the commits
    with b.client() as db:
        db.set("people", ("p", 1), {"first": "Ann", "last": "Lee-Smith"})  # its before-image is a new shape too
        for i in range(40, 50):
            db.set("people", ("p", i), {"first": "Cy", "last": f"Du{i}"})
    a.start()
    a.start_receiver()
    b.start_source(a, filter=filter_command("downgrade"))
    cluster.wait_caught_up(b, a)
    on_a, on_b = _people(a), _people(b)
    assert on_a[("p", 1)] == {"name": "Ann Lee-Smith"} and on_a[("p", 45)] == {"name": "Cy Du45"}
    assert {k: downgrade_person({"updates": [{"region": "people", "value": v}]})["updates"][0]["value"]
            for k, v in on_b.items()} == on_a
    st = b.call("source.status", secondary="A")
    assert st["reading_from"] in ("files", "pool") and st["filtered"] == 11 and st["last_error"] is None
    a.stop()
    rec = next(iter_records(a.root / "journal", switch + 1))
    [up] = rec.updates
    assert msgspec.msgpack.decode(up.before) == {"name": "Ann Lee1"}  # the before-image went through the filter too
