"""Bulk catch-up: fold a journal range into the final state per key and apply it to a far-behind replica.

A replica at seqno R would replay transactions R+1..T one by one; ``fold`` instead computes, with
Spark, the net effect of the source's journal range (``folding``: the surviving sets and zkills, and
the kills) and applies it to the replica's store in one SQLite transaction: kills first (they only
delete), then every surviving point (a point survives only if no later kill covers it, so applying
points after kills is right). The store is then at T; the replica's journal segments up to R move to
``journal-before-fold-T/`` and a new segment starts at T + 1, exactly like a journal pruned below
T + 1, so the instance opens consistent at T and replication continues from T + 1.

The replica must hold the source's transactions up to R (checked as a Receiver Server's handshake
would, see ``_check_same_history``); it then adopts the source's history records up to T.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, HistoryMismatch, JournalGap
from ..fsutil import fsync_dir
from ..instance import instance_file as ifile
from ..instance.layout import InstanceLock, Layout
from ..journal.reader import iter_records
from ..journal.segments import list_segments
from ..journal.sidecars import drop_segments
from ..replication.history import common_point, to_entries, to_records
from . import columns as C
from .folding import final_state
from .plan import journal_bounds, load_paths, ref_bounds, store_regions, with_archive

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
         spark=None, progress=None, archive: str | None = None) -> FoldReport:
    """Bring ``replica`` (closed, at seqno ``from_seqno - 1``) to ``to_seqno`` from ``source``'s journal.

    ``archive`` is the source's journal archive: the seqnos it holds are read from it, the rest from the
    source's directory (``plan.with_archive``, as ``export --archive``). The source must be a directory:
    the replica adopts its history records, which only the instance keeps.

    Refused (``HistoryMismatch``) when the replica's transactions up to its seqno are not the source's,
    and (``ConfigError``) when ``to_seqno`` is below the replica's seqno; ``to_seqno`` equal to it does nothing."""
    from ..store.sqlite import Store
    from .env import session

    t0 = time.time()
    rlay = Layout.existing(replica)
    lock = InstanceLock(rlay)
    lock.acquire()
    try:
        store = Store(rlay.store_file)
        try:  # nothing is written before the range is agreed, so closing (which flushes) is harmless
            ref, lo, hi = _fold_range(source, archive, rlay, store.applied_seqno, from_seqno, to_seqno)
        except (ConfigError, JournalGap, HistoryMismatch):
            store.close()
            raise
        if hi == store.applied_seqno:  # nothing to fold: leave the replica (and its journal) as it is
            store.close()
            return FoldReport(source, str(rlay.root), lo, hi, 0, 0, 0, time.time() - t0)
        spark = spark or session()
        if progress:
            progress(f"folding {ref.name} seqnos {lo}..{hi} into {rlay.root}")
        n_updates, n_kills, n_points = _apply_fold(spark, ref, lo, hi, store, progress)
        store.mark_applied(hi, set(store.regions))
        store.flush()  # then the journal: see DESIGN.md on an interrupted fold
        store.close()
        _restart_journal(rlay, hi)
        _adopt_history(rlay, ref, hi)
    finally:
        lock.release()
    return FoldReport(source, str(rlay.root), lo, hi, n_updates, n_kills, n_points, time.time() - t0)


def _fold_range(source: str, archive: str | None, rlay: Layout, r_seqno: int, from_seqno: int | None,
                to_seqno: int | None):
    """The source and the seqnos ``lo..hi`` to fold onto the replica at ``r_seqno``: ``(ref, lo, hi)``.

    Every refusal is decided here, before any Spark read and before the replica's store is written: the
    replica's journal must not run past its store, the fold must start right after the replica's seqno,
    only move it forward, stay within what the source holds, and continue the source's own history."""
    first, last = journal_bounds(str(rlay.root))
    if last != r_seqno:
        raise ConfigError(f"replica {rlay.root} has journal records past its store (seqno {last} vs "
                          f"{r_seqno}); open it once so that recovery rolls its store forward, then fold")
    lo = r_seqno + 1 if from_seqno is None else from_seqno
    if lo != r_seqno + 1:
        raise ConfigError(f"replica {rlay.root} is at seqno {r_seqno}: the fold must start at {r_seqno + 1}, "
                          f"not {lo}")
    ref = with_archive(source, archive)
    if not ref.path:
        raise ConfigError(f"{source} is a journal archive: fold needs the source's instance directory (the "
                          f"replica adopts its history records); give the directory, with the archive as "
                          f"--archive {source}")
    s_first, s_last = ref_bounds(ref)
    hi = s_last if to_seqno is None else to_seqno
    if hi < r_seqno:  # before any Spark read: fold only moves a replica forward
        _refuse_backwards(rlay, r_seqno, ref.name, s_last, hi, explicit=to_seqno is not None)
    if hi > s_last or lo < s_first:
        raise JournalGap(f"source {ref.name} holds seqnos {s_first}..{s_last}; cannot fold {lo}..{hi}")
    # against the directory's own journal (or, past it, the history records), not the archive
    _check_same_history(ref.name, Layout.existing(ref.path), *journal_bounds(ref.path), rlay, first, r_seqno)
    return ref, lo, hi


