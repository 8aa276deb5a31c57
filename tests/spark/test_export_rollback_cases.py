"""Export after rollbacks and prunes of the exported instance: what the export must retract, keep, rebuild
and protect, on real instances (``multisite.create/open``, ``rollback``, ``prune``)."""

from __future__ import annotations

import json
import time
import types

import pyarrow.parquet as pq

import multisite
import multisite.engine.core as mdb
from multisite import pipeline

DAY1_LATE = 1_700_006_399.0   # 2023-11-14 23:59:59 UTC
DAY2_EARLY = 1_700_006_401.0  # 2023-11-15 00:00:01 UTC


def _change_seqnos(lake) -> list[int]:
    files = sorted((lake / "changes").glob("commit_date=*/*.parquet"))
    return sorted(s for f in files for s in pq.read_table(f, columns=["seqno"]).column("seqno").to_pylist())


def test_retraction_keeps_rows_of_dates_it_did_not_touch(spark, tmp_path, monkeypatch):
    # One run writes rows of two commit dates; the rollback takes back only rows of the later date. The
    # earlier date's file still carries that run's name (a seqno past the rollback point), which a later
    # run took for a file of an unpublished run and deleted.
    clock = [DAY1_LATE]
    monkeypatch.setattr(mdb, "time", types.SimpleNamespace(time=lambda: clock[0], perf_counter=time.perf_counter,
                                                           monotonic=time.monotonic))
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        db.set("r", ("a",), 1)
        db.set("r", ("b",), 2)
        clock[0] = DAY2_EARLY
        db.set("r", ("c",), 3)
        db.set("r", ("d",), 4)
    lake = tmp_path / "lake"
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 4
    with multisite.open(root) as db:
        db.rollback(2)
    rep = pipeline.export(str(root), str(lake), spark=spark)
    assert (rep.retracted_from, rep.to_seqno) == (2, 2)
    assert _change_seqnos(lake) == [1, 2]
    rep = pipeline.export(str(root), str(lake), spark=spark)  # nothing new: must leave the table alone
    assert rep.to_seqno == 2
    assert _change_seqnos(lake) == [1, 2]
    with multisite.open(root) as db:
        db.set("r", ("e",), 5)
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 3
    assert _change_seqnos(lake) == [1, 2, 3]


def _lake_state(spark, path) -> dict:
    return {r.key_text: json.loads(r.value) for r in spark.read.parquet(str(path)).collect()}


def _instance_state(root) -> dict:
    from multisite.keys import key_text

    with multisite.open(root) as db:
        return {key_text(k): v for k, v in db.items("r")}


def test_rollback_into_the_base_of_a_pruned_export_rebuilds_it(spark, tmp_path):
    # The journal is pruned, so the export starts from the instance's state at P (its base); a rollback to
    # k < P takes back transactions folded into that base, which no retraction can take out: the export must
    # notice (it recorded nothing to compare before) and start over from the instance's state.
    from multisite.instance.maintenance import prune

    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(1, 61):
            db.set("r", ("k", i % 7), {"v": i, "pad": "x" * 100})
    assert prune(root, 40).kept_from_seqno <= 50
    lake = tmp_path / "lake"
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 60  # base at 60
    with multisite.open(root) as db:
        for i in range(61, 64):
            db.set("r", ("k", i % 7), {"v": i})
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 63  # changes 61..63
    with multisite.open(root) as db:
        db.rollback(50)
        for i in range(51, 54):
            db.set("r", ("k", i % 7), {"v": -i})
    rep = pipeline.export(str(root), str(lake), spark=spark)
    assert rep.retracted_from == 50 and rep.to_seqno == 53
    assert _lake_state(spark, lake / "state") == _instance_state(root)
    assert _change_seqnos(lake) == []  # the change table starts again after the new base
    retracted = spark.read.parquet(str(lake / "retracted"))
    assert sorted(r.seqno for r in retracted.collect()) == [61, 62, 63]
    with multisite.open(root) as db:
        db.set("r", ("k", 100), {"v": 100})
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 54
    assert _lake_state(spark, lake / "state") == _instance_state(root)
    assert _change_seqnos(lake) == [54]


