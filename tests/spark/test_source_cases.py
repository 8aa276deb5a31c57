"""Edge cases of the journal and state sources that need Spark: values JSON cannot take as they are,
regions whose schemas disagree, reads that plan no partition."""

from __future__ import annotations

import json

import multisite


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
