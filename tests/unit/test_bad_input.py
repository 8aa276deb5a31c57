"""Bad input: each case is a clear MultisiteError subclass, and nothing is written.

"Nothing written" is checked on the seqno, the store's contents and the journal's bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import multisite
from multisite import (ConfigError, InstanceExists, InstanceLocked, KeyTypeError, MultisiteError,
                       NotAnInstance, RegionNotFound, TransactionError, ValueEncodeError)


def _journal_bytes(db) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(db.layout.journal).glob("*.msj"))}


@pytest.fixture
def snap(db):
    """The state before the bad input: checked again after it."""
    db.set("acct", ("keep",), 1)
    before = (db.seqno, _journal_bytes(db), list(db.items("acct")), list(db.items("scratch")))

    def unchanged():
        assert (db.seqno, _journal_bytes(db), list(db.items("acct")), list(db.items("scratch"))) == before

    return unchanged


BAD_KEYS = ["k", 1, None, (), (1.5,), (True,), ("a", None), (b"x",), (2**63,), ("a", [1])]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_wrong_key_types(db, snap, key):
    for call in (lambda: db.set("acct", key, 1), lambda: db.kill("acct", key), lambda: db.zkill("acct", key),
                 lambda: db.get("acct", key), lambda: list(db.items("acct", stop=key or ()))):
        with pytest.raises(KeyTypeError) as ei:
            call()
        assert ei.value.code == "KEY_TYPE"
    with pytest.raises(KeyTypeError):
        with db.transaction() as tx:
            tx.set("acct", ("good",), 1)
            tx.set("acct", key, 2)
    snap()


class Opaque:
    pass


BAD_VALUES = [object(), {1, 2}, frozenset(), Opaque(), 1 + 2j, {"nested": {"deep": {3}}}, [1, object()],
              2**64, -(2**63) - 1]


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_values_that_cannot_be_stored(db, snap, value):
    with pytest.raises(ValueEncodeError) as ei:
        db.set("acct", ("v",), value)
    assert isinstance(ei.value, MultisiteError) and ei.value.code == "VALUE_ENCODE"
    with pytest.raises(ValueEncodeError):
        with db.transaction() as tx:
            tx.set("acct", ("good",), 1)
            tx.set("scratch", ("good",), 1)
            tx.set("acct", ("v",), value)
    snap()


def test_unknown_region(db, snap):
    for call in (lambda: db.set("nope", ("k",), 1), lambda: db.kill("nope", ("k",)),
                 lambda: db.get("nope", ("k",)), lambda: list(db.items("nope")), lambda: db.set(None, ("k",), 1)):
        with pytest.raises(RegionNotFound) as ei:
            call()
        assert "nope" in str(ei.value) or "None" in str(ei.value)
    with pytest.raises(RegionNotFound):
        with db.transaction() as tx:
            tx.set("acct", ("good",), 1)
            tx.set("nope", ("k",), 1)
    snap()


def test_nested_transaction(db, snap):
    with pytest.raises(TransactionError, match="nested"):
        with db.transaction() as tx:
            tx.set("acct", ("outer",), 1)
            with db.transaction() as inner:
                inner.set("acct", ("inner",), 1)
    snap()
    with db.transaction() as tx:  # the handle is usable again afterwards
        tx.set("acct", ("after",), 1)
    assert db.get("acct", ("after",)) == 1


def test_transaction_misuse(db, snap):
    tx = db.transaction()
    with pytest.raises(TransactionError):
        tx.set("acct", ("k",), 1)  # not entered
    with db.transaction() as tx:
        pass
    with pytest.raises(TransactionError):
        tx.set("acct", ("k",), 1)  # already committed
    snap()


def test_writes_after_close(tmp_path):
    root = multisite.create(tmp_path / "A", name="A")
    db = multisite.open(root)
    db.create_region("acct")
    db.set("acct", ("k",), 1)
    tx = db.transaction().__enter__()
    tx.set("acct", ("k",), 3)
    db.close()  # with a transaction still open: it can no longer commit
    journal = {p.name: p.read_bytes() for p in (root / "journal").glob("*.msj")}
    for call in (lambda: db.get("acct", ("k",)), lambda: db.create_region("other"), lambda: db.flush()):
        with pytest.raises(TransactionError, match="closed"):
            call()
    with pytest.raises(TransactionError, match="closed"):
        tx.__exit__(None, None, None)
    for call in (lambda: db.set("acct", ("k",), 2), lambda: db.transaction().__enter__()):
        with pytest.raises(TransactionError, match="closed"):
            call()
    db.close()  # closing twice is harmless
    assert {p.name: p.read_bytes() for p in (root / "journal").glob("*.msj")} == journal
    with multisite.open(root) as again:
        assert again.seqno == 1 and again.get("acct", ("k",)) == 1


def test_a_directory_that_is_not_an_instance(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "file.txt").write_text("hello")
    for target in (tmp_path / "plain", tmp_path / "missing", tmp_path / "plain" / "file.txt"):
        with pytest.raises(NotAnInstance) as ei:
            multisite.open(target)
        assert str(target.name) in str(ei.value)
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["file.txt"]  # nothing created
    assert not (tmp_path / "missing").exists()


def test_create_refuses_existing_instances_and_bad_settings(tmp_path, inst):
    with pytest.raises(InstanceExists):
        multisite.create(inst, name="B")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(InstanceExists):
        multisite.create(tmp_path / "busy", name="B")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(InstanceExists, match="is a file"):
        multisite.create(tmp_path / "a-file", name="B")
    with pytest.raises(NotAnInstance, match="is a file"):
        multisite.open(tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "x"
    for kwargs in ({"name": ""}, {"name": "a b"}, {"name": "a/b"}, {"name": "ok", "durability": "maybe"}):
        with pytest.raises(ConfigError):
            multisite.create(tmp_path / "new", **kwargs)
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError):
        multisite.open(inst, durability="sometimes")


def test_the_lock_is_per_process_not_per_handle(inst):
    # flock is per open file description: a second handle in the same process must be refused too.
    with multisite.open(inst):
        with pytest.raises(InstanceLocked) as ei:
            multisite.open(inst)
        assert str(os.getpid()) in str(ei.value)


def test_a_transaction_too_large_to_journal_is_refused(db, snap, monkeypatch):
    from multisite.journal import records

    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 8192)  # the same rule, at a testable size
    with pytest.raises(MultisiteError):
        db.set("acct", ("big",), "x" * 20_000)
    snap()
