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


def test_pipeline_stream_cli_writes_the_change_table_and_goes_on_from_its_checkpoint(spark, tmp_path):
    import json

    from click.testing import CliRunner

    from multisite.cli.main import cli

    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 11)])
    table = tmp_path / "changes"

    def run():
        r = CliRunner().invoke(cli, ["pipeline", "stream", str(root), "--to", str(table), "--available-now",
                                     "--max-transactions-per-batch", "4", "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.output[r.output.index("{"):])

    rep = run()
    assert (rep["batches"], rep["rows"], rep["checkpoint"]) == (3, 10, str(table / "_checkpoint"))
    with multisite.open(root) as db:
        for i in range(11, 14):
            commit(db, [("set", "log", (i,), i)])
    assert run()["rows"] == 3  # the new transactions only
    got = pq.read_table(table).column("seqno").to_pylist()  # _checkpoint is skipped by readers
    assert sorted(got) == list(range(1, 14))
    from multisite.instance import consumers
    from multisite.instance.layout import Layout

    assert {p.name for p in consumers.load_all(Layout.existing(root))} == {"changes"}


def test_pipeline_stream_whose_query_dies_says_so_and_exits_non_zero(spark, tmp_path):
    """The first batch cannot be written (its directory's name is taken by a file): the query dies in
    foreachBatch, and the command says so, naming the stream and the cause, with exit status 1."""
    from click.testing import CliRunner

    from multisite.cli.main import cli

    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 6)])
    table = tmp_path / "changes"
    table.mkdir()
    (table / "batch=00000000").write_text("not a directory")
    r = CliRunner().invoke(cli, ["pipeline", "stream", str(root), "--to", str(table), "--seconds", "120", "--json"])
    assert r.exit_code == 1, r.output
    assert f"error: PIPELINE: the stream of {root} into {table} (after 0 batch(es), 0 row(s)) stopped: its query " \
           f"died:" in r.output, r.output
    assert "NotADirectoryError: [Errno 20] Not a directory" in r.output and "Traceback" not in r.output
