"""Edge cases of fold, snapshot and verify on a real SparkSession, on small instances built by the real engine.

The cases that must be refused before Spark is used are in tests/unit/test_fold.py."""

from __future__ import annotations

import pytest

import multisite
from multisite import pipeline
from multisite.errors import HistoryMismatch
from multisite.journal.reader import iter_records
from multisite.testing.builders import numbered, replica_of, rewrite_after, state_of





def test_fold_compares_history_records_of_a_seeded_replica(spark, tmp_path):
    # a seeded (or folded) replica holds no journal below its seqno: its history records are compared
    a = numbered(tmp_path / "A", "A", 10)
    pipeline.snapshot(str(a), str(tmp_path / "snap"), at=10, spark=spark)
    b = pipeline.seed(str(tmp_path / "snap"), str(tmp_path / "B"), name="B").path
    with multisite.open(a) as db:
        db.set("r", ("k", 11), "v11")
    assert pipeline.fold(str(a), str(b), spark=spark).to_seqno == 11  # same history: folded
    assert state_of(b) == state_of(a)
    rewrite_after(a, 5, 15)
    with pytest.raises(HistoryMismatch, match="replica B .* at seqno 11 .* source A.* differ from seqno 6"):
        pipeline.fold(str(a), str(b), spark=spark)
    with multisite.open(b) as db:
        assert db.seqno == 11


def test_verify_and_snapshot_leave_unreplicated_regions_out_at_every_seqno(spark, tmp_path):
    a = numbered(tmp_path / "A", "A", 10)
    b = replica_of(a, tmp_path / "B", "B", 0)
    for db_root in (a, b):
        with multisite.open(db_root) as db:
            db.create_region("scratch", replicated=False)
            db.set("scratch", ("local",), f"only on {db_root.name}")
    with multisite.open(b) as db:
        db.apply_records(list(iter_records(a / "journal", 1)))
    # 9: before A's store seqno (folded from the journal); 10: A's store seqno (read from the store)
    for at in (9, 10):
        rep = pipeline.verify(str(a), str(b), at=at, spark=spark, engine="spark")
        assert rep.equal and rep.keys_a == rep.keys_b == at, (at, rep.sample)
    pipeline.snapshot(str(a), str(tmp_path / "snap"), spark=spark)
    assert {r.region for r in spark.read.parquet(str(tmp_path / "snap" / "state")).collect()} == {"r"}
    c = pipeline.seed(str(tmp_path / "snap"), str(tmp_path / "C"), name="C").path
    with multisite.open(c) as db:  # the region is defined, its local content is not copied
        assert db.regions() == {"r": True, "scratch": False} and list(db.items("scratch")) == []


def test_state_now_of_a_pruned_instance_whose_store_moved_past_the_journal_end_read(spark, tmp_path, monkeypatch):
    # A live instance can flush its store past the journal end that state_df read just before copying
    # the store; "now" is then the store's seqno, not an earlier one only a pruned journal could give.
    from multisite.instance.maintenance import prune
    from multisite.pipeline import seeding

    a = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(a) as db:
        db.create_region("r")
        for i in range(1, 61):
            db.set("r", ("k", i % 7), "x" * 200 + str(i))
    prune(a, 50)
    first, last = seeding.ref_bounds(seeding.with_archive(str(a), None))
    assert first > 1 and last == 60
    monkeypatch.setattr(seeding, "ref_bounds", lambda ref: (first, last - 3))  # read before the flush
    df, seqno = seeding.state_df(spark, str(a))
    assert seqno == 60
    assert {(r.key_text, r.value) for r in df.collect()} == {
        (f'("k",{i % 7})', '"' + "x" * 200 + str(i) + '"') for i in range(54, 61)}
