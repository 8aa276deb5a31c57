"""Analytics replicas: an instance's changes and current state in Parquet, incremental and rollback-aware.

Layout of the export directory::

    changes/commit_date=YYYY-MM-DD/r<last seqno of the run>-*.parquet   one row per update (append-only)
    state/*.parquet                       one row per key as of the last exported seqno
    retracted/*.parquet                   transactions taken back after a rollback (seqno, txn_crc, ...)
    _multisite/export.json                manifest: instance, last exported seqno, runs
    _multisite/txns/r*.parquet            (seqno, crc) of every exported transaction
    _multisite/base/                      the state the change table starts from (if the journal did not
                                          start at seqno 1 when the export began); its transactions'
                                          (seqno, crc) still in the journal are in txns/, so a rollback
                                          into the base is detected too, and rebuilds the export

A run: (1) tidy what an interrupted run left (change files of runs past the manifest's seqno, a
half-done retraction); (2) detect a rollback: compare the exported ``(seqno, crc)`` pairs with the
journal's frame headers (headers only: cheap); the first mismatch, or a journal that now ends
before the last exported seqno, is the divergence point k; (3) retract every exported transaction
after k: rows go from ``changes/`` (the affected date partitions are rewritten) into ``retracted/``,
and the state is recomputed for the affected keys by folding the base and the kept changes of just
those keys; (4) export the new range: append its rows to ``changes/`` and fold them into ``state/``.
The manifest is written last, so a crash at any point leaves a directory the next run repairs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..fsutil import atomic_write
from ..instance import consumers
from ..instance.layout import Layout
from . import columns as C
from .change_files import write_changes
from .folding import covered_by, final_state
from .state_files import fold_state
from .plan import InstanceRef, journal_crcs, ref_bounds, ref_crcs, with_archive

FOLLOW_INTERVAL_S = 1.0
STATE_PAYLOAD = ["key", "value", "value_size", "value_raw", "commit_time"]


@dataclass
class ExportReport:
    instance: str
    path: str
    from_seqno: int
    to_seqno: int
    transactions: int = 0
    updates: int = 0
    retracted_from: int | None = None  # divergence point k: transactions after it were retracted
    retracted_transactions: int = 0
    keys: int | None = None
    seconds: float = 0.0
    rebuilt: bool = False  # a rollback went into the base: the export was started again from the state
    consumer: str = ""  # the position the export keeps in the instance's journal (prune honours it)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Dirs:
    root: Path

    def __post_init__(self) -> None:
        r = self.root
        self.changes, self.state, self.retracted = r / "changes", r / "state", r / "retracted"
        self.meta = r / "_multisite"
        self.txns, self.base, self.work = self.meta / "txns", self.meta / "base", self.meta / "work"
        self.manifest, self.intent = self.meta / "export.json", self.meta / "retract.json"


def _load_manifest(d: _Dirs) -> dict | None:
    return json.loads(d.manifest.read_text()) if d.manifest.exists() else None


def _save_manifest(d: _Dirs, m: dict) -> None:
    atomic_write(d.manifest, json.dumps(m, indent=2).encode())


def _run_id(name: str) -> int | None:
    """``r00000000000000000123-part-….parquet`` or ``r00000000000000000123.parquet`` -> 123."""
    digits = name[1:21]
    return int(digits) if name.startswith("r") and digits.isdigit() else None


# -- rollback detection ---------------------------------------------------------------------------
def exported_txns(d: _Dirs) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    files = sorted(d.txns.glob("r*.parquet")) if d.txns.exists() else []
    if not files:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    tables = [pq.read_table(f) for f in files]
    seq = np.concatenate([t.column("seqno").to_numpy() for t in tables])
    crc = np.concatenate([t.column("crc").to_numpy() for t in tables])
    order = np.argsort(seq, kind="stable")
    return seq[order], crc[order]


def divergence(ref: InstanceRef, seq: np.ndarray, crc: np.ndarray, last_seqno: int = 0) -> int | None:
    """The last seqno on which the export (its ``(seqno, crc)`` pairs, exported up to ``last_seqno``)
    and the journal (with its archive, if the export reads one) agree, if they disagree after it."""
    first, j_last = ref_bounds(ref)
    if len(seq):
        last = int(seq[-1])
        lo = max(first, int(seq[0]))
        js, jc = ref_crcs(ref, lo, last)
        mask = seq >= lo
        es, ec = seq[mask], crc[mask]
        n = min(len(es), len(js))
        bad = np.nonzero((es[:n] != js[:n]) | (ec[:n] != jc[:n]))[0]
        if len(bad):
            return int(es[bad[0]]) - 1
    if j_last < max(last_seqno, int(seq[-1]) if len(seq) else 0):
        return j_last
    return None


def consumer_name(root: Path) -> str:
    """The name under which the export at ``root`` keeps its position in the instance's journal."""
    return "export-" + hashlib.sha256(str(root).encode()).hexdigest()[:12]


