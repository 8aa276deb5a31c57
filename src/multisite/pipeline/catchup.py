"""Bulk catch-up: fold a journal range into the final state per key and apply it to a far-behind replica.

A replica at seqno R would replay transactions R+1..T one by one; ``fold`` instead computes, with
Spark, the net effect of the source's journal range (``folding``: the surviving sets and zkills, and
the kills) and applies it to the replica's store in one SQLite transaction: kills first (they only
delete), then every surviving point (a point survives only if no later kill covers it, so applying
points after kills is right). The store is then at T; the replica's journal segments up to R move to
``journal-before-fold-T/`` and a new segment starts at T + 1, exactly like a journal pruned below
T + 1, so the instance opens consistent at T and replication continues from T + 1.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, JournalGap
from ..fsutil import fsync_dir
from ..instance import instance_file as ifile
from ..instance.layout import InstanceLock, Layout
from ..journal.segments import list_segments
from ..journal.sidecars import drop_segments
from . import columns as C
from .folding import final_state
from .plan import instance_ref, journal_bounds, store_regions

APPLY_BATCH_ROWS = 50_000


@dataclass
class FoldReport:
    source: str
    replica: str
    from_seqno: int
    to_seqno: int
    updates_read: int
    kills: int
    points: int
    seconds: float


def fold(source: str, replica: str, from_seqno: int | None = None, to_seqno: int | None = None, *,
         spark=None, progress=None) -> FoldReport:
    """Bring ``replica`` (closed, at seqno ``from_seqno - 1``) to ``to_seqno`` from ``source``'s journal."""
    from pyspark.sql import functions as F

    from ..store.sqlite import Store
    from .env import session

    t0 = time.time()
    rlay = Layout.existing(replica)
    lock = InstanceLock(rlay)
    lock.acquire()
    try:
        store = Store(rlay.store_file)
        r_seqno = store.applied_seqno
        first, last = journal_bounds(str(rlay.root))
        if last != r_seqno:
            store.close()
            raise ConfigError(f"replica {rlay.root} has journal records past its store (seqno {last} vs "
                              f"{r_seqno}); open it once so that recovery rolls its store forward, then fold")
        lo = r_seqno + 1 if from_seqno is None else from_seqno
        if lo != r_seqno + 1:
            store.close()
            raise ConfigError(f"replica {rlay.root} is at seqno {r_seqno}: the fold must start at {r_seqno + 1}, "
                              f"not {lo}")
        ref = instance_ref(source)
        s_first, s_last = journal_bounds(ref.path)
        hi = s_last if to_seqno is None else to_seqno
        if hi < r_seqno:  # before any Spark read: fold only moves a replica forward
            store.close()
            if to_seqno is not None:
                raise ConfigError(f"replica {rlay.root} is already at seqno {r_seqno}, past --to {hi}: fold only "
                                  f"brings a replica forward; give --to {r_seqno} or later (or leave it out), or, "
                                  f"to take the replica back to {hi}, roll it back instead (multisite rollback "
                                  f"{rlay.root} --resync {hi})")
            raise ConfigError(f"replica {rlay.root} is already at seqno {r_seqno} and source {ref.name} ends at "
                              f"{s_last}: there is nothing to fold, and a replica ahead of its source must be rolled "
                              f"back to their common point first (multisite rollback {rlay.root} --resync SEQNO)")
        if hi > s_last or lo < s_first:
            store.close()
            raise JournalGap(f"source {ref.name} holds seqnos {s_first}..{s_last}; cannot fold {lo}..{hi}")
        if hi == r_seqno:  # nothing to fold: leave the replica (and its journal) as it is
            store.close()
            return FoldReport(source, str(rlay.root), lo, hi, 0, 0, 0, time.time() - t0)
        spark = spark or session()
        if progress:
            progress(f"folding {ref.name} seqnos {lo}..{hi} into {rlay.root}")
        cols = {"seqno": "bigint", "ord": "int", "op": "string", "region": "string", "key_text": "string",
                "key_bytes": "binary", "value_raw": "binary"}
        events = (spark.read.format("multisite").schema(C.ddl(cols)).option("from_seqno", lo)
                  .option("to_seqno", hi).load(ref.path))
        pts, kills = final_state(events, ["key_bytes", "value_raw"], has_base=False)
        kill_rows = events.where(F.col("op") == "kill").select("region", "key_bytes").distinct()
        n_updates = events.count()
        src_regions = store_regions(Layout.existing(ref.path))

        def rid(name: str) -> int:
            r = store.regions.get(name)
            if r is None:
                repl, schema = src_regions.get(name, (True, None))
                r = store.create_region(name, repl, schema)
            return r.id

        n_kills = 0
        for row in kill_rows.toLocalIterator():
            store.delete_subtree(rid(row["region"]), bytes(row["key_bytes"]))
            n_kills += 1
        n_points = 0
        for row in pts.select("region", "op", "key_bytes", "value_raw").toLocalIterator(prefetchPartitions=True):
            r, kb = rid(row["region"]), bytes(row["key_bytes"])
            if row["op"] == "set":
                store.put(r, kb, bytes(row["value_raw"]))
            else:
                store.delete(r, kb)
            n_points += 1
            if progress and n_points % APPLY_BATCH_ROWS == 0:
                progress(f"applied {n_points:,} keys")
        touched = set(store.regions)
        store.mark_applied(hi, touched)
        store.flush()  # then the journal: see DESIGN.md on an interrupted fold
        store.close()
        _restart_journal(rlay, hi)
        inst = ifile.load(rlay.instance_file)
        inst.seqno = hi
        src_info = ifile.load(Layout.existing(ref.path).instance_file)
        for h in src_info.history:
            if lo <= h.start_seqno <= hi:
                inst.history.append(h)
        ifile.save(rlay.instance_file, inst)
    finally:
        lock.release()
    return FoldReport(source, str(rlay.root), lo, hi, n_updates, n_kills, n_points, time.time() - t0)


def _restart_journal(lay: Layout, last: int) -> None:
    """Move the replica's segments aside and start a new one at ``last + 1`` (as if pruned)."""
    from ..journal.writer import create_segment

    segs = list_segments(lay.journal)
    aside = lay.root / f"journal-before-fold-{last}"
    aside.mkdir(exist_ok=True)
    drop_segments(lay.journal, [s.index for s in segs])  # their journal-index pieces: of no use any more
    for s in segs:
        os.replace(s.path, aside / s.path.name)
    fsync_dir(aside)
    create_segment(lay.journal, segs[-1].index + 1, last + 1, segs[-1].index)
    fsync_dir(lay.journal)
    Path(aside, "README").write_text(f"Journal segments of this instance before `multisite pipeline fold` brought it "
                                     f"to seqno {last}. They are no longer needed to open it.\n")
