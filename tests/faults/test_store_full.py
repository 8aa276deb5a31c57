"""The store's disk filling up under the engine: SQLite answers SQLITE_FULL by rolling back the
store's whole open transaction by itself, dropping every change since the last flush. The engine
must notice (StoreLost), refuse work until reopened, never flush a seqno over rows that are gone,
and lose no acknowledged commit: reopening rolls the store forward from the journal.

The full disk is SQLite's own ``PRAGMA max_page_count`` on the engine's connection, which makes
SQLite answer SQLITE_FULL exactly as a full file system does (a real tmpfs is in test_disk_full)."""

from __future__ import annotations

import threading

import pytest

import multisite
from multisite.errors import StorageFull, StoreLost


def _fill(db) -> None:
    pages = db.store.conn.execute("PRAGMA page_count").fetchone()[0]
    db.store.conn.execute(f"PRAGMA max_page_count={pages + 3}")


@pytest.mark.parametrize("mode", ["fsync", "group", "none"])
def test_a_store_that_sqlite_rolled_back_refuses_work_and_reopens_with_every_acknowledged_commit(tmp_path, mode):
    root = multisite.create(tmp_path / "A", name="A", durability=mode)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(20):
            db.set("r", ("k", i), i)
    db = multisite.open(root)
    _fill(db)
    acked: list[int] = []
    with pytest.raises(StoreLost, match="rolled back the open transaction"):
        for i in range(20, 100_000):
            db.set("r", ("k", i), "v" * 200)
            acked.append(i)
    assert acked, "the store filled before any commit"
    with pytest.raises(StoreLost):
        db.set("r", ("after",), 1)  # refused until reopened
    with pytest.raises(StoreLost):
        list(db.items("r"))  # not an answer from a store that lost acknowledged commits
    db.close()  # closes without flushing what is gone
    with multisite.open(root) as db:
        missing = [i for i in range(20) if db.get("r", ("k", i)) != i]
        missing += [i for i in acked if db.get("r", ("k", i)) != "v" * 200]
        assert missing == [] and db.seqno >= 20 + len(acked)
        assert db.get("r", ("after",)) is None
        db.set("r", ("after",), 1)  # and it goes on
        assert db.seqno == db.store.applied_seqno


def test_group_commit_threads_all_hear_of_it_and_nothing_acknowledged_is_lost(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    with multisite.open(root) as db:
        db.create_region("r")
    db = multisite.open(root)
    _fill(db)
    acked: dict[int, list[int]] = {t: [] for t in range(8)}
    errors: dict[int, BaseException] = {}

    def work(t: int) -> None:
        try:
            for i in range(100_000):
                db.set("r", (t, i), "v" * 200)
                acked[t].append(i)
        except BaseException as e:
            errors[t] = e

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not [th for th in threads if th.is_alive()], "threads left waiting"
    # Each thread hears: StoreLost once SQLite dropped the transaction, StorageFull for a batch whose
    # failing statement alone was undone (the store stays consistent and the engine goes on).
    assert sorted(errors) == list(range(8)), errors
    assert all(isinstance(e, (StoreLost, StorageFull)) for e in errors.values()), errors
    db.close()
    with multisite.open(root) as db:
        assert [(t, i) for t, ids in acked.items() for i in ids if db.get("r", (t, i)) != "v" * 200] == []


def test_a_store_that_is_only_locked_is_not_called_corrupt(tmp_path):
    """'database is locked' (another process holds the store) is not damage: no advice to move the
    store aside, which would lose the unreplicated regions."""
    import sqlite3

    from multisite.errors import MultisiteError, StoreCorrupt

    root = multisite.create(tmp_path / "A", name="A")
    other = sqlite3.connect(root / "db" / "store.sqlite", isolation_level=None)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(MultisiteError, match="cannot be opened.*locked") as err:
            multisite.open(root)
        assert not isinstance(err.value, StoreCorrupt)
    finally:
        other.close()
    multisite.open(root).close()
