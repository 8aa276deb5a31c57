"""Compare two instances' (or snapshots') states key by key at one seqno.

Each side is an instance directory (its state at the seqno, see ``snapshot.state_df``) or a snapshot
directory (which is at its own seqno). The two states are joined on ``(region, key_bytes)`` and every
key that is missing on one side or holds different value bytes is a difference. Values are compared
as stored (msgpack bytes): a replica holds the very bytes its primary journaled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .plan import journal_bounds

SAMPLE_ROWS = 20


@dataclass
class VerifyReport:
    a: str
    b: str
    seqno: int
    keys_a: int
    keys_b: int
    missing_in_a: int
    missing_in_b: int
    different: int
    diff_path: str | None
    sample: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return self.missing_in_a == 0 and self.missing_in_b == 0 and self.different == 0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["equal"] = self.equal
        return d


def _readable(row: dict) -> dict:
    import msgspec

    from .decode import value_json

    for side in ("a", "b"):
        raw = row.pop(f"value_raw_{side}")
        row[f"value_{side}"] = None if raw is None else value_json(msgspec.msgpack.decode(raw)).decode()
    return row


def _is_snapshot(path: str) -> bool:
    return (Path(path) / "snapshot.json").exists()


def _side(spark, path: str, at: int | None):
    from .seeding import load_meta, state_df

    if _is_snapshot(path):
        meta = load_meta(path)
        if at is not None and at != meta["seqno"]:
            raise ConfigError(f"snapshot {path} is at seqno {meta['seqno']}, not {at}")
        df = spark.read.parquet(str(Path(path) / "state"))
        return df.select("region", "key_text", "key_bytes", "value_raw"), meta["seqno"]
    # Only what the comparison needs: JSON values are made for the differing keys alone.
    return state_df(spark, path, at, with_fields=False, payload=["key_bytes", "value_raw"])


def _end(path: str) -> int:
    from .seeding import load_meta

    return load_meta(path)["seqno"] if _is_snapshot(path) else journal_bounds(path)[1]


def verify(a: str, b: str, *, at: int | None = None, out: str | None = None, spark=None,
           progress=None) -> VerifyReport:
    """Compare ``a`` and ``b`` at seqno ``at`` (default: the lower of their ends)."""
    from pyspark.sql import functions as F

    from .env import session

    t0 = time.time()
    spark = spark or session()
    if at is None:
        at = min(_end(a), _end(b))
    if progress:
        progress(f"comparing {a} and {b} at seqno {at}")
    da, _ = _side(spark, a, at)
    db, _ = _side(spark, b, at)
    cols = ["key_text", "value_raw"]
    da = da.select("region", "key_bytes", *[F.col(c).alias(f"a_{c}") for c in cols], F.lit(1).alias("a_n"))
    db = db.select("region", "key_bytes", *[F.col(c).alias(f"b_{c}") for c in cols], F.lit(1).alias("b_n"))
    j = da.join(db, ["region", "key_bytes"], "full_outer")
    kind = (F.when(F.col("a_n").isNull(), F.lit("missing_in_a"))
            .when(F.col("b_n").isNull(), F.lit("missing_in_b"))
            .when(F.col("a_value_raw") != F.col("b_value_raw"), F.lit("different")))
    j = j.withColumn("difference", kind)
    j = j.persist()
    try:
        counts = {r["difference"]: r["n"] for r in
                  j.groupBy("difference").agg(F.count(F.lit(1)).alias("n"),
                                              F.sum("a_n").alias("na"), F.sum("b_n").alias("nb")).collect()}
        totals = j.agg(F.sum("a_n"), F.sum("b_n")).collect()[0]
        diffs = j.where(F.col("difference").isNotNull()).select(
            "difference", "region", F.coalesce("a_key_text", "b_key_text").alias("key_text"), "key_bytes",
            F.col("a_value_raw").alias("value_raw_a"), F.col("b_value_raw").alias("value_raw_b"))
        n_diff = sum(v for k, v in counts.items() if k is not None)
        diff_path = None
        sample = []
        if n_diff:
            sample = [_readable(r.asDict()) for r in
                      diffs.drop("key_bytes").orderBy("region", "key_text").limit(SAMPLE_ROWS).collect()]
            if out:
                diffs.write.mode("overwrite").parquet(out)
                diff_path = str(Path(out).absolute())
    finally:
        j.unpersist()
    return VerifyReport(a, b, at, int(totals[0] or 0), int(totals[1] or 0), counts.get("missing_in_a", 0),
                        counts.get("missing_in_b", 0), counts.get("different", 0), diff_path, sample,
                        time.time() - t0)
