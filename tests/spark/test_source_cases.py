"""Edge cases of the journal and state sources that need Spark: values JSON cannot take as they are,
regions whose schemas disagree, reads that plan no partition."""

from __future__ import annotations

import json

import multisite
from multisite.pipeline import index_journal, journal_df


def test_values_with_bool_none_or_tuple_dict_keys_read_from_both_sources(spark, tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        with db.transaction() as tx:
            tx.set("r", ("k",), {True: 1, None: {(1, "a"): 2}})
            tx.set("r", ("j",), "plain")
    got = {r.key_text: r.value for r in spark.read.format("multisite").load(str(root)).collect()}
    assert json.loads(got['("k")']) == {"true": 1, "null": {'[1,"a"]': 2}} and json.loads(got['("j")']) == "plain"
    state = {r.key_text: r.value for r in spark.read.format("multisite_state").load(str(root)).collect()}
    assert state == got


def test_regions_disagreeing_on_a_field_type_keep_typed_fields_through_the_index(spark, tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("a", schema='{"n": "long"}')
        db.create_region("b", schema='{"n": "string"}')
        db.set("a", ("x",), {"n": 5})
        for i in range(60):  # seal the first segment
            db.set("b", ("pad", i), {"n": "x" * 100})
    index_journal(str(root), jobs=1)  # pieces without a fields column (a and b disagree on n)
    read = spark.read.format("multisite").option("regions", "a").load(str(root))
    assert [r.fields.n for r in read.collect()] == [5]
    df = journal_df(spark, str(root), ["seqno", "fields"], regions=frozenset({"a"}))
    assert [(r.seqno, r.fields.n) for r in df.collect()] == [(1, 5)]


def test_a_state_read_that_plans_no_partition_is_empty(spark, tmp_path):
    empty = multisite.create(tmp_path / "E", name="E", durability="none")
    killed = multisite.create(tmp_path / "K", name="K", durability="none")
    with multisite.open(killed) as db:
        db.create_region("r")
        db.set("r", ("a",), 1)
        db.kill("r", ("a",))  # every key gone: no key range to read
    for root in (empty, killed):
        df = spark.read.format("multisite_state").load(str(root))
        assert df.count() == 0 and df.collect() == []
