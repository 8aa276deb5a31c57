"""Folding a run of updates into the final state per key: last writer wins by (seqno, ord), kills honoured.

Every job that turns changes into state uses this one operator: the export's current-state table,
snapshots at a seqno, the bulk catch-up (``fold``) and the recomputation after a rollback.

Input is a DataFrame of *events* (``region, key_text, seqno, ord, op`` and payload columns): journal
events (``ord >= 0``: ``(seqno, ord)`` is unique) and, optionally, *base* rows (``ord = -1``: a state
the events start from, one row per key, older than every event). The latest point event (set or
zkill) per key is a candidate; a key with no point event keeps its base row. A kill removes the key
and every key below it, so a candidate survives only if no kill *after* it covers it.

The latest event per key is found without moving payloads through a shuffle: a hash aggregate of
``max(pos)`` per key, where ``pos = seqno * 2**26 + ord`` is a long unique per journal event (a frame
holds at most 256 MiB, so fewer than 2**26 updates), then a semi-join of the events with the winning
positions, broadcast (one long per key). Base rows are kept where the key has no candidate (an
anti-join with the candidates' keys). Seqnos must stay below 2**37.

Coverage is a prefix relation on the canonical key text: ``("a",1)`` covers itself and every key whose
text starts with ``("a",1,``. We join candidates with kills on ``(region, the first L-1 characters)``
for each distinct kill text length L, and check that character L is ``,`` or ``)`` — an equi-join per
length, so it scales with the number of keys rather than keys x kills.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, functions as F

POS_ORD_BITS = 26  # pos = seqno * 2**26 + ord


def latest_points(events: DataFrame, payload: list[str], *, has_base: bool = True) -> DataFrame:
    """The latest set/zkill per (region, key_text), with its payload columns, ``seqno`` and ``ord``."""
    cols = ["region", "key_text", "seqno", "ord", "op", *payload]
    pts = events.where(F.col("op") != "kill").select(*cols)
    journal = pts.where(F.col("ord") >= 0) if has_base else pts
    journal = journal.withColumn("_pos", F.col("seqno") * (1 << POS_ORD_BITS) + F.col("ord"))
    latest = journal.groupBy("region", "key_text").agg(F.max("_pos").alias("_pos"))
    winners = journal.join(F.broadcast(latest.select("_pos")), "_pos", "left_semi").select(*cols)
    if not has_base:
        return winners
    base = pts.where(F.col("ord") < 0)
    kept = base.join(F.broadcast(winners.select("region", "key_text")), ["region", "key_text"], "left_anti")
    return winners.unionByName(kept.select(*cols))


def kill_events(events: DataFrame) -> DataFrame:
    return events.where(F.col("op") == "kill").select("region", "key_text", "seqno", "ord")


def covered_by(rows: DataFrame, kills: DataFrame) -> DataFrame:
    """``rows`` joined with every kill covering each row: adds ``k_seqno, k_ord`` (one row per pair)."""
    lengths = [r[0] for r in kills.select(F.length("key_text")).distinct().collect()]
    if not lengths:
        return None
    parts = []
    for n in lengths:
        k = (kills.where(F.length("key_text") == n)
             .select(F.col("region").alias("k_region"), F.substring("key_text", 1, n - 1).alias("k_prefix"),
                     F.col("seqno").alias("k_seqno"), F.col("ord").alias("k_ord")))
        r = rows.withColumn("_p", F.substring("key_text", 1, n - 1)) \
                .where(F.substring("key_text", n, 1).isin(",", ")"))
        parts.append(r.join(k, (r.region == k.k_region) & (r._p == k.k_prefix)).drop("_p", "k_region", "k_prefix"))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def surviving(points: DataFrame, kills: DataFrame, has_kills: bool | None = None) -> DataFrame:
    """Drop every point that a later kill covers (points must carry ``seqno, ord``)."""
    if has_kills is False:
        return points
    cov = covered_by(points.select("region", "key_text", "seqno", "ord"), kills)
    if cov is None:
        return points
    dead = (cov.where(F.struct("k_seqno", "k_ord") > F.struct("seqno", "ord"))
            .select("region", "key_text").distinct())
    return points.join(dead, ["region", "key_text"], "left_anti")


def final_state(events: DataFrame, payload: list[str], *, has_base: bool = True) -> tuple[DataFrame, DataFrame]:
    """``(points, kills)``: the surviving latest points (sets and zkills: callers keep the sets) and
    every kill of the run. ``has_base=False`` says no event has ``ord < 0`` (saves the anti-join)."""
    kills = kill_events(events)  # not cached: a cached plan over the same paths would be reused by a later run
    pts = surviving(latest_points(events, payload, has_base=has_base), kills)
    return pts, kills
