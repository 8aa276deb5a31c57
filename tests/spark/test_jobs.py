"""Each pipeline against small instances built by the engine with known content."""

from __future__ import annotations

import json
import shutil

import multisite
import multisite.values
from conftest import KNOWN, build, commit
from multisite.testing.builders import state_of
from multisite import pipeline
from multisite.journal.reader import iter_records


def parquet_state(spark, path):
    return {(r.region, r.key_text): json.loads(r.value) for r in spark.read.parquet(str(path)).collect()}


def expected_state(root):
    from multisite.keys import key_text

    return {(r, key_text(k)): v for (r, k), v in state_of(root).items()}


def test_snapshot_seed_and_catch_up(spark, tmp_path, known):
    full = expected_state(known)
    rep = pipeline.snapshot(str(known), str(tmp_path / "snap"), spark=spark)
    assert rep.seqno == 5 and parquet_state(spark, tmp_path / "snap" / "state") == full
    # at an earlier seqno: folded from the journal
    pipeline.snapshot(str(known), str(tmp_path / "snap3"), at=3, spark=spark)
    assert parquet_state(spark, tmp_path / "snap3" / "state") == {
        ("acct", '("a",1)'): {"owner": "ann", "n": 10}, ("acct", '("a",2)'): {"owner": "bob", "n": 2},
        ("acct", '("b")'): {"owner": 7, "n": "x"}}
    # seed at 3, then catch up from 4 as a Source Server would: same state as the source
    seeded = pipeline.seed(str(tmp_path / "snap3"), str(tmp_path / "C"), name="C")
    assert seeded.seqno == 3 and seeded.keys == 3
    with multisite.open(seeded.path) as db:
        assert db.seqno == 3 and db.role == "secondary"
        for rec in iter_records(known / "journal", 4):
            db.apply_record(rec)
        assert db.seqno == 5
    assert state_of(seeded.path) == state_of(known)


def test_verify_equal_and_planted_difference(spark, tmp_path, known):
    twin = build(tmp_path / "B", "B", KNOWN)
    rep = pipeline.verify(str(known), str(twin), spark=spark, engine="spark")
    assert rep.equal and rep.keys_a == rep.keys_b == 3
    with multisite.open(twin) as db:  # plant: one changed value, one extra key, one missing key
        db.store.put(db.store.regions["acct"].id, multisite.keys.encode_key(("a", 3)),
                     multisite.values.encode_value({"owner": "zz", "n": 3}))
        db.store.put(db.store.regions["log"].id, multisite.keys.encode_key(("new",)),
                     multisite.values.encode_value(1))
        db.store.delete(db.store.regions["log"].id, multisite.keys.encode_key(("x", 2)))
        db.store.flush()
    rep = pipeline.verify(str(known), str(twin), out=str(tmp_path / "diff"), spark=spark, engine="spark")
    assert not rep.equal
    assert (rep.different, rep.missing_in_a, rep.missing_in_b) == (1, 1, 1)
    diffs = {(r.difference, r.key_text) for r in spark.read.parquet(str(tmp_path / "diff")).collect()}
    assert diffs == {("different", '("a",3)'), ("missing_in_a", '("new")'), ("missing_in_b", '("x",2)')}
    # a snapshot compares with an instance at the snapshot's seqno
    pipeline.snapshot(str(known), str(tmp_path / "s"), spark=spark)
    assert pipeline.verify(str(tmp_path / "s"), str(known), spark=spark, engine="spark").equal


def test_fold_gives_the_same_state_as_replaying(spark, tmp_path):
    txns = [[("set", "acct", ("a", i % 7), {"owner": "o", "n": i}), ("set", "log", (i % 5, "x"), i)]
            for i in range(40)]
    txns[10].append(("kill", "log", (1,), None))
    txns[20].append(("kill", "acct", ("a",), None))
    txns[21].append(("zkill", "log", (2, "x"), None))
    txns[30].append(("set", "log", (1, "y", 3), "deep"))
    txns[35].append(("kill", "log", (1, "y"), None))
    src = build(tmp_path / "S", "S", txns)
    rep_root = multisite.create(tmp_path / "R", name="R", durability="none")
    with multisite.open(rep_root) as db:
        for rec in iter_records(src / "journal", 1, 8):
            db.apply_record(rec)
    rep = pipeline.fold(str(src), str(rep_root), spark=spark)
    total = sum(1 for _ in iter_records(src / "journal", 1))
    assert (rep.from_seqno, rep.to_seqno) == (9, total)
    assert state_of(rep_root) == state_of(src)
    with multisite.open(rep_root) as db:  # it opens consistent at T and takes the next transaction
        assert db.seqno == total
        commit(db, [("set", "log", ("after",), 1)])
        assert db.seqno == total + 1


def test_export_incremental_and_rollback_retracts_exactly_the_rolled_off(spark, tmp_path):
    txns = [[("set", "acct", ("a", i % 4), {"owner": "o", "n": i}), ("set", "log", (i,), i)] for i in range(12)]
    txns[6].append(("kill", "acct", ("a",), None))
    x = build(tmp_path / "X", "X", txns)
    out = tmp_path / "lake"
    rep = pipeline.export(str(x), str(out), spark=spark)
    assert (rep.from_seqno, rep.to_seqno, rep.transactions) == (1, 12, 12)
    assert parquet_state(spark, out / "state") == expected_state(x)
    # incremental
    with multisite.open(x) as db:
        for i in range(12, 15):
            commit(db, [("set", "log", (i,), i), ("zkill", "log", (0,), None)])
    rep = pipeline.export(str(x), str(out), spark=spark)
    assert (rep.from_seqno, rep.to_seqno, rep.transactions) == (13, 15, 3)
    assert parquet_state(spark, out / "state") == expected_state(x)
    ch = spark.read.parquet(str(out / "changes"))
    assert ch.select("seqno").distinct().count() == 15 and "commit_date" in ch.columns
    # rollback: a copy whose journal diverges after k=9, swapped in place of X
    k = 9
    y = multisite.create(tmp_path / "Y", name="X", durability="none")
    with multisite.open(y) as db:
        db.create_region("acct", schema='{"owner": "string", "n": "long"}')
        db.create_region("log")
        for rec in iter_records(x / "journal", 1, k):
            db.apply_record(rec)
        commit(db, [("set", "acct", ("a", 1), {"owner": "new", "n": 100}), ("kill", "log", (3,), None)])
        commit(db, [("set", "acct", ("z",), {"owner": "z", "n": 1})])
    shutil.rmtree(x)
    shutil.move(str(y), str(x))
    rep = pipeline.export(str(x), str(out), spark=spark)
    assert rep.retracted_from == k and rep.retracted_transactions == 15 - k
    assert rep.to_seqno == k + 2
    retracted = sorted(r.seqno for r in spark.read.parquet(str(out / "retracted")).collect())
    assert retracted == list(range(k + 1, 16))
    ch = spark.read.parquet(str(out / "changes"))
    assert sorted(r.seqno for r in ch.select("seqno").distinct().collect()) == list(range(1, k + 3))
    assert parquet_state(spark, out / "state") == expected_state(x)
    # nothing new: a no-op run
    rep = pipeline.export(str(x), str(out), spark=spark)
    assert rep.retracted_from is None and rep.transactions == 0
