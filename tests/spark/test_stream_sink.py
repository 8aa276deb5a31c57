"""A stream of the journal into a Parquet change table through ``pipeline.change_sink``: the same
rows as a batch read of the journal, each once across a restart from the checkpoint."""

from __future__ import annotations

import pyarrow.parquet as pq

import multisite
from conftest import build, commit
from multisite import pipeline

COLS = ["seqno", "ord", "op", "region", "key_text", "value", "commit_time"]


def _run(spark, root, table, ckpt):
    q = (spark.readStream.format("multisite").option("consumer", "sinktest")
         .option("max_transactions_per_batch", 7).load(str(root)).select(*COLS)
         .writeStream.foreachBatch(pipeline.change_sink(table)).option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None


def _sorted(rows):
    return sorted(rows, key=lambda r: (r["seqno"], r["ord"]))


def test_a_stream_through_change_sink_gives_the_batch_reads_rows_once_across_a_restart(spark, tmp_path):
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), {"n": i}), ("kill", "log", (i - 1,), None)]
                                      for i in range(1, 21)])
    table, ckpt = tmp_path / "changes", tmp_path / "ckpt"
    _run(spark, root, table, ckpt)
    with multisite.open(root) as db:
        for i in range(21, 31):
            commit(db, [("set", "log", (i,), {"n": i})])
    _run(spark, root, table, ckpt)
    got = pq.read_table(table).select(COLS).to_pylist()
    want = spark.read.format("multisite").load(str(root)).select(*COLS).toArrow().to_pylist()
    assert len(got) == len(want) == 50
    assert _sorted(got) == _sorted(want)
    batches = sorted(p.name for p in table.iterdir())
    assert len(batches) == 5 and batches[0] == "batch=00000000"  # 7 transactions per batch: 30 in 5
