"""Group commit under real threads for a while: a batch whose journal write fails, or the instance
closing under them. Every committing thread hears of its outcome and none hangs.

The journal write failing is simulated by wrapping ``write_all`` (a real full disk is in tests/faults);
the threads run for a fraction of a second of real time, which is why these are not in tests/unit
(test_group_commit.py there has the batches without threads or sleeps).
"""

from __future__ import annotations

import threading
import time

import multisite
import multisite.journal.writer as writer
from multisite.errors import StorageFull, TransactionError


def _run_then(threads: list[threading.Thread], seconds: float, then) -> list[threading.Thread]:
    """Start ``threads``, let them run ``seconds``, call ``then`` (what ends them), join each (10 s)."""
    for t in threads:
        t.start()
    time.sleep(seconds)
    then()
    for t in threads:
        t.join(10)
    return threads


def test_a_failed_batch_fails_its_unreplicated_only_commits_too(tmp_path, monkeypatch):
    """A commit of unreplicated regions only journals nothing, yet its store writes are in the batch
    that a failed journal write rolls back: it must fail too. It returned success, its data gone."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    db.create_region("u", replicated=False)
    real = writer.write_all

    def full(fd, data, what, offset=None):
        if len(data) > 100 and data.count(0) < len(data):  # records, not preallocation zeros
            raise StorageFull("simulated: disk full")
        return real(fd, data, what, offset=offset)

    monkeypatch.setattr(writer, "write_all", full)
    acked, stop = [], threading.Event()

    def unreplicated():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                with db.transaction() as tx:
                    tx.set("u", ("u", i), i)
            except StorageFull:
                continue
            acked.append(i)

    def replicated():
        while not stop.is_set():
            try:
                db.set("r", ("r",), "x" * 200)
            except StorageFull:
                pass

    _run_then([threading.Thread(target=unreplicated), threading.Thread(target=replicated),
               threading.Thread(target=replicated)], 1.0, stop.set)
    monkeypatch.setattr(writer, "write_all", real)
    try:
        assert acked, "no unreplicated commit got through at all"
        assert [i for i in acked if db.get("u", ("u", i)) != i] == []
    finally:
        db.close()


def test_closing_while_threads_commit_wakes_every_one_of_them(tmp_path):
    """``close`` while group commits queue: each committing thread gets an error (or its commit)
    and returns; none waits forever for a combiner that died on the closed store."""
    for _ in range(3):
        root = multisite.create(tmp_path / f"A{_}", name="A", durability="group")
        db = multisite.open(root)
        db.create_region("r")
        errors: dict[int, BaseException] = {}

        def work(t):
            i = 0
            try:
                while True:
                    i += 1
                    db.set("r", (t, i), i)
            except BaseException as e:
                errors[t] = e

        ts = _run_then([threading.Thread(target=work, args=(t,), daemon=True) for t in range(8)], 0.3, db.close)
        assert [t for t in ts if t.is_alive()] == [], "threads left waiting after close"
        assert all(isinstance(e, TransactionError) for e in errors.values()), errors
