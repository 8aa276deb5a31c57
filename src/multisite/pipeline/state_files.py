"""The export's current-state table folded with Arrow: no shuffle, no payload through the JVM.

A run's new state is the old state table (one row per key, older than every new event) folded with
the run's change files (journal events, ``(seqno, ord)`` unique), with the rules of ``folding``: the
latest set/zkill per key wins, a kill removes the keys it covers that are older than it, only sets
are kept. It is done in two steps:

1. *Winners* (driver, Arrow): the key columns of the new events only (``region, key_text, seqno,
   ord, op``), grouped per key with the max of ``pos = (seqno * 2**26 + ord) * 2 + is_set`` (``pos``
   is unique per event, the low bit carries the winner's op); winners that a later kill covers are
   dropped. Out of this come the positions of the surviving sets, the keys the run touched and the
   run's kills: small next to the payloads.
2. *Rewrite* (Spark tasks, Arrow): each task takes a few input files and writes one state file: from
   change files the rows whose ``pos`` is a surviving set, from old state files the rows whose key the
   run did not touch and that no kill of the run covers.

Kill coverage is the prefix relation of ``folding`` (``("a",1)`` covers ``("a",1)`` and
``("a",1,…)``), tested on UTF-8 bytes: a key is covered if its text without the closing bracket of
the kill's text is a prefix and the next byte is ``,`` or ``)``; one hash join per distinct kill text
length.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .folding import POS_ORD_BITS
from .segment_index import PIECE_COMPRESSION, arrow_type

STATE_FILE_BYTES = 64 * 1024 * 1024  # input bytes per rewrite task, about
STATE_ROW_GROUP_ROWS = 131_072
_KEY = ["region", "key_text"]


def state_schema(cols: list[str], fields: dict) -> pa.Schema:
    types = {"region": "string", "key_text": "string", "key": "array<struct<i:bigint,s:string>>",
             "value": "string", "value_size": "int", "value_raw": "binary", "commit_time": "timestamp",
             "seqno": "bigint"}
    out = []
    for c in cols:
        if c == "fields":
            out.append(pa.field("fields", pa.struct([(f, arrow_type(t)) for f, t in fields.items()])))
        else:
            out.append(pa.field(c, arrow_type(types[c])))
    return pa.schema(out)


def _pos2(t) -> pa.Array:
    pos = pc.add(pc.multiply(pc.cast(t["seqno"], pa.int64()), 1 << POS_ORD_BITS), pc.cast(t["ord"], pa.int64()))
    return pc.add(pc.multiply(pos, 2), pc.cast(pc.equal(t["op"], "set"), pa.int64()))


def covered(keys: pa.Table, kills: pa.Table) -> np.ndarray:
    """For each row of ``keys`` (``region, key_text`` and, if present, ``pos2``): is it covered by a
    kill of ``kills`` (``region, key_text, pos2``) that comes after it? Rows without ``pos2`` are older
    than every kill."""
    n = keys.num_rows
    dead = np.zeros(n, dtype=bool)
    if not n or not kills.num_rows:
        return dead
    ktext = pc.cast(kills["key_text"], pa.binary())
    klen = pc.binary_length(ktext)
    text = pc.cast(keys["key_text"], pa.binary())
    tlen = pc.binary_length(text)
    idx = pa.array(np.arange(n, dtype=np.int64))
    for L in pc.unique(klen).to_pylist():
        km = pc.equal(klen, L)
        kt = pa.table({"region": pc.filter(kills["region"], km),
                       "prefix": pc.binary_slice(pc.filter(ktext, km), 0, L - 1),
                       "kpos": pc.filter(kills["pos2"], km)})
        kt = kt.group_by(["region", "prefix"]).aggregate([("kpos", "max")])
        long_enough = pc.greater_equal(tlen, L)
        if not pc.any(long_enough).as_py():
            continue
        nxt = pc.binary_slice(text, L - 1, L)
        cand = pc.and_(long_enough, pc.is_in(nxt, value_set=pa.array([b",", b")"])))
        ct = {"row": pc.filter(idx, cand), "region": pc.filter(keys["region"], cand),
              "prefix": pc.binary_slice(pc.filter(text, cand), 0, L - 1)}
        if "pos2" in keys.column_names:
            ct["pos2"] = pc.filter(keys["pos2"], cand)
        hit = pa.table(ct).join(kt, keys=["region", "prefix"], join_type="inner")
        if "pos2" in keys.column_names:
            hit = hit.filter(pc.greater(hit["kpos_max"], hit["pos2"]))
        dead[hit["row"].to_numpy()] = True
    return dead


def winners(change_dir: Path) -> tuple[pa.Array, pa.Table, pa.Table]:
    """``(surviving set positions, touched keys, kills)`` of the run's change files."""
    t = ds.dataset(str(change_dir), format="parquet").to_table(columns=["region", "key_text", "seqno", "ord", "op"])
    t = pa.table({"region": t["region"], "key_text": t["key_text"], "pos2": _pos2(t),
                  "kill": pc.equal(t["op"], "kill")})
    kills = t.filter(t["kill"]).select(["region", "key_text", "pos2"])
    pts = t.filter(pc.invert(t["kill"]))
    g = pts.group_by(_KEY).aggregate([("pos2", "max")])
    latest = pa.table({"region": g["region"], "key_text": g["key_text"], "pos2": g["pos2_max"]})
    dead = covered(latest, kills)
    is_set = pc.equal(pc.bit_wise_and(latest["pos2"], 1), 1)
    keep = pc.and_(is_set, pa.array(~dead))
    return pc.filter(latest["pos2"], keep), latest.select(_KEY), kills


