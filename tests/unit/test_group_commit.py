"""Group commit's batches: what a batch reads and writes, and how a failed batch reaches each of its
callers, with no thread left waiting.

The journal write failing is simulated by wrapping ``write_all`` (a real full disk is in
tests/faults); the cases with threads committing for a while are in
tests/integration/test_group_commit_threads.py.
"""

from __future__ import annotations

import random
import threading

import multisite
import multisite.journal.writer as writer
from multisite.engine import core as engine_core, group as engine_group
from multisite.errors import StorageFull, TransactionError
from multisite.journal import records as journal_records
from multisite.journal.reader import iter_records
from multisite.journal.records import KILL, SET, ZKILL
from multisite.values import encode_value


# -- a batch of requests, as the combiner prepares it ------------------------------------------------
def _requests(*txs):
    """Group-commit requests, each a list of ``(op, region, key, value)``."""
    return [engine_group._Request([(op, region, key, None if v is None else encode_value(v))
                                   for op, region, key, v in ops], threading.Lock()) for ops in txs]


def _prepare(db, batch):
    token, err = db._group._prepare_batch(batch)
    assert err is None
    if token is not None:
        db.journal.harden(token)


def test_a_batch_of_sets_reads_each_before_image_after_the_requests_before_it(tmp_path, monkeypatch):
    """The combiner reads a batch's before-images in one query: a request must still see the sets of
    the requests before it in the batch, and one that fails (a record over the limit) must leave no
    set behind for the requests after it to see."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    db.create_region("u", replicated=False)
    db.set("r", ("k",), "v0")
    monkeypatch.setattr(journal_records, "MAX_RECORD_BYTES", 2000)
    batch = _requests([(SET, "r", ("k",), "v1"), (SET, "u", ("u",), 1)],
                      [(SET, "r", ("k",), "x" * 5000), (SET, "r", ("new",), 1), (SET, "u", ("u",), 99)],
                      [(SET, "r", ("k",), "v3"), (SET, "r", ("k",), "v4")],
                      [(SET, "u", ("u",), 2)])
    _prepare(db, batch)
    assert [r.seqno for r in batch] == [2, 0, 3, 0]
    assert [type(r.error) for r in batch] == [type(None), TransactionError, type(None), type(None)]
    recs = list(iter_records(db.layout.journal, 2))
    assert [[(u.key, u.value, u.before) for u in rec.updates] for rec in recs] == [
        [(("k",), encode_value("v1"), encode_value("v0"))],
        [(("k",), encode_value("v3"), encode_value("v1")), (("k",), encode_value("v4"), encode_value("v3"))]]
    state = (db.get("r", ("k",)), db.get("r", ("new",)), db.get("u", ("u",)), db.seqno)
    assert state == ("v4", None, 2, 3)
    db.close()
    db = multisite.open(root)
    assert (db.get("r", ("k",)), db.get("r", ("new",)), db.get("u", ("u",)), db.seqno) == state
    db.close()


def test_batches_of_any_requests_match_a_model(tmp_path, monkeypatch):
    """Random batches (sets, kills, zkills, unreplicated sets, records over the limit), prepared as
    the combiner does: every request's seqno, error, journal before-images and the store agree with
    a dict applied one request at a time."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    db.create_region("u", replicated=False)
    monkeypatch.setattr(journal_records, "MAX_RECORD_BYTES", 3000)
    rnd = random.Random(7)
    model: dict[tuple, object] = {}
    seqno = 0
    for _ in range(300):
        kinds = rnd.choice([(SET,), (SET,), (SET, KILL, ZKILL)])  # all sets: the one-query path
        txs = []
        for _ in range(rnd.randint(1, 8)):
            ops = []
            for _ in range(rnd.randint(1, 4)):
                op, region = rnd.choice(kinds), rnd.choice("rru")
                key = (rnd.randint(0, 5),) if rnd.random() < 0.7 else (rnd.randint(0, 5), rnd.randint(0, 2))
                val = "x" * 4000 if rnd.random() < 0.05 else rnd.randint(0, 10**6)
                ops.append((op, region, key, val if op == SET else None))
            txs.append(ops)
        batch = _requests(*txs)
        _prepare(db, batch)
        for r, ops in zip(batch, txs):
            too_big = any(op == SET and region == "r" and isinstance(v, str) for op, region, _, v in ops)
            if too_big:
                assert isinstance(r.error, TransactionError) and r.seqno == 0
                continue
            assert r.error is None
            befores = []
            for op, region, key, v in ops:
                if region == "r":
                    befores.append(model.get((region, key)))
                if op == SET:
                    model[(region, key)] = v
                else:
                    for k in [k for k in model if k[0] == region and k[1][: len(key)] == key]:
                        if op == KILL or k[1] == key:
                            del model[k]
            if befores:
                seqno += 1
                assert r.seqno == seqno
                (rec,) = iter_records(db.layout.journal, seqno, seqno)
                got = [u.before for u in rec.updates if u.op != KILL]
                assert got == [None if b is None else encode_value(b) for b, (op, *_) in
                               zip(befores, [o for o in ops if o[1] == "r"]) if op != KILL]
            else:
                assert r.seqno == 0
    for region in "ru":
        assert {k: v for k, v in db.items(region)} == {k[1]: v for k, v in model.items() if k[0] == region}
    db.close()


