"""Compare two instances' (or snapshots') states key by key at one seqno.

Each side is an instance directory (its state at the seqno, see ``snapshot.state_df``) or a snapshot
directory (which is at its own seqno). The two states are joined on ``(region, key_bytes)`` and every
key that is missing on one side or holds different value bytes is a difference. Values are compared
as stored (msgpack bytes): a replica holds the very bytes its primary journaled.

Honest about seqnos: two instances at different ends are compared at the lower one (or ``--at``), and
the report says which side is ahead and by how many transactions (``ahead``, ``ahead_by``): equal
states at the lower seqno are not "equal" instances. Small inputs (``local_state.is_small``) are
compared in this process without starting Spark (``engine="auto"``), which takes about a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .local_state import is_small, is_snapshot, state_at
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
    end_a: int = 0  # the seqno each side ends at (a snapshot's own seqno)
    end_b: int = 0
    engine: str = "spark"  # "local" when compared in this process (small inputs)

    @property
    def equal(self) -> bool:
        """The states are equal at ``seqno`` (see ``in_sync`` for the sides' ends)."""
        return self.missing_in_a == 0 and self.missing_in_b == 0 and self.different == 0

    @property
    def ahead(self) -> str | None:
        """``"A"`` or ``"B"``: the side that holds transactions past the other's end."""
        return None if self.end_a == self.end_b else ("A" if self.end_a > self.end_b else "B")

    @property
    def ahead_by(self) -> int:
        return abs(self.end_a - self.end_b)

    @property
    def in_sync(self) -> bool:
        """Equal states and the same end: nothing to tell the sides apart."""
        return self.equal and self.ahead is None

    def summary(self) -> str:
        verdict = "EQUAL" if self.equal else "DIFFERENT"
        text = (f"{verdict} at seqno {self.seqno}: {self.keys_a} key(s) in A, {self.keys_b} in B; {self.different} "
                f"different, {self.missing_in_a} missing in A, {self.missing_in_b} missing in B")
        if self.ahead:
            n = self.ahead_by
            text += (f"; but {self.ahead} is ahead by {n} transaction{'s' if n != 1 else ''} (A ends at seqno "
                     f"{self.end_a}, B at {self.end_b}): not compared")
        return text

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(equal=self.equal, ahead=self.ahead, ahead_by=self.ahead_by, in_sync=self.in_sync)
        return d


def _readable(row: dict) -> dict:
    import msgspec

    from .decode import value_json

    for side in ("a", "b"):
        raw = row.pop(f"value_raw_{side}")
        row[f"value_{side}"] = None if raw is None else value_json(msgspec.msgpack.decode(raw)).decode()
    return row


def _side(spark, path: str, at: int | None):
    from .seeding import load_meta, state_df

    if is_snapshot(path):
        meta = load_meta(path)
        if at is not None and at != meta["seqno"]:
            raise ConfigError(f"snapshot {path} is at seqno {meta['seqno']}, not {at}")
        df = spark.read.parquet(str(Path(path) / "state"))
        return df.select("region", "key_text", "key_bytes", "value_raw"), meta["seqno"]
    # Only what the comparison needs: JSON values are made for the differing keys alone.
    return state_df(spark, path, at, with_fields=False, payload=["key_bytes", "value_raw"])


def _end(path: str) -> int:
    from .seeding import load_meta

    return load_meta(path)["seqno"] if is_snapshot(path) else journal_bounds(path)[1]


def verify(a: str, b: str, *, at: int | None = None, out: str | None = None, spark=None,
           progress=None, engine: str = "auto", spark_factory=None) -> VerifyReport:
    """Compare ``a`` and ``b`` at seqno ``at`` (default: the lower of their ends).

    ``engine``: ``"auto"`` compares small inputs in this process and the rest on Spark, ``"local"``
    and ``"spark"`` force one. Spark is ``spark``, else ``spark_factory()``, else a new session."""
    if engine not in ("auto", "local", "spark"):
        raise ConfigError(f"engine must be auto, local or spark, not {engine!r}")
    t0 = time.time()
    end_a, end_b = _end(a), _end(b)
    if at is None:
        at = min(end_a, end_b)
    if engine == "auto":
        engine = "local" if is_small(a, at) and is_small(b, at) else "spark"
    if progress:
        progress(f"comparing {a} and {b} at seqno {at}" + (" (small: without Spark)" if engine == "local" else ""))
    if engine == "local":
        rep = _verify_local(a, b, at, out)
    else:
        if spark is None:
            from .env import session

            spark = (spark_factory or session)()
        rep = _verify_spark(spark, a, b, at, out)
    rep.end_a, rep.end_b, rep.engine = end_a, end_b, engine
    rep.seconds = time.time() - t0
    return rep


def _verify_local(a: str, b: str, at: int, out: str | None) -> VerifyReport:
    from ..keys import decode_key, key_text

    sa, _ = state_at(a, at)
    sb, _ = state_at(b, at)
    diffs = []
    for k, va in sa.items():
        vb = sb.get(k)
        if vb is None:
            diffs.append(("missing_in_b", k, va, None))
        elif va != vb:
            diffs.append(("different", k, va, vb))
    diffs += [("missing_in_a", k, None, vb) for k, vb in sb.items() if k not in sa]
    rows = [{"difference": d, "region": k[0], "key_text": key_text(decode_key(k[1])), "key_bytes": k[1],
             "value_raw_a": va, "value_raw_b": vb} for d, k, va, vb in diffs]
    rows.sort(key=lambda r: (r["region"], r["key_text"]))
    diff_path = None
    if rows and out:
        import pyarrow as pa
        import pyarrow.parquet as pq

        dest = Path(out)
        if dest.exists():
            import shutil

            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        schema = pa.schema([("difference", pa.string()), ("region", pa.string()), ("key_text", pa.string()),
                            ("key_bytes", pa.binary()), ("value_raw_a", pa.binary()), ("value_raw_b", pa.binary())])
        pq.write_table(pa.Table.from_pylist(rows, schema), dest / "part-00000.parquet")
        diff_path = str(dest.absolute())
    sample = []
    for r in rows[:SAMPLE_ROWS]:
        r = dict(r)
        r.pop("key_bytes")
        sample.append(_readable(r))
    count = {kind: sum(1 for d in diffs if d[0] == kind) for kind in ("missing_in_a", "missing_in_b", "different")}
    return VerifyReport(a, b, at, len(sa), len(sb), count["missing_in_a"], count["missing_in_b"], count["different"],
                        diff_path, sample)


def _verify_spark(spark, a: str, b: str, at: int, out: str | None) -> VerifyReport:
    from pyspark.sql import functions as F

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
                        counts.get("missing_in_b", 0), counts.get("different", 0), diff_path, sample)
