"""The journal as a Spark data source: columns, filters, segments, shards, corruption, streaming."""

from __future__ import annotations

import json

import pytest

import multisite
from conftest import KNOWN, build, commit


def rows(spark, path, **opts):
    r = spark.read.format("multisite")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(str(path)).orderBy("seqno", "ord").collect()


def test_every_column(spark, known):
    out = rows(spark, known)
    assert len(out) == sum(len(t) for t in KNOWN)
    first = out[0]
    assert (first.instance, first.seqno, first.stream, first.stream_seqno, first.origin) == ("A", 1, 0, 1, "A")
    assert first.commit_time is not None and first.ord == 0
    assert (first.region, first.op, first.key_text) == ("acct", "set", '("a",1)')
    assert [(p.i, p.s) for p in first.key] == [(None, "a"), (1, None)]
    assert json.loads(first.value) == {"owner": "ann", "n": 1} and first.before is None
    assert first.value_size == len(first.value_raw) > 0
    assert (first.fields.owner, first.fields.n) == ("ann", 1)
    bad = [r for r in out if r.key_text == '("b")'][0]
    assert bad.fields.owner is None and bad.fields.n is None  # wrong types give NULL, JSON keeps all
    log = [r for r in out if r.region == "log" and r.seqno == 1][0]
    assert log.fields is None or (log.fields.owner is None and log.fields.n is None)
    upd = [r for r in out if r.seqno == 3 and r.region == "acct"][0]
    assert json.loads(upd.before) == {"owner": "ann", "n": 1}
    zk = [r for r in out if r.op == "zkill"][0]
    assert zk.value is None and json.loads(zk.before) == "one"
    kill = [r for r in out if r.op == "kill"][0]
    assert kill.key_text == '("a")'
    assert sorted(k for k, _ in json.loads(kill.before)) == [["a", 1], ["a", 2]]


def test_filters_and_options(spark, known):
    df = spark.read.format("multisite").load(str(known))
    assert df.where("seqno >= 2 and seqno < 4").select("seqno").distinct().count() == 2
    assert df.where("seqno = 5").count() == 2
    assert df.where("region = 'log'").count() == 3
    assert df.where("region in ('log') and seqno > 3").count() == 1
    assert len(rows(spark, known, from_seqno=4)) == 3
    assert len(rows(spark, known, to_seqno=2, regions="acct")) == 3
    assert all(r.region == "log" for r in rows(spark, known, regions="log"))


def test_narrow_schema_builds_only_those_columns(spark, known):
    df = spark.read.format("multisite").schema("region string, value_size int, key_bytes binary").load(str(known))
    got = df.groupBy("region").count().orderBy("region").collect()
    assert [(r.region, r["count"]) for r in got] == [("acct", 6), ("log", 3)]
    with pytest.raises(Exception, match="unknown column"):
        spark.read.format("multisite").schema("nope string").load(str(known)).collect()


def test_many_segments_and_chunks(spark, tmp_path):
    txns = [[("set", "log", (i, j), "v" * 40) for j in range(5)] for i in range(300)]
    root = build(tmp_path / "S", "S", txns, segment_bytes=8192)
    assert len(list((root / "journal").glob("*.msj"))) > 5
    df = spark.read.format("multisite").option("chunk_bytes", 3000).load(str(root))
    assert df.rdd.getNumPartitions() > 10
    got = df.select("seqno", "ord").collect()
    assert len(got) == 1500 and len(set(got)) == 1500
    assert {r.seqno for r in got} == set(range(1, 301))


def test_several_instances_in_one_read(spark, tmp_path):
    a = build(tmp_path / "A", "A", KNOWN)
    b = build(tmp_path / "B", "B", KNOWN[:2])
    df = spark.read.format("multisite").load([str(a), str(b)])
    counts = {r.instance: r["count"] for r in df.groupBy("instance").count().collect()}
    assert counts == {"A": 9, "B": 4}
    assert df.where("instance = 'B'").count() == 4


def test_corrupt_segment_names_file_and_offset(spark, tmp_path):
    txns = [[("set", "log", (i,), "v" * 100)] for i in range(50)]
    root = build(tmp_path / "C", "C", txns, segment_bytes=4096)
    seg = sorted((root / "journal").glob("*.msj"))[0]
    data = bytearray(seg.read_bytes())
    off = 64 + 3 * (len(data) - 64) // 4
    data[off] ^= 0xFF  # inside some payload of a sealed segment
    seg.write_bytes(bytes(data))
    with pytest.raises(Exception) as e:
        spark.read.format("multisite").load(str(root)).count()
    assert "JOURNAL_CORRUPT" in str(e.value) and str(seg) in str(e.value) and "offset" in str(e.value)


def test_stream_restarts_from_checkpoint_exactly_once(spark, tmp_path):
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 21)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run():
        q = (spark.readStream.format("multisite").option("consumer", "test1")
             .option("max_transactions_per_batch", 7).load(str(root))
             .select("seqno", "key_text").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        return q

    run()
    assert sorted(r.seqno for r in spark.read.parquet(str(out)).collect()) == list(range(1, 21))
    with multisite.open(root) as db:
        for i in range(21, 31):
            commit(db, [("set", "log", (i,), i)])
    run()
    got = sorted(r.seqno for r in spark.read.parquet(str(out)).collect())
    assert got == list(range(1, 31))  # no duplicates, no gaps
    from multisite.instance import consumers
    from multisite.instance.layout import Layout

    pos = {p.name: p.last_confirmed for p in consumers.load_all(Layout.existing(root))}
    # Spark tells the source a batch is done when it plans the next one: the position lags by at
    # most one batch, never runs ahead of what was written.
    assert 20 < pos["test1"] <= 30


def test_a_live_preallocated_journal_reads_to_its_last_record(spark, tmp_path):
    """An open fsync-mode instance: its newest segment ends in preallocated zeros, which the source
    (planning, decoding, the index) takes as the end of the records, read after read."""
    root = multisite.create(tmp_path / "L", name="L", durability="fsync")
    with multisite.open(root) as db:
        db.create_region("log")
        for i in range(50):
            db.set("log", (i,), "v" * 30)
        (seg,) = (root / "journal").glob("*.msj")
        assert seg.read_bytes()[-1024:] == bytes(1024)  # zeros after the records
        for n in (50, 80):
            got = spark.read.format("multisite").option("index", "auto").load(str(root)).select("seqno").collect()
            assert sorted(r.seqno for r in got) == list(range(1, n + 1))
            for i in range(50, 80):
                db.set("log", (i,), "v" * 30)
