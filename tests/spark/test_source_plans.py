"""The journal source's plans at the edges: nothing to read, a rollback under a stream, two streams
under one consumer name."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import multisite
from conftest import build, commit
from multisite.instance import consumers
from multisite.instance.layout import Layout


def test_reads_with_nothing_to_read_are_empty_not_errors(spark, tmp_path):
    """A plan with no partitions (Spark then runs one task with a partition of its own)."""
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 4)])
    empty = build(tmp_path / "E", "E")
    def src():
        return spark.read.format("multisite")

    assert src().load(str(root)).where("seqno > 100").count() == 0
    assert src().option("from_seqno", 100).load(str(root)).count() == 0
    assert src().load(str(empty)).count() == 0
    assert src().load(str(root)).where("seqno > 2").count() == 1


def _stream(spark, root, out, ckpt, consumer, starting="earliest"):
    q = (spark.readStream.format("multisite").option("consumer", consumer).option("starting", starting)
         .load(str(root))
         .select("seqno", "value").writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    except Exception:  # the query's own error is checked through q.exception()
        pass
    return q.exception()


@pytest.mark.parametrize("recommit", [True, False])
def test_a_stream_stops_with_a_clear_error_when_the_instance_rolled_back_under_it(spark, tmp_path, recommit):
    """The stream delivered 1..20; the instance rolls back to 15 (and commits new 16..25): reading on
    by seqno would skip the new 16..20. It must stop and say why, not go on silently."""
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), f"old-{i}")] for i in range(1, 21)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    assert _stream(spark, root, out, ckpt, "rb") is None
    with multisite.open(root) as db:
        db.rollback(15)
        if recommit:
            for i in range(16, 26):
                commit(db, [("set", "log", (i,), f"new-{i}")])
    err = _stream(spark, root, out, ckpt, "rb")
    assert err is not None and "rolled back under this stream" in str(err)
    assert "up to seqno 20" in str(err)
    got = sorted(r.seqno for r in spark.read.parquet(str(out)).collect())
    assert got == list(range(1, 21))  # nothing after the rollback was delivered under old offsets


def test_a_stream_goes_on_when_nothing_was_rolled_back(spark, tmp_path):
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 11)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    assert _stream(spark, root, out, ckpt, "ok") is None
    with multisite.open(root) as db:
        db.rollback(10)  # nothing to roll back: the records the stream read stay
        for i in range(11, 16):
            commit(db, [("set", "log", (i,), i)])
    assert _stream(spark, root, out, ckpt, "ok") is None
    assert sorted(r.seqno for r in spark.read.parquet(str(out)).collect()) == list(range(1, 16))


def test_a_new_stream_does_not_take_over_another_streams_consumer_position(spark, tmp_path):
    root = build(tmp_path / "A", "A", [[("set", "log", (i,), i)] for i in range(1, 11)])
    assert _stream(spark, root, tmp_path / "o1", tmp_path / "c1", "shared") is None
    err = _stream(spark, root, tmp_path / "o2", tmp_path / "c2", "shared", starting="latest")
    assert err is not None and "already keeps a position" in str(err) and "--forget shared" in str(err)
    lay = Layout.existing(root)
    assert {p.name: p.last_confirmed for p in consumers.load_all(lay)}["shared"] >= 0

    from multisite.cli.main import cli

    listed = CliRunner().invoke(cli, ["journal", "consumers", str(root), "--json"])
    assert listed.exit_code == 0 and '"shared"' in listed.output
    gone = CliRunner().invoke(cli, ["journal", "consumers", str(root), "--forget", "shared"])
    assert gone.exit_code == 0 and consumers.load_all(lay) == []
    again = CliRunner().invoke(cli, ["journal", "consumers", str(root), "--forget", "shared"])
    assert again.exit_code != 0 and "no consumer named 'shared'" in again.output
    assert _stream(spark, root, tmp_path / "o2", tmp_path / "c2", "shared", starting="latest") is None
