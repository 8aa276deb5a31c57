"""Consistent checkpoints of an instance's state at a seqno, and new instances seeded from them.

``snapshot(A, to, at=S)`` writes ``to/state/`` (Parquet, one row per key) and ``to/snapshot.json``
(instance, group, seqno, regions with their schemas, history). The state at S is the replicated
state: unreplicated regions are local to each instance (the journal does not carry them, replicas do
not hold them), so their keys are left out whichever way S is reached, and a replica in sync compares
equal with its primary at every seqno; their definitions stay in ``snapshot.json`` (a seeded instance
gets them empty). It is

- the store (read consistently, see ``state_source``) at its applied seqno P, rolled forward with
  the journal's ``(P, S]`` through :mod:`folding`, when S >= P;
- the journal ``[1, S]`` folded from nothing, when S < P and the journal still starts at seqno 1.

(An earlier S on a pruned journal would need undoing through before-images; it is refused.)

``seed(snapshot, into, name)`` creates an instance whose store holds that state, whose journal starts
at S + 1 and whose instance file carries the source's history up to S, as a secondary: a Source
Server (or ``fold``, or ``apply_record``) then catches it up from seqno S + 1.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..errors import ConfigError, InstanceExists, PipelineError
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from . import columns as C
from .folding import final_state
from .plan import load_paths, ref_bounds, store_regions, with_archive

STATE_PAYLOAD = ["key", "key_bytes", "value", "value_raw", "value_size"]


@dataclass
class SnapshotReport:
    path: str
    instance: str
    seqno: int
    keys: int
    seconds: float


def _journal_ddl(names: list[str], fields: dict) -> str:
    cols = {n: {**C.JOURNAL_COLUMNS, **C.JOURNAL_EXTRA_COLUMNS}[n] for n in names if n != "fields"}
    return C.ddl(cols, fields)


def state_df(spark, instance: str, at: int | None = None, *, with_fields: bool = True,
             payload: list[str] | None = None, archive: str | None = None):
    """``(DataFrame, seqno)``: the replicated state of ``instance`` at ``at`` (default: now, that is the
    later of its journal end and its store's seqno, read from one consistent copy of the store).

    An explicit ``at`` before the store's seqno needs the journal from seqno 1: on a live instance whose
    store is flushed past ``at`` while this runs, a pruned journal makes it a ``PipelineError``.

    Keys of unreplicated regions are left out: they are local to the instance, and the journal, which
    gives the state before the store's seqno, does not carry them (see the module's docstring).

    ``archive`` (the instance's journal archive) supplies the seqnos pruned from the directory's journal,
    so that a state before the store's seqno is folded from seqno 1 of the archive."""
    from pyspark.sql import functions as F

    ref = with_archive(instance, archive)
    if not ref.path:  # a journal archive: no store, the state is the journal folded from seqno 1
        return _archived_state_df(spark, ref, at, with_fields=with_fields, payload=payload)
    lay = Layout.existing(ref.path)
    replicated = sorted(name for name, (repl, _) in store_regions(lay).items() if repl)
    fields = (C.merge_fields(sorted((r, s) for r, s in ref.region_schemas.items() if r in replicated))
              if with_fields else {})
    first, last = ref_bounds(ref)
    if at is not None and at > last:
        raise ConfigError(f"instance {ref.name} ends at seqno {last}; cannot take its state at {at}")
    from .state_source import consistent_store

    store_file = consistent_store(lay)
    store_seqno = _store_seqno(store_file)
    # "Now" is the store copy's seqno when a live instance flushed its store past the journal end read
    # above (the journal always holds the store's seqno): the store alone, no journal read, no pruning.
    at = max(last, store_seqno) if at is None else at
    cols = ["region", "key_text", *(payload or STATE_PAYLOAD)] + (["fields"] if fields else [])
    jcols = ["seqno", "ord", "op", *cols]
    journal = (spark.read.format("multisite").schema(_journal_ddl(jcols, fields)).load(load_paths(ref)))
    if at >= store_seqno:
        base = _store_base(spark, ref, store_file, store_seqno, cols, fields, replicated)
        if at == store_seqno:
            return base.select(*cols), at
        events = base.select(*jcols).unionByName(
            journal.where((F.col("seqno") > store_seqno) & (F.col("seqno") <= at)).select(*jcols))
        has_base = True
    elif first == 1:
        events = journal.where(F.col("seqno") <= at).select(*jcols)
        has_base = False
    else:
        raise PipelineError(f"the state of {ref.name} at seqno {at} is before its store's seqno {store_seqno} and "
                            f"its journal was pruned (it starts at {first}); give its journal archive "
                            f"(--archive URL), or take the snapshot at {store_seqno} or later")
    pts, _ = final_state(events, [c for c in cols if c not in ("region", "key_text")], has_base=has_base)
    return pts.where(F.col("op") == "set").select(*cols), at


def _store_seqno(store_file: str) -> int:
    """The applied seqno of the consistent store copy ``store_file`` (0 when it has applied none).

    Read from the copy, not the live store: the copy is what the state is read from, and a live instance
    may have flushed its store further since."""
    from .state_source import _ro

    conn = _ro(store_file)
    try:
        row = conn.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
        return row[0] if row else 0
    finally:
        conn.close()


def _store_base(spark, ref, store_file: str, store_seqno: int, cols: list[str], fields: dict,
                replicated: list[str]):
    """The store copy's replicated keys as ``set`` events at ``store_seqno`` (``ord`` -1), the base on
    which ``final_state`` folds the journal's later records."""
    from pyspark.sql import functions as F

    all_state = {**C.STATE_COLUMNS, **C.STATE_EXTRA_COLUMNS}
    return (spark.read.format("multisite_state")
            .schema(C.ddl({n: all_state[n] for n in cols if n != "fields"}, fields))
            .option("store_files", json.dumps({ref.name: store_file}))
            .option("regions", ",".join(replicated)).load(ref.path)
            .where(F.col("region").isin(replicated) if replicated else F.lit(False))
            .withColumn("seqno", F.lit(store_seqno).cast("bigint"))
            .withColumn("ord", F.lit(-1)).withColumn("op", F.lit("set")))


def _archived_state_df(spark, ref, at: int | None, *, with_fields: bool, payload: list[str] | None):
    """``state_df`` of a journal archive: its journal ``[1, at]`` folded (the archive must start at 1)."""
    from pyspark.sql import functions as F

    first, last = ref_bounds(ref)
    at = last if at is None else at
    if at > last:
        raise ConfigError(f"the journal archive {ref.archive} of {ref.name} ends at seqno {last}; cannot take its "
                          f"state at {at}")
    if first != 1 and at >= first:
        raise PipelineError(f"the journal archive {ref.archive} starts at seqno {first}: the state at {at} needs the "
                            f"journal from seqno 1 (or the instance's store: give its directory)")
    fields = C.merge_fields(sorted(ref.region_schemas.items())) if with_fields else {}
    cols = ["region", "key_text", *(payload or STATE_PAYLOAD)] + (["fields"] if fields else [])
    jcols = ["seqno", "ord", "op", *cols]
    events = (spark.read.format("multisite").schema(_journal_ddl(jcols, fields)).load(ref.archive)
              .where(F.col("seqno") <= at).select(*jcols))
    pts, _ = final_state(events, [c for c in cols if c not in ("region", "key_text")], has_base=False)
    return pts.where(F.col("op") == "set").select(*cols), at


def snapshot(instance: str, to: str, *, at: int | None = None, spark=None, progress=None,
             archive: str | None = None) -> SnapshotReport:
    """Write the state of ``instance`` at seqno ``at`` (default: now) to ``to`` as Parquet.

    ``archive`` is the instance's journal archive, read for the seqnos pruned from its directory."""
    from .env import session

    t0 = time.time()
    spark = spark or session()
    dest = Path(to).absolute()
    if dest.exists() and any(dest.iterdir()):
        raise InstanceExists(f"snapshot destination {dest} exists and is not empty; choose a new directory")
    ref = with_archive(instance, archive)
    if not ref.path:
        raise ConfigError(f"{instance} is a journal archive: a snapshot (to seed a replica from) needs the instance "
                          f"directory, whose history it carries; give the directory, with the archive as "
                          f"--archive {instance}")
    lay = Layout.existing(ref.path)
    info = ifile.load(lay.instance_file)
    df, seqno = state_df(spark, instance, at, archive=archive)
    if progress:
        progress(f"writing the state of {ref.name} at seqno {seqno}")
    df.write.parquet(str(dest / "state"))
    keys = spark.read.parquet(str(dest / "state")).count()
    regions = {name: {"replicated": repl, "schema": schema} for name, (repl, schema) in store_regions(lay).items()}
    meta = {"format": 1, "instance": ref.name, "group": info.group, "seqno": seqno, "keys": keys,
            "regions": regions, "created": time.time(),
            "history": [msgspec.to_builtins(h) for h in info.history if h.start_seqno <= seqno]}
    (dest / "snapshot.json").write_text(json.dumps(meta, indent=2))
    return SnapshotReport(str(dest), ref.name, seqno, keys, time.time() - t0)


def load_meta(snap: str) -> dict:
    p = Path(snap) / "snapshot.json"
    if not p.exists():
        raise ConfigError(f"{snap} is not a multisite snapshot (no snapshot.json); make one with "
                          f"`multisite pipeline snapshot INSTANCE --to {snap}`")
    return json.loads(p.read_text())


@dataclass
class SeedReport:
    path: str
    name: str
    seqno: int
    keys: int
    seconds: float


def seed(snap: str, into: str, *, name: str, batch_rows: int = 100_000, progress=None) -> SeedReport:
    """Create instance ``into`` named ``name`` holding the snapshot's state at its seqno."""
    import pyarrow.dataset as ds

    from ..engine import create
    from ..journal.writer import create_segment
    from ..store.sqlite import Store

    t0 = time.time()
    meta = load_meta(snap)
    seqno = int(meta["seqno"])
    root = create(into, name=name, group=meta["group"])
    lay = Layout.existing(root)
    for seg in lay.journal.glob("*.msj"):
        seg.unlink()
    create_segment(lay.journal, 1, seqno + 1, 0)
    store = Store(lay.store_file)
    rids = {}
    for rname, r in sorted(meta["regions"].items()):
        rids[rname] = store.create_region(rname, bool(r["replicated"]), r.get("schema")).id
    keys = 0
    data = ds.dataset(str(Path(snap) / "state"), format="parquet")
    for batch in data.to_batches(columns=["region", "key_bytes", "value_raw"], batch_size=batch_rows):
        regions, kbs, vbs = (batch.column(i).to_pylist() for i in range(3))
        for rname in set(regions):
            if rname not in rids:
                rids[rname] = store.create_region(rname, True).id
        store._begin()
        store.conn.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                               zip([rids[r] for r in regions], kbs, vbs))
        keys += batch.num_rows
        if progress:
            progress(f"seeded {keys:,} keys")
    store.mark_applied(seqno, list(rids))
    store.flush()
    store.close()
    inst = ifile.load(lay.instance_file)
    inst.seqno = seqno
    inst.role = "secondary"
    inst.receiving_from = meta["instance"]
    inst.history = [ifile.HistoryRecord(**h) for h in meta["history"]]
    ifile.save(lay.instance_file, inst)
    return SeedReport(str(root), name, seqno, keys, time.time() - t0)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
