"""The engine's API on real instance directories: updates, reads in key order, what the journal holds."""

from __future__ import annotations

import datetime
import decimal
import uuid

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multisite
from multisite.errors import StoreCorrupt, TransactionError
from multisite.journal.reader import iter_records
from multisite.journal.records import KILL, SET, ZKILL


def _enc(v):
    return msgspec.msgpack.encode(v)


def test_set_get_kill_zkill(db):
    with db.transaction() as tx:
        tx.set("acct", ("a", 1), {"n": 1})
        tx.set("acct", ("a", 1, "x"), "child")
        tx.set("acct", ("b",), 2)
        tx.set("acct", ("b", 1), 3)
        tx.set("acct", ("c", 2), 4)
    assert tx.seqno == db.seqno == 1
    assert db.get("acct", ("a", 1)) == {"n": 1}
    assert db.get("acct", ("nope",)) is None
    s = db.kill("acct", ("b",))
    assert s == 2
    assert db.get("acct", ("b",)) is None and db.get("acct", ("b", 1)) is None
    db.zkill("acct", ("a", 1))  # the node alone: its child stays
    assert db.get("acct", ("a", 1)) is None and db.get("acct", ("a", 1, "x")) == "child"
    assert db.seqno == 3


def test_items_in_key_order_with_bounds(db):
    keys = [("b",), ("a", "z"), ("a", 2), ("a",), (5,), ("a", 10), ("a", 2, 1), ("c", "")]
    with db.transaction() as tx:
        for i, k in enumerate(keys):
            tx.set("acct", k, i)
    got = [k for k, _ in db.items("acct")]
    assert got == [(5,), ("a",), ("a", 2), ("a", 2, 1), ("a", 10), ("a", "z"), ("b",), ("c", "")]
    assert [k for k, _ in db.items("acct", start=("a", 2), stop=("b",))] == [
        ("a", 2), ("a", 2, 1), ("a", 10), ("a", "z")]
    assert dict(db.items("acct"))[("a", 10)] == keys.index(("a", 10))


def test_items_pages_through_many_keys(db):
    with db.transaction() as tx:
        for i in range(2500):
            tx.set("acct", ("k", i), i)
    got = list(db.items("acct", batch=100))
    assert [k for k, _ in got] == [("k", i) for i in range(2500)]
    assert [k for k, _ in db.items("acct", start=("k", 1234), stop=("k", 1300), batch=7)] == [
        ("k", i) for i in range(1234, 1300)]


def test_one_seqno_per_transaction_and_none_for_unreplicated(db):
    with db.transaction() as tx:
        tx.set("acct", ("x",), 1)
        tx.set("scratch", ("y",), 2)
        tx.kill("acct", ("nothing-here",))
    assert db.seqno == tx.seqno == 1
    assert db.set("scratch", ("z",), 3) == 0
    assert db.seqno == 1
    with db.transaction():
        pass  # empty: nothing journaled
    assert db.seqno == 1
    recs = list(iter_records(db.layout.journal))
    assert [r.seqno for r in recs] == [1]
    assert {u.region for u in recs[0].updates} == {"acct"}  # unreplicated updates are not journaled
    assert db.get("scratch", ("y",)) == 2


def test_journal_records_hold_before_images(db):
    db.set("acct", ("a",), "v1")
    db.set("acct", ("a", 1), "child")
    with db.transaction() as tx:
        tx.set("acct", ("a",), "v2")
        tx.set("acct", ("a",), "v3")  # the second set's before-image is the first set's value
        tx.zkill("acct", ("missing",))
    db.kill("acct", ("a",))
    recs = {r.seqno: r for r in iter_records(db.layout.journal)}
    u3 = recs[3].updates
    assert [(u.op, u.key, u.value, u.before) for u in u3] == [
        (SET, ("a",), _enc("v2"), _enc("v1")), (SET, ("a",), _enc("v3"), _enc("v2")),
        (ZKILL, ("missing",), None, None)]
    (k,) = recs[4].updates
    assert k.op == KILL and [(tuple(kk), v) for kk, v in k.killed] == [(("a",), _enc("v3")),
                                                                        (("a", 1), _enc("child"))]
    assert all(r.origin == "A" and r.stream == 0 and r.stream_seqno == r.seqno for r in recs.values())


def test_aborted_transaction_leaves_nothing(db):
    db.set("acct", ("keep",), 1)
    with pytest.raises(ZeroDivisionError):
        with db.transaction() as tx:
            tx.set("acct", ("gone",), 1)
            tx.kill("acct", ("keep",))
            1 / 0
    assert db.seqno == 1 and db.get("acct", ("gone",)) is None and db.get("acct", ("keep",)) == 1
    assert tx.seqno == 0


