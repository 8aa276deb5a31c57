"""A document database is an instance: the journal's Spark source reads its documents' versions."""

from __future__ import annotations

import json

import multisite.documents as documents


def test_the_spark_source_reads_every_version_of_a_document(spark, tmp_path):
    with documents.create(tmp_path / "docs", "Profiles", durability="none") as db:
        unid = db.create("Person", {"name": "Ada"})
        db.update(unid, {"city": "Boston"})
        db.delete(unid)
    out = (spark.read.format("multisite").load(str(tmp_path / "docs")).where("region = 'docs'")
           .orderBy("seqno", "ord").collect())
    versions = [json.loads(r.value)[1] for r in out]  # [change number, document]
    assert [r.key_text for r in out] == [f'("{unid}")'] * 3
    assert [(v[3], v[2], v[8]) for v in versions] == [(1, {"name": "Ada"}, False),
                                                     (2, {"name": "Ada", "city": "Boston"}, False), (3, {}, True)]
    assert json.loads(out[1].before)[1][3] == 1  # the before-image is the previous version
