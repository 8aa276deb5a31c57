"""verify's two engines (in-process for small inputs, Spark for the rest) give the same report."""

from __future__ import annotations

import multisite
from conftest import KNOWN, build
from multisite import pipeline
from multisite.testing.builders import numbered, replica_of

_FIELDS = ("seqno", "keys_a", "keys_b", "missing_in_a", "missing_in_b", "different", "sample", "end_a", "end_b")


def _both(a, b, spark, **kw):
    local = pipeline.verify(str(a), str(b), engine="local", **kw)
    on_spark = pipeline.verify(str(a), str(b), engine="spark", spark=spark, **kw)
    assert local.engine == "local" and on_spark.engine == "spark"
    assert {f: getattr(local, f) for f in _FIELDS} == {f: getattr(on_spark, f) for f in _FIELDS}
    return local


def test_engines_agree_on_planted_differences_a_snapshot_and_a_side_ahead(spark, tmp_path, known):
    twin = build(tmp_path / "B", "B", KNOWN)
    with multisite.open(twin) as db:
        db.store.put(db.store.regions["acct"].id, multisite.keys.encode_key(("a", 3)),
                     multisite.values.encode_value({"owner": "zz", "n": 3}))
        db.store.delete(db.store.regions["log"].id, multisite.keys.encode_key(("x", 2)))
        db.store.flush()
    rep = _both(known, twin, spark)
    assert (rep.different, rep.missing_in_b) == (1, 1)
    pipeline.snapshot(str(known), str(tmp_path / "s"), at=3, spark=spark)
    assert _both(tmp_path / "s", known, spark, at=3).in_sync is False  # the instance is ahead by 2
    a = numbered(tmp_path / "N", "N", 12)
    b = replica_of(a, tmp_path / "R", "R", 9)
    rep = _both(a, b, spark)
    assert rep.equal and (rep.ahead, rep.ahead_by) == ("A", 3)