def test_a_transaction_whose_commit_failed_says_so_and_a_new_one_commits(tmp_path, monkeypatch):
    """A commit that fails (disk full) applied nothing: the transaction says it failed, not that it
    is committed, and the same updates in a new transaction commit once the disk has room."""
    for mode in ("fsync", "group"):
        root = multisite.create(tmp_path / mode, name="A", durability=mode)
        db = multisite.open(root)
        db.create_region("r")
        real = writer.write_all
        monkeypatch.setattr(writer, "write_all", lambda *a, **k: (_ for _ in ()).throw(StorageFull("simulated")))
        try:
            with db.transaction() as tx:
                tx.set("r", ("k",), 1)
        except StorageFull:
            pass
        else:
            raise AssertionError("the commit did not fail")
        monkeypatch.setattr(writer, "write_all", real)
        try:
            tx.commit()
        except TransactionError as e:
            assert "failed" in str(e), e
        else:
            raise AssertionError("a failed transaction committed on a second call")
        assert (db.get("r", ("k",)), db.seqno) == (None, 0)
        with db.transaction() as tx2:
            tx2.set("r", ("k",), 1)
        assert (db.get("r", ("k",)), db.seqno) == (1, 1)
        db.close()


def test_a_key_that_cannot_be_encoded_fails_its_own_request_only(tmp_path):
    """A string subscript that is not text (a lone surrogate) is found when the combiner encodes the
    batch's keys: that request fails with KeyTypeError, the others in the batch commit."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    batch = _requests([(SET, "r", ("a",), 1)], [(SET, "r", ("\ud800",), 2)], [(SET, "r", ("b",), 3)])
    _prepare(db, batch)
    assert [r.seqno for r in batch] == [1, 0, 2]
    assert type(batch[1].error).__name__ == "KeyTypeError" and batch[0].error is batch[2].error is None
    assert (db.get("r", ("a",)), db.get("r", ("b",))) == (1, 3)
    db.close()


def test_a_store_write_that_fails_fails_the_batch_and_leaves_no_gap(tmp_path, monkeypatch):
    """The batch's one store write failing (SQLite: disk full) fails every request of the batch and
    undoes it whole: the seqnos it took are given back, so the next commit follows on."""
    import sqlite3

    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    db.set("r", ("a",), 0)
    real = db.store.put_values

    def full(rid, values):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(db.store, "put_values", full)
    batch = _requests([(SET, "r", ("a",), 1)], [(SET, "r", ("b",), 2)])
    token, err = db._group._prepare_batch(batch)
    assert token is None and isinstance(err, sqlite3.OperationalError)
    assert [type(r.error) for r in batch] == [sqlite3.OperationalError] * 2 and db.seqno == 1
    monkeypatch.setattr(db.store, "put_values", real)
    db.set("r", ("c",), 3)
    assert (db.seqno, db.get("r", ("a",)), db.get("r", ("b",))) == (2, 0, None)
    db.close()
    with multisite.open(root) as db:
        assert [r.seqno for r in iter_records(db.layout.journal)] == [1, 2]
        assert (db.get("r", ("a",)), db.get("r", ("c",))) == (0, 3)


def test_a_transaction_being_committed_cannot_be_committed_again(tmp_path, monkeypatch):
    """A second commit() while the first runs (another thread) applied the updates twice, under a
    new seqno; it is refused."""
    root = multisite.create(tmp_path / "A", name="A")
    db = multisite.open(root)
    db.create_region("r")
    tx = db.transaction()
    with tx:
        tx.set("r", ("k",), 1)
        real = db.commit_updates
        second: list[BaseException] = []

        def commit_twice(ops, **kw):
            try:
                tx.commit()  # what another thread would do now
            except TransactionError as e:
                second.append(e)
            return real(ops, **kw)

        monkeypatch.setattr(db, "commit_updates", commit_twice)
    assert [str(e) for e in second] == ["TRANSACTION: transaction already committing; start a new one with "
                                        "db.transaction()"]
    assert [r.seqno for r in iter_records(db.layout.journal)] == [1]
    db.close()


def test_a_store_that_cannot_flush_after_commits_does_not_fail_them(tmp_path, monkeypatch):
    """The store's flush after commits that are hard in the journal failing (a full disk) made those
    commits raise: callers retrying would apply them twice. They stand; the flush is tried again."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("r")
    monkeypatch.setattr(engine_core, "STORE_FLUSH_INTERVAL_S", 0.0)
    real = db.store.flush
    monkeypatch.setattr(db.store, "flush", lambda: (_ for _ in ()).throw(StorageFull("simulated: store full")))
    with db.transaction() as tx:
        tx.set("r", ("paid",), 1)
    assert (tx.seqno, db.get("r", ("paid",))) == (1, 1)
    monkeypatch.setattr(db.store, "flush", real)
    db.set("r", ("next",), 2)
    assert db.store.flushed_seqno == 2
    db.close()