# -- the job --------------------------------------------------------------------------------------
def export(instance: str, to: str, *, follow: bool = False, interval_s: float = FOLLOW_INTERVAL_S,
           max_runs: int | None = None, spark=None, progress=None, archive: str | None = None) -> ExportReport:
    """Export ``instance`` incrementally to ``to``; with ``follow``, keep exporting new transactions.

    ``instance`` is an instance directory or a journal archive URL; ``archive`` (with a directory)
    reads the seqnos the archive holds from it and the rest from the directory."""
    from .env import session

    spark = spark or session()
    runs = 0
    while True:
        rep = export_once(instance, to, spark=spark, progress=progress, archive=archive)
        runs += 1
        if not follow or (max_runs is not None and runs >= max_runs):
            return rep
        if progress:
            progress(f"exported to seqno {rep.to_seqno}; following (Ctrl-C stops)")
        time.sleep(interval_s)


def export_once(instance: str, to: str, *, spark, progress=None, archive: str | None = None) -> ExportReport:
    t0 = time.time()
    ref = with_archive(instance, archive)
    d = _Dirs(Path(to).absolute())
    d.meta.mkdir(parents=True, exist_ok=True)
    m = _load_manifest(d)
    if m is None:
        m = {"format": 1, "instance": ref.name, "path": ref.path, "last_seqno": 0, "base_seqno": None,
             "fields": C.merge_fields(sorted(ref.region_schemas.items())), "runs": []}
    elif m["instance"] != ref.name:
        raise ConfigError(f"{d.root} is an export of instance {m['instance']}, not {ref.name}; export to another "
                          f"directory")
    fields = C.merge_fields(sorted(ref.region_schemas.items()))
    if fields != m["fields"]:
        raise ConfigError(f"the region schemas of {ref.name} changed since {d.root} was first exported "
                          f"({m['fields']} -> {fields}); export to a new directory")
    _tidy(spark, d, m)
    # What the export has not exported yet must outlive `journal prune`: keep a consumer position at
    # the manifest's seqno (recorded before reading, so also for an export made before positions were).
    rep = ExportReport(ref.name, str(d.root), m["last_seqno"] + 1, m["last_seqno"], consumer=consumer_name(d.root))
    layout = Layout.existing(ref.path) if ref.path else None  # an archive alone keeps no position
    if layout:
        consumers.record(layout, rep.consumer, m["last_seqno"])
    seq, crc = exported_txns(d)
    k = divergence(ref, seq, crc, m["last_seqno"])
    if k is not None:
        rep.retracted_from = k
        rep.retracted_transactions = int((seq > k).sum())
        if m["base_seqno"] and k < m["base_seqno"]:
            _rebuild(spark, d, m, k, ref.name, progress)
            rep.rebuilt = True
        else:
            if progress:
                progress(f"rollback detected: journal of {ref.name} diverges after seqno {k}; retracting")
            _retract(spark, d, m, k, ref.name)
        rep.from_seqno = k + 1
    first, last = ref_bounds(ref)
    lo = m["last_seqno"] + 1
    if m["last_seqno"] == 0 and m["base_seqno"] is None:
        lo = _begin(spark, d, m, ref, first, progress)
    rep.from_seqno = min(rep.from_seqno, lo)
    if last >= lo:
        if progress:
            progress(f"exporting {ref.name} seqnos {lo}..{last}")
        rep.transactions, rep.updates = _append(spark, d, m, ref, lo, last)
    rep.to_seqno = m["last_seqno"]
    if layout:
        consumers.record(layout, rep.consumer, m["last_seqno"])
    rep.seconds = time.time() - t0
    return rep


