"""The journal index: a read through pieces gives exactly the rows of decoding the frames; pieces are
written once, never overlap, and a rollback or a changed segment makes the source decode again."""

from __future__ import annotations

import multisite
from conftest import build, commit
from multisite.instance.layout import Layout
from multisite.journal.sidecars import index_dir, list_sidecars

TXNS = ([[("set", "acct", ("a", i % 9), {"owner": f"o{i}", "n": i}), ("set", "log", (i, "e"), f"event {i}")]
         for i in range(120)]
        + [[("kill", "acct", ("a",), None), ("zkill", "log", (3, "e"), None)]]
        + [[("set", "acct", ("b", i), {"owner": i, "n": "not a number"}), ("set", "log", ("x",), [i, {"d": 1}])]
           for i in range(40)])


def rows(spark, root, schema=None, **opts):
    r = spark.read.format("multisite")
    if schema:
        r = r.schema(schema)
    for k, v in opts.items():
        r = r.option(k, v)
    return sorted((tuple(row) for row in r.load(str(root)).collect()), key=repr)


def pieces(root):
    return [s for s, _ in list_sidecars(Layout.existing(root).journal)]


def test_pieces_give_the_same_rows_as_decoding(spark, tmp_path):
    root = build(tmp_path / "A", "A", TXNS, segment_bytes=4096)
    assert len(list((root / "journal").glob("*.msj"))) > 3
    ref = rows(spark, root, index="off")
    assert not pieces(root)
    first = rows(spark, root, index_min_bytes=0, chunk_bytes=2500)  # decodes and writes pieces
    made = pieces(root)
    assert first == ref and len(made) > 3
    spans = sorted((p.segment, p.first, p.last) for p in made)
    assert all(a[2] < b[1] for a, b in zip(spans, spans[1:]))  # no two pieces cover a seqno
    assert {s for p in made for s in range(p.first, p.last + 1)} == set(range(1, len(TXNS) + 1))
    assert rows(spark, root) == ref  # every column through the pieces
    assert pieces(root) == made  # nothing written twice
    # filters and options cut pieces exactly like frames
    for opts in ({"from_seqno": 37, "to_seqno": 120}, {"regions": "acct"}, {"to_seqno": 5, "regions": "log"}):
        assert rows(spark, root, **opts) == rows(spark, root, index="off", **opts)
    df = spark.read.format("multisite").load(str(root))
    assert df.where("seqno > 100 and region = 'log'").count() == \
        spark.read.format("multisite").option("index", "off").load(str(root)).where(
            "seqno > 100 and region = 'log'").count()
    narrow = "region string, value_size int, key_bytes binary, txn_crc bigint, before_raw binary"
    assert rows(spark, root, narrow) == rows(spark, root, narrow, index="off")


def test_a_dataframe_planned_before_indexing_reads_the_pieces_its_first_run_wrote(spark, tmp_path):
    root = build(tmp_path / "A", "A", TXNS, segment_bytes=4096)
    df = spark.read.format("multisite").option("index_min_bytes", 0).load(str(root))
    n = df.count()
    inodes = {p.name: p.stat().st_ino for _, p in list_sidecars(Layout.existing(root).journal)}
    assert inodes
    assert df.count() == n  # the same plan: its chunks said "decode and write a piece"
    assert {p.name: p.stat().st_ino for _, p in list_sidecars(Layout.existing(root).journal)} == inodes


def test_rollback_and_changed_segments_send_the_source_back_to_the_frames(spark, tmp_path):
    root = build(tmp_path / "A", "A", TXNS, segment_bytes=4096)
    rows(spark, root, index_min_bytes=0)
    before = pieces(root)
    with multisite.open(root) as db:
        db.rollback(100)
        for i in range(5):
            commit(db, [("set", "log", ("after", i), i)])
    left = pieces(root)
    assert left and all(p.last <= 100 for p in left) and len(left) < len(before)
    assert rows(spark, root) == rows(spark, root, index="off")
    assert max(r[1] for r in rows(spark, root, "region string, seqno bigint")) == 105
    # a piece whose frames changed without a rollback (here: the segment re-created) is ignored
    seg = sorted((root / "journal").glob("*.msj"))[0]
    data = bytearray(seg.read_bytes())
    data[56:64] = b"\x01" * 8  # the header's padding: same frames, another header CRC
    seg.write_bytes(bytes(data))
    stale = [p for p in pieces(root) if p.segment == 1]
    assert stale
    got = rows(spark, root, index="read")
    assert got == rows(spark, root, index="off")


def test_a_stream_polling_the_open_segment_leaves_no_pieces(spark, tmp_path):
    root = build(tmp_path / "A", "A", TXNS[:20])
    assert spark.read.format("multisite").load(str(root)).count() == 40
    assert not index_dir(root / "journal").exists() or not pieces(root)


def test_journal_df_reads_pieces_with_sparks_parquet_reader_and_the_rest_with_the_source(spark, tmp_path):
    import json as _json

    from click.testing import CliRunner

    from multisite.cli.main import cli
    from multisite.pipeline.journal_frames import journal_df

    root = build(tmp_path / "A", "A", TXNS, segment_bytes=4096)
    out = CliRunner().invoke(cli, ["journal", "index", str(root), "--jobs", "2", "--json"])
    assert out.exit_code == 0, out.output
    rep = _json.loads(out.output)
    assert rep["pieces_written"] > 0 and rep["frames"] < len(TXNS)  # the open segment's tail is too small
    for opts, src in [({}, {}), ({"from_seqno": 37, "to_seqno": 140}, {"from_seqno": 37, "to_seqno": 140}),
                      ({"regions": frozenset({"acct"})}, {"regions": "acct"})]:
        df = journal_df(spark, str(root), **opts)
        plan = df._jdf.queryExecution().optimizedPlan().treeString().lower()
        assert "parquet" in plan  # pieces through Spark's reader
        assert ("relationv2" in plan) == ("to_seqno" not in opts)  # the unindexed tail through the source
        got = sorted((tuple(r) for r in df.collect()), key=repr)
        assert got == rows(spark, root, index="off", **src)
    narrow = journal_df(spark, str(root), ["region", "seqno", "key_bytes"])
    assert sorted((tuple(r) for r in narrow.collect()), key=repr) == \
        rows(spark, root, "region string, seqno bigint, key_bytes binary", index="off")