def _rewrite(args) -> int:
    """One rewrite task: its inputs to one state file (see the module docstring)."""
    i, inputs, out_dir, cols, fields, wins, touched, kills = args
    schema = state_schema(cols, fields)
    rows = 0
    path = Path(out_dir) / f"part-{i:05d}.parquet"
    with pq.ParquetWriter(path, schema, compression=PIECE_COMPRESSION, use_dictionary=["region"]) as w:
        for kind, f in inputs:
            if kind == "change":
                t = pq.read_table(f, columns=[*cols, "ord", "op"])
                t = t.filter(pc.is_in(_pos2(t), value_set=wins))
            else:
                t = pq.read_table(f, columns=cols)
                if touched.num_rows and t.num_rows:
                    keys = pa.table({"region": t["region"], "key_text": t["key_text"],
                                     "row": pa.array(np.arange(t.num_rows, dtype=np.int64))})
                    keep = keys.join(touched, keys=_KEY, join_type="left anti")["row"]
                    t = t.take(keep)
                if kills.num_rows and t.num_rows:
                    t = t.filter(pa.array(~covered(t.select(_KEY), kills)))
            if t.num_rows:
                w.write_table(t.select(cols).cast(schema), row_group_size=STATE_ROW_GROUP_ROWS)
                rows += t.num_rows
    return rows


def _bins(inputs: list[tuple[str, str]], n: int) -> list[list[tuple[str, str]]]:
    sizes = [os.path.getsize(f) for _, f in inputs]
    order = sorted(range(len(inputs)), key=lambda j: -sizes[j])
    bins: list[list] = [[] for _ in range(n)]
    load = [0] * n
    for j in order:
        b = load.index(min(load))
        bins[b].append(inputs[j])
        load[b] += sizes[j]
    return [b for b in bins if b]


def fold_state(spark, change_dir: Path | None, old_state: Path | None, out_dir: Path, cols: list[str],
               fields: dict, *, tasks: int | None = None) -> int:
    """Write the new state table to ``out_dir``; returns its rows (keys)."""
    empty_keys = pa.table({"region": pa.array([], pa.string()), "key_text": pa.array([], pa.string())})
    wins, touched = pa.array([], pa.int64()), empty_keys
    kills = pa.table({"region": pa.array([], pa.string()), "key_text": pa.array([], pa.string()),
                      "pos2": pa.array([], pa.int64())})
    inputs: list[tuple[str, str]] = []
    if change_dir is not None and change_dir.exists():
        changes = sorted(str(p) for p in change_dir.glob("commit_date=*/*.parquet"))
        if changes:
            wins, touched, kills = winners(change_dir)
            inputs += [("change", f) for f in changes]
    if old_state is not None and old_state.exists():
        inputs += [("state", str(p)) for p in sorted(old_state.glob("*.parquet"))]
    out_dir.mkdir(parents=True, exist_ok=True)
    if not inputs:
        return 0
    total = sum(os.path.getsize(f) for _, f in inputs)
    n = tasks or max(1, min(len(inputs), 2 * (os.cpu_count() or 2), -(-total // STATE_FILE_BYTES)))
    work = []
    for i, b in enumerate(_bins(inputs, n)):
        has_change = any(k == "change" for k, _ in b)
        has_state = any(k == "state" for k, _ in b)
        work.append((i, b, str(out_dir), cols, fields, wins if has_change else wins.slice(0, 0),
                     touched if has_state else touched.slice(0, 0), kills if has_state else kills.slice(0, 0)))
    return sum(spark.sparkContext.parallelize(work, len(work)).map(_rewrite).collect())
