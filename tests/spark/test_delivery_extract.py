"""``multisite delivery extract`` on the Spark path: the new remote holds exactly the subscriber's
rows, read by Spark from the consolidated instance's store, and keeps up afterwards."""

from __future__ import annotations

import multisite.engine as engine
from multisite.pipeline.delivery_extract import extract
from multisite.testing.delivery import FIELD, REGION, make_topology, poll, rows, settle


def test_the_spark_extract_holds_exactly_the_subscribers_rows_and_keeps_up(tmp_path, spark):
    top = make_topology(tmp_path, {"P": "fr", "Q": "de"})
    with engine.open(top.hq) as db:
        for i in range(500):
            db.set(REGION, ("o", i), {FIELD: ["fr", "de", "it"][i % 3], "n": i})
    poll(top.hq)
    with engine.open(top.hq) as db:
        out = extract(db, "P", tmp_path / "P2", spark=spark)
    want = {k: v for k, v in rows(top.hq).items() if v[FIELD] == "fr"}
    assert out["rows"] == len(want) == 167
    assert rows(tmp_path / "P2") == want
    top.remotes["P"] = tmp_path / "P2"
    with engine.open(top.hq) as db:
        db.set(REGION, ("o", 1000), {FIELD: "fr", "n": 1000})
    settle(top)
    assert rows(tmp_path / "P2") == {k: v for k, v in rows(top.hq).items() if v[FIELD] == "fr"}