def test_state_survives_close_and_reopen(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("acct")
        db.create_region("local", replicated=False)
        for i in range(200):
            db.set("acct", ("k", i), {"i": i, "pad": "p" * 50})
        db.set("local", ("x",), 1)
    assert len(list((root / "journal").glob("*.msj"))) > 1  # the journal switched segments
    with multisite.open(root) as db:
        assert db.seqno == 200
        assert db.regions() == {"acct": True, "local": False}
        assert db.get("acct", ("k", 199)) == {"i": 199, "pad": "p" * 50}
        assert db.get("local", ("x",)) == 1
        assert db.recovery.replayed == 0 and db.recovery.torn_bytes == 0
        assert [r.seqno for r in iter_records(db.layout.journal)] == list(range(1, 201))


def test_create_region_twice_is_idempotent_but_not_with_another_kind(db):
    db.create_region("acct")
    with pytest.raises(multisite.ConfigError):
        db.create_region("acct", replicated=False)


@pytest.mark.parametrize("mode", ["fsync", "group", "none"])
def test_every_durability_mode_commits(tmp_path, mode):
    import threading

    root = multisite.create(tmp_path / mode, name="A", durability=mode)
    with multisite.open(root) as db:
        db.create_region("r")

        def work(t):
            for i in range(50):
                db.set("r", (t, i), i)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert db.seqno == 200
        assert len(list(db.items("r"))) == 200
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 201))


DOCS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5) | st.integers(-9, 9), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DOCS)
def test_documents_read_back_as_written(db, value):
    db.set("acct", ("doc",), value)
    assert db.get("acct", ("doc",)) == value


def test_tuples_and_enum_subclasses_are_documents(db):
    import enum

    class Colour(enum.IntEnum):
        RED = 1

    db.set("acct", ("t",), {"pair": (1, "a"), "c": Colour.RED, "b": bytearray(b"xy")})
    assert db.get("acct", ("t",)) == {"pair": [1, "a"], "c": 1, "b": b"xy"}


@pytest.mark.parametrize("value", [datetime.datetime(2024, 1, 1), decimal.Decimal("1.5"), uuid.UUID(int=1)],
                         ids=repr)
def test_values_that_would_read_back_as_strings_are_refused(db, value):
    with pytest.raises(multisite.ValueEncodeError):
        db.set("acct", ("x",), {"v": value})


@pytest.mark.parametrize("n", [2, 3, 100, 255, 256, 257, 700])
def test_bulk_writes_keep_the_last_value_of_each_key_at_any_size(tmp_path, n):
    """Multi-row INSERTs come in power-of-two chunks; a key written twice in one call keeps the last."""
    from multisite.store.sqlite import Store

    st = Store(tmp_path / "store.sqlite")
    rid = st.create_region("r", True).id
    rows = [(b"k%04d" % (i % (n - 1) if n > 2 else i), b"v%d" % i) for i in range(n)]
    st.put_many(rid, rows)
    want = {}
    for k, v in rows:
        want[k] = v
    assert dict(st.page(rid, b"", None, 10_000)) == want
    st.put_rows([(rid, k, v + b"!") for k, v in rows])
    assert dict(st.page(rid, b"", None, 10_000)) == {k: v + b"!" for k, v in want.items()}
    st.close()


def test_an_update_that_is_not_set_kill_or_zkill_is_refused_and_changes_nothing(db):
    """The engine's own commit path checks the opcode: any other value was applied as a zkill."""
    db.set("acct", ("k",), 1)
    for op in (99, 0, "1", None):
        with pytest.raises(TransactionError, match="not one of set"):
            db.commit_updates([(op, "acct", ("k",), None)])
    assert (db.get("acct", ("k",)), db.seqno) == (1, 1)


def test_a_damaged_store_is_a_clear_error_and_a_store_moved_aside_is_rebuilt_from_the_journal(tmp_path):
    root = multisite.create(tmp_path / "A", name="A")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(50):
            db.set("acct", ("k", i), i)
    store = root / "db" / "store.sqlite"
    journal = {p.name: p.read_bytes() for p in (root / "journal").iterdir() if p.is_file()}
    store.write_bytes(b"not a database, " * 4096)
    for p in root.glob("db/store.sqlite-*"):
        p.unlink()
    with pytest.raises(StoreCorrupt, match="store.sqlite cannot be read.*move it"):
        multisite.open(root)
    assert {p.name: p.read_bytes() for p in (root / "journal").iterdir() if p.is_file()} == journal
    store.rename(tmp_path / "store-aside")
    with multisite.open(root) as db:  # the lock was let go; the store is rebuilt from the journal
        assert (db.seqno, db.recovery.replayed, db.get("acct", ("k", 49))) == (50, 50, 49)


def test_an_open_that_fails_half_way_leaves_no_file_open(tmp_path, monkeypatch):
    """An open that fails after its journal and store were opened (here: finishing an interrupted
    rollback) closes both, commits nothing to the store and releases the lock."""
    import os

    from multisite.engine import rollback as engine_rollback

    root = multisite.create(tmp_path / "A", name="A")
    with multisite.open(root) as db:
        db.create_region("r")
        db.set("r", ("k",), 1)

    def opened() -> list[str]:
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return sorted(p for p in fds if p.startswith(str(root)))

    before = opened()

    def fails(core):
        raise OSError("disk gone")

    monkeypatch.setattr(engine_rollback, "finish_interrupted", fails)
    with pytest.raises(OSError, match="disk gone"):
        multisite.open(root)
    assert opened() == before
    monkeypatch.undo()
    with multisite.open(root) as db:
        assert db.get("r", ("k",)) == 1
