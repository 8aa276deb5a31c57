"""Every pipeline job reads a journal archive (a local path, and S3 on a real moto server) as well as an
instance directory, and an archive with the instance's unarchived tail gives the whole journal."""

from __future__ import annotations

import pytest

import multisite
from multisite import pipeline
from multisite.errors import ConfigError
from multisite.instance.maintenance import prune
from multisite.pipeline.archive import archive

COLS = ["seqno", "ord", "op", "region", "key_text", "value", "fields"]


def journaled(path, n, start=1):
    root = path if (path / "journal").exists() else multisite.create(path, name=path.name, durability="none",
                                                                      segment_bytes=64 * 1024)
    with multisite.open(root) as db:
        if "r" not in db.regions():
            db.create_region("r", schema='{"n": "long"}')
        for i in range(start, start + n):
            with db.transaction() as tx:
                tx.set("r", ("k", i % 40), {"n": i, "pad": "p" * 400})
                if i % 97 == 0:
                    tx.kill("r", ("k", i % 7))
    return root


def rows(spark, src, **opts):
    r = spark.read.format("multisite")
    for k, v in opts.items():
        r = r.option(k, v)
    return sorted(map(tuple, r.load(src).select(*COLS).collect()))


@pytest.fixture
def targets(tmp_path, s3):
    out = [str(tmp_path / "arch")]
    if s3 is not None:
        out.append(f"s3://lake/{tmp_path.name}/A")
    return out


def test_source_reads_archives_whole_in_part_and_with_the_instance_tail(spark, tmp_path, targets):
    a = journaled(tmp_path / "A", 500)
    full = rows(spark, str(a))  # writes the index pieces, archived below with their segments
    for url in targets:
        rep = archive(str(a), url)
        assert rep.pieces_copied > 0
        held = rep.last_archived
        assert rows(spark, url) == [r for r in full if r[0] <= held]
        assert rows(spark, url, index="off") == [r for r in full if r[0] <= held]
        assert rows(spark, url, from_seqno=33, to_seqno=held - 20) == [r for r in full if 33 <= r[0] <= held - 20]
    journaled(a, 200, start=501)
    full = rows(spark, str(a))
    for url in targets:
        archive(str(a), url)
    prune(a, 10**9)  # the instance keeps its newest segment only: the rest is read from the archive
    for url in targets:
        assert rows(spark, [url, str(a)]) == full
        assert rows(spark, [str(a), url], from_seqno=450) == [r for r in full if r[0] >= 450]
    journaled(a, 400, start=701)
    prune(a, 10**9, require_archived=False)  # pruned before it was archived: a gap, said so
    with pytest.raises(Exception, match="neither in its journal archive"):
        rows(spark, [targets[0], str(a)])


def test_export_and_verify_from_an_archive_agree_with_the_instance(spark, tmp_path, targets):
    a = journaled(tmp_path / "A", 400)
    url = targets[-1]
    archive(str(a), url)
    pipeline.export(str(a), str(tmp_path / "lakeA"), spark=spark)
    pipeline.export(url, str(tmp_path / "lakeU"), spark=spark, archive=None)
    rep = pipeline.export(str(a), str(tmp_path / "lakeAU"), spark=spark, archive=url)
    assert rep.to_seqno == 400
    read = lambda p, t: sorted(map(tuple, spark.read.parquet(str(p / t)).drop("commit_date").collect()))  # noqa: E731
    u_last = pipeline.verify(url, str(a), engine="local").seqno
    assert read(tmp_path / "lakeAU", "state") == read(tmp_path / "lakeA", "state")
    assert read(tmp_path / "lakeAU", "changes") == read(tmp_path / "lakeA", "changes")
    assert max(r[0] for r in spark.read.parquet(str(tmp_path / "lakeU" / "changes")).select("seqno").collect()) \
        == u_last
    for engine in ("local", "spark"):
        v = pipeline.verify(url, str(a), engine=engine, spark=spark)
        assert v.equal and v.ahead == "B" and v.ahead_by == 400 - u_last, (engine, v.summary())
    with pytest.raises(ConfigError, match="needs the instance directory"):
        pipeline.snapshot(url, str(tmp_path / "snap"), spark=spark)