def test_prune_keeps_what_the_export_has_not_exported(spark, tmp_path):
    from multisite.instance.maintenance import prune

    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(1, 21):
            db.set("r", ("k", i), "x" * 50)
    lake = tmp_path / "lake"
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 20
    with multisite.open(root) as db:
        for i in range(21, 300):
            db.set("r", ("k", i), "x" * 50)
    rep = prune(root, 300)
    assert rep.kept_from_seqno <= 21
    assert rep.limit_seqno == 21 and "export-" in rep.reason, rep.reason
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 299
    assert _change_seqnos(lake) == list(range(1, 300))
    assert prune(root, 300).kept_from_seqno > 21  # the export's new position releases what it consumed


def test_a_second_retraction_of_the_same_export(spark, tmp_path):
    # The manifest's run list holds a "retracted_after" entry after the first retraction; publishing the
    # second one filtered that list by each entry's "to" and failed, after its intent was written, so
    # every later run failed again in _tidy.
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(1, 7):
            db.set("r", ("k", i % 3), i)
    lake = tmp_path / "lake"
    assert pipeline.export(str(root), str(lake), spark=spark).to_seqno == 6
    for k in (5, 3):
        with multisite.open(root) as db:
            db.rollback(k)
        rep = pipeline.export(str(root), str(lake), spark=spark)
        assert (rep.retracted_from, rep.to_seqno) == (k, k)
        assert _lake_state(spark, lake / "state") == _instance_state(root)
    assert _change_seqnos(lake) == [1, 2, 3]
    runs = json.loads((lake / "_multisite" / "export.json").read_text())["runs"]
    assert runs[-1]["retracted_after"] == 3


def _random_txns(rnd, n: int) -> list:
    heads = ["a", "b", 1, "a,b"]
    out = []
    for _ in range(n):
        ops = []
        for _ in range(rnd.randint(1, 4)):
            key = tuple([rnd.choice(heads)] + [rnd.randrange(4) for _ in range(rnd.choice([0, 1, 1, 2]))])
            r = rnd.random()
            ops.append(("kill", key[:rnd.randint(1, len(key))]) if r < 0.12 else ("zkill", key) if r < 0.2
                       else ("set", key))
        out.append(ops)
    return out


def _commit(db, ops, tag):
    with db.transaction() as tx:
        for op, key in ops:
            if op == "set":
                tx.set("r", key, tag)
            elif op == "kill":
                tx.kill("r", key)
            else:
                tx.zkill("r", key)


def test_retraction_of_kills_of_many_key_lengths_stays_small(spark, tmp_path):
    # Kills of several key-text lengths after k: the recomputation's plan multiplied its whole lineage
    # once per use (741 broadcasts, 1,310 file scans for these 40 transactions) and ran out of memory.
    import random

    rnd = random.Random(0)
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        for i, t in enumerate(_random_txns(rnd, 40)):
            _commit(db, t, f"{i}")
    lake = tmp_path / "lake"
    pipeline.export(str(root), str(lake), spark=spark)
    with multisite.open(root) as db:
        k = rnd.randint(max(1, db.seqno - 15), db.seqno - 1)
        db.rollback(k)
        for i, t in enumerate(_random_txns(rnd, rnd.randint(0, 20))):
            _commit(db, t, f"r{i}")
        last = db.seqno
    rep = pipeline.export(str(root), str(lake), spark=spark)
    assert (rep.retracted_from, rep.to_seqno) == (k, last)
    assert _lake_state(spark, lake / "state") == _instance_state(root)
    assert sorted(set(_change_seqnos(lake))) == list(range(1, last + 1))