def _refuse_backwards(rlay: Layout, r_seqno: int, src_name: str, s_last: int, hi: int, *, explicit: bool) -> None:
    """Refuse a fold that would end below the replica's seqno, saying whether ``--to`` or the source is why."""
    if explicit:
        raise ConfigError(f"replica {rlay.root} is already at seqno {r_seqno}, past --to {hi}: fold only "
                          f"brings a replica forward; give --to {r_seqno} or later (or leave it out), or, "
                          f"to take the replica back to {hi}, roll it back instead (multisite rollback "
                          f"{rlay.root} --resync {hi})")
    raise ConfigError(f"replica {rlay.root} is already at seqno {r_seqno} and source {src_name} ends at "
                      f"{s_last}: there is nothing to fold, and a replica ahead of its source must be rolled "
                      f"back to their common point first (multisite rollback {rlay.root} --resync SEQNO)")


def _apply_fold(spark, ref, lo: int, hi: int, store, progress) -> tuple[int, int, int]:
    """Fold the source's ``lo..hi`` with Spark and apply it to ``store``: ``(updates read, kills, points)``.

    Kills are applied first (they only delete), then every surviving point; nothing is committed here."""
    from pyspark.sql import functions as F

    cols = {"seqno": "bigint", "ord": "int", "op": "string", "region": "string", "key_text": "string",
            "key_bytes": "binary", "value_raw": "binary"}
    events = (spark.read.format("multisite").schema(C.ddl(cols)).option("from_seqno", lo)
              .option("to_seqno", hi).load(load_paths(ref)))
    pts, _kills = final_state(events, ["key_bytes", "value_raw"], has_base=False)
    kill_rows = events.where(F.col("op") == "kill").select("region", "key_bytes").distinct()
    n_updates = events.count()
    rid = _region_ids(store, store_regions(Layout.existing(ref.path)))
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
    return n_updates, n_kills, n_points


def _region_ids(store, src_regions: dict):
    """A lookup from region name to the replica's region id, creating a region the replica lacks with the
    source's replication flag and schema (a fold may bring the first keys of a region)."""

    def rid(name: str) -> int:
        r = store.regions.get(name)
        if r is None:
            repl, schema = src_regions.get(name, (True, None))
            r = store.create_region(name, repl, schema)
        return r.id

    return rid


def _adopt_history(rlay: Layout, ref, hi: int) -> None:
    """Record the replica at ``hi`` with the source's history records up to ``hi``.

    The replica now holds a prefix of the source's history: adopting it, as a Receiver Server does after
    its handshake, lets the next fold (or replication) check it."""
    inst = ifile.load(rlay.instance_file)
    inst.seqno = hi
    src_info = ifile.load(Layout.existing(ref.path).instance_file)
    inst.history = to_records([e for e in to_entries(src_info.history) if e.start_seqno <= hi], ref.name)
    ifile.save(rlay.instance_file, inst)


def _same_txn(rec) -> tuple:
    """What identifies a transaction on every instance that holds it (before-images are each store's own)."""
    return (rec.seqno, rec.origin, rec.time, [(u.op, u.region, tuple(u.key), u.value) for u in rec.updates])


def _first_difference(src_journal: Path, rep_journal: Path, start: int, end: int) -> int:
    """The first seqno in ``[start, end]`` where the two journals hold different transactions."""
    for a, b in zip(iter_records(src_journal, start, end), iter_records(rep_journal, start, end)):
        if _same_txn(a) != _same_txn(b):
            return a.seqno
    return end


def _check_same_history(src_name: str, slay: Layout, s_first: int, s_last: int, rlay: Layout, r_first: int,
                        r_seqno: int) -> None:
    """Refuse a replica whose seqno ``r_seqno`` is not a point of the source's history.

    Folding the source's ``r_seqno + 1..`` onto a replica that took other transactions up to ``r_seqno``
    (the source rolled back below it and committed others, or the replica was some other instance's)
    would mix two histories and still mark it consistent. When both journals still hold transaction
    ``r_seqno`` it is compared itself (the strongest evidence: it also covers a replica filled through
    ``apply_record``, which keeps no history records); otherwise the history records are compared the
    way the replication handshake does (``common_point``)."""
    if r_seqno == 0:
        return
    rep_name = ifile.load(rlay.instance_file).name
    if r_first <= r_seqno and s_first <= r_seqno <= s_last:
        theirs = next(iter_records(slay.journal, r_seqno, r_seqno))
        mine = next(iter_records(rlay.journal, r_seqno, r_seqno))
        if _same_txn(theirs) == _same_txn(mine):
            return
        start = max(r_first, s_first)
        differ = _first_difference(slay.journal, rlay.journal, start, r_seqno)
        where = f"from seqno {differ}" if differ > start else f"at seqno {differ} (or before: the journals start there)"
    else:
        src_hist = to_entries(ifile.load(slay.instance_file).history)
        rep_hist = to_entries(ifile.load(rlay.instance_file).history)
        common = common_point(src_hist, s_last, rep_hist, r_seqno)
        if common >= r_seqno:
            return
        differ = common + 1
        where = f"from seqno {differ} (their history records agree up to {common})"
    common = differ - 1
    raise HistoryMismatch(
        f"replica {rep_name} ({rlay.root}) is at seqno {r_seqno} but does not hold source {src_name}'s "
        f"transactions: they differ {where} ({src_name} was rolled back and took other transactions, or "
        f"{rep_name} did). Folding would apply {src_name}'s later transactions on top of the others. Roll "
        f"{rep_name} back to seqno {common} first (multisite rollback {rlay.root} --resync {common}, or "
        f"--fetchresync HOST:PORT against {src_name}; it needs {rep_name}'s journal from {common + 1}), or seed it "
        f"anew (multisite pipeline snapshot {slay.root} --to SNAP, then multisite pipeline seed SNAP), then fold",
        source=src_name, replica=rep_name, common_seqno=common)


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