def _begin(spark, d: _Dirs, m: dict, ref, first: int, progress) -> int:
    """First run: the change table starts at seqno 1, or (pruned journal) at the store's state."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if first == 1:
        shutil.rmtree(d.state, ignore_errors=True)  # left by a rebuilt export (_rebuild)
        shutil.rmtree(d.base, ignore_errors=True)
        m["base_seqno"] = 0
        return 1
    if not ref.path:
        raise ConfigError(f"the journal archive {ref.archive} starts at seqno {first}: a first export needs the state "
                          f"before it, so give the instance directory too (--archive URL with the directory)")
    from .seeding import state_df

    base, at = state_df(spark, ref.path, None)
    if progress:
        progress(f"journal of {ref.name} starts at seqno {first}: taking the state at {at} as the export's base")
    from pyspark.sql import functions as F

    base.select("region", "key", "key_text", "value", "value_size", "value_raw",
                *(["fields"] if m["fields"] else [])) \
        .withColumn("seqno", F.lit(at).cast("bigint")) \
        .withColumn("commit_time", F.lit(None).cast("timestamp")) \
        .write.mode("overwrite").parquet(str(d.base))
    # The base's identity: the (seqno, crc) of its transactions still in the journal, so that a rollback
    # into the base is detected like one into the change table (and rebuilds the export: _rebuild).
    js, jc = journal_crcs(ref.path, first, at)
    d.txns.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"seqno": js, "crc": jc}), d.txns / f"r{at:020d}.parquet")
    m["base_seqno"] = at
    m["last_seqno"] = at
    shutil.rmtree(d.state, ignore_errors=True)
    shutil.copytree(d.base, d.state)
    _save_manifest(d, m)
    return at + 1


def _rebuild(spark, d: _Dirs, m: dict, k: int, instance: str, progress) -> None:
    """A rollback to ``k`` below the base: the base holds transactions the instance no longer has, and
    it has no history to take them out of. Retract the change table (so that ``retracted/`` lists what
    it loses), then forget the base: this run starts the export again from the instance's state.

    Crash-safe: the manifest says "nothing exported" before anything is deleted; until then a rerun
    finds the same divergence and does the same."""
    base = m["base_seqno"]
    if progress:
        progress(f"rollback into the export's base: the journal of {instance} diverges after seqno {k}, below "
                 f"the base the export started from (the state at seqno {base}); rebuilding the export from "
                 f"the instance's state")
    if m["last_seqno"] > base:
        _retract(spark, d, m, base, instance, diverged_after=k)
    m.update(last_seqno=0, base_seqno=None, runs=[{"rebuilt_after": k, "old_base_seqno": base, "at": time.time()}])
    _save_manifest(d, m)
    _tidy(spark, d, m)  # every change and txn file is named after a run past seqno 0: all go
    shutil.rmtree(d.base, ignore_errors=True)


def _change_ddl(m: dict) -> str:
    return C.ddl({**C.JOURNAL_COLUMNS, "txn_crc": "bigint"}, m["fields"] or None)


def _state_cols(m: dict) -> list[str]:
    return ["region", "key_text", *STATE_PAYLOAD, "seqno"] + (["fields"] if m["fields"] else [])


def _events_from_state(df, m: dict):
    from pyspark.sql import functions as F

    return df.select(*_state_cols(m)).withColumn("ord", F.lit(-1)).withColumn("op", F.lit("set"))


def _events_from_changes(df, m: dict):
    return df.select(*_state_cols(m), "ord", "op")


def _fold_to_state(events, m: dict, *, has_base: bool = True):
    from pyspark.sql import functions as F

    payload = [c for c in _state_cols(m) if c not in ("region", "key_text", "seqno")]
    pts, _ = final_state(events, payload, has_base=has_base)
    return pts.where(F.col("op") == "set").select(*_state_cols(m))


def _append(spark, d: _Dirs, m: dict, ref, lo: int, hi: int) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(d.work, ignore_errors=True)
    js, jc = ref_crcs(ref, lo, hi)
    hi = int(js[-1]) if len(js) else lo - 1
    if hi < lo:
        return 0, 0
    updates, _ = write_changes(spark, ref, lo, hi, d.work / "changes", m["fields"])
    old_state = d.state if _has_parquet(d.state) else None
    fold_state(spark, d.work / "changes" if updates else None, old_state, d.work / "state", _state_cols(m),
               m["fields"])
    # Publish: change files (named by run), txn list, state, then the manifest.
    for part in sorted((d.work / "changes").glob("commit_date=*")):
        target = d.changes / part.name
        target.mkdir(parents=True, exist_ok=True)
        for f in part.glob("*.parquet"):
            os.replace(f, target / f"r{hi:020d}-{f.name}")
    d.txns.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"seqno": js, "crc": jc}), d.txns / f"r{hi:020d}.parquet")
    if (d.work / "state").exists():
        _swap_state(d)
    m["last_seqno"] = hi
    m["runs"].append({"from": lo, "to": hi, "updates": updates, "at": time.time()})
    _save_manifest(d, m)
    shutil.rmtree(d.work, ignore_errors=True)
    return len(js), updates


def _has_parquet(p: Path) -> bool:
    return p.exists() and any(p.glob("*.parquet"))


def _swap_state(d: _Dirs) -> None:
    new = d.work / "state"
    old = d.meta / "state.old"
    shutil.rmtree(old, ignore_errors=True)
    if d.state.exists():
        os.replace(d.state, old)
    os.replace(new, d.state)
    shutil.rmtree(old, ignore_errors=True)


def _tidy(spark, d: _Dirs, m: dict) -> None:
    """Repair what an interrupted run left: finish a retraction, drop unpublished change files."""
    if d.intent.exists():
        _finish_retraction(d, json.loads(d.intent.read_text()), m)
    if not d.state.exists() and (d.work / "state").exists():
        os.replace(d.work / "state", d.state)
    last = m["last_seqno"]
    for f in d.changes.glob("commit_date=*/r*.parquet") if d.changes.exists() else []:
        rid = _run_id(f.name)
        if rid is not None and rid > last:
            f.unlink()
    for f in d.txns.glob("r*.parquet") if d.txns.exists() else []:
        rid = _run_id(f.name)
        if rid is not None and rid > last:
            f.unlink()
    shutil.rmtree(d.work, ignore_errors=True)


# -- retraction -----------------------------------------------------------------------------------
def _retract(spark, d: _Dirs, m: dict, k: int, instance: str, *, diverged_after: int | None = None) -> None:
    from pyspark.sql import functions as F

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(d.work, ignore_errors=True)
    changes = spark.read.parquet(str(d.changes))
    gone = changes.where(F.col("seqno") > k).cache()
    dates = sorted(str(r[0]) for r in gone.select("commit_date").distinct().collect())
    # 1. the retracted transactions, for the record
    (gone.groupBy("seqno", "txn_crc", "origin", "commit_time").agg(F.count(F.lit(1)).alias("updates"))
     .withColumn("instance", F.lit(instance)).withColumn("retracted_at", F.current_timestamp())
     .withColumn("diverged_after", F.lit(k if diverged_after is None else diverged_after).cast("bigint"))
     .write.parquet(str(d.work / "retracted")))
    # 2. the state of the affected keys at k
    kept = changes.where(F.col("seqno") <= k)
    points = _materialized(spark, gone.where(F.col("op") != "kill").select("region", "key_text").distinct(),
                           d.work / "points")
    gone_kills = gone.where(F.col("op") == "kill").select("region", "key_text", "seqno", "ord")
    history = _events_from_changes(kept, m)
    if _has_parquet(d.base):
        history = _events_from_state(spark.read.parquet(str(d.base)), m).unionByName(history)
    in_points = history.join(points, ["region", "key_text"], "left_semi")
    under = covered_by(history.where(F.col("op") != "kill"), gone_kills)
    scope = in_points
    if under is not None:
        scope = scope.unionByName(under.drop("k_seqno", "k_ord"))
    scope = _materialized(spark, scope.unionByName(history.where(F.col("op") == "kill")).distinct(),
                          d.work / "scope")
    recomputed = _fold_to_state(scope, m)
    affected = points
    if under is not None:
        affected = _materialized(spark, affected.unionByName(under.select("region", "key_text")).distinct(),
                                 d.work / "affected")
    old_state = spark.read.parquet(str(d.state))
    new_state = (old_state.select(*_state_cols(m)).join(points, ["region", "key_text"], "left_anti")
                 .unionByName(recomputed.join(affected, ["region", "key_text"], "left_semi")))
    new_state.write.parquet(str(d.work / "state"))
    # 3. the kept rows of the affected date partitions
    keep = changes.where(F.col("commit_date").isin(dates) & (F.col("seqno") <= k))
    keep.write.partitionBy("commit_date").parquet(str(d.work / "keep"))
    for day in dates:
        p = d.work / "keep" / f"commit_date={day}"
        p.mkdir(parents=True, exist_ok=True)
        (p / "_KEEP").write_text("")
    gone.unpersist()
    # 4. the txn list up to k
    seq, crc = exported_txns(d)
    mask = seq <= k
    pq.write_table(pa.table({"seqno": seq[mask], "crc": crc[mask]}), d.work / f"r{k:020d}.parquet")
    intent = {"k": k, "dates": dates}
    atomic_write(d.intent, json.dumps(intent).encode())
    _finish_retraction(d, intent, m)


def _materialized(spark, df, path: Path):
    """``df`` written to ``path`` (in the work directory) and read back. The fold uses its input many
    times over (a join per kill-text length, and again inside each), so without this cut Spark planned
    the whole lineage once per use, multiplied: a retraction of a 40-transaction instance planned 741
    broadcast exchanges and 1,310 file scans, and ran out of memory building the broadcasts."""
    df.write.parquet(str(path))
    return spark.read.parquet(str(path))


def _finish_retraction(d: _Dirs, intent: dict, m: dict) -> None:
    """Publish a prepared retraction; idempotent, so an interrupted one is finished by the next run."""
    k = intent["k"]
    for day in intent["dates"]:
        src = d.work / "keep" / f"commit_date={day}"
        if not src.exists():
            continue  # already moved
        dst = d.changes / f"commit_date={day}"
        if dst.exists():
            shutil.rmtree(dst)
        for f in src.glob("*.parquet"):
            os.replace(f, src / f"r{k:020d}-{f.name}")
        os.replace(src, dst)
    # A file of a run past k in a date no retracted row had holds only kept rows (seqno <= k), but its
    # name says "run past k", which _tidy reads as unpublished once the manifest says k: rename it too.
    for f in d.changes.glob("commit_date=*/r*.parquet") if d.changes.exists() else []:
        rid = _run_id(f.name)
        if rid is not None and rid > k:
            os.replace(f, f.parent / f"r{k:020d}-{f.name}")
    if (d.work / "retracted").exists():
        d.retracted.mkdir(parents=True, exist_ok=True)
        for f in (d.work / "retracted").glob("*.parquet"):
            os.replace(f, d.retracted / f"k{k:020d}-{int(time.time() * 1000)}-{f.name}")
        shutil.rmtree(d.work / "retracted")
    txn_new = d.work / f"r{k:020d}.parquet"
    if txn_new.exists():
        for f in d.txns.glob("r*.parquet"):
            f.unlink()
        os.replace(txn_new, d.txns / txn_new.name)
    if (d.work / "state").exists():
        _swap_state(d)
    m["last_seqno"] = k
    m["runs"] = [r for r in m["runs"] if r.get("to", r.get("retracted_after", 0)) <= k] + \
        [{"retracted_after": k, "at": time.time()}]
    _save_manifest(d, m)
    d.intent.unlink()
    shutil.rmtree(d.work, ignore_errors=True)
