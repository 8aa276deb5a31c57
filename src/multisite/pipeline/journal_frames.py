"""The journal as a DataFrame at Parquet speed, for the pipeline's own jobs and for users who want it.

``format("multisite")`` hands Spark Arrow batches from Python, and Spark converts every row of every
column of the source's schema (no column pruning reaches a Python source): a floor of about 2.5 us
per row for the default schema, whatever the source does. The journal index (``segment_index``)
holds the same rows as Parquet pieces, which Spark's own reader scans vectorized, reading only the
columns a query uses. So:

- :func:`index_journal` writes the missing pieces of a seqno range as a Spark job (one task per run
  of frames, nothing sent back to the JVM but a count), or in this process without Spark;
- :func:`journal_df` is the rows of ``format("multisite")`` for one instance, with the same columns
  and values: its pieces through ``spark.read.parquet`` and the frames without a piece (the newest
  ones, typically) through the Python source.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from . import columns as C
from .plan import InstanceRef, chunks, instance_ref
from .segment_index import INDEX_MIN_BYTES, PIECE_COLUMNS, index_fields, piece_fields_serve

DEFAULT_COLUMNS = list(C.JOURNAL_COLUMNS)

# Local worker processes of ``index_journal``: one per usable core (the affinity mask, not the host's
# cores, which a container or a shared machine does not give), at most INDEX_JOBS_MAX, and no more than
# the available memory holds at INDEX_WORKER_BYTES each (a worker decoding a sealed 64 MiB segment
# peaks near 300 MiB; the bound keeps twice that).
INDEX_JOBS_MAX = 8
INDEX_WORKER_BYTES = 600 * 1024 * 1024


@dataclass
class IndexReport:
    instance: str
    pieces_written: int
    frames: int
    rows: int
    seconds: float
    jobs: int = 1
    notes: list[str] = field(default_factory=list)  # e.g. a worker that died and what was done instead

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_index_jobs(available_bytes: int | None = None, cores: int | None = None) -> int:
    """The local worker processes ``index_journal`` starts when not told (see INDEX_JOBS_MAX)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    jobs = min(cores, INDEX_JOBS_MAX)
    if available_bytes is not None:
        jobs = min(jobs, available_bytes // INDEX_WORKER_BYTES)
    return max(1, jobs)


def run_workers(fn: Callable[[Any], Any], items: list, jobs: int) -> tuple[list, list[str]]:
    """``fn`` of each item in ``jobs`` spawned processes, results in order, and notes. A worker that
    dies (killed: the out-of-memory killer under load, a signal) breaks the whole pool
    (``BrokenProcessPool``): what it finished is kept, and what it left is done here, one at a time,
    and said so in the notes. An exception ``fn`` raises is raised as it is."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    out: list = [None] * len(items)
    left: list[int] = []
    # spawn: the caller may hold threads (Spark's gateway, Arrow's pools) that fork would copy mid-lock
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(fn, it) for it in items]
        for i, f in enumerate(futures):
            try:
                out[i] = f.result()
            except BrokenProcessPool:
                left.append(i)
    notes = []
    if left:
        notes.append(f"a worker process died ({jobs} were running; killed by a signal or the out-of-memory "
                     f"killer, see `dmesg`); the {len(left)} run(s) not done were indexed in this process, one "
                     f"at a time (--jobs 1 does so from the start)")
        for i in left:
            out[i] = fn(items[i])
    return out, notes


def _index_one(args) -> tuple[int, int]:
    """Decode one chunk and write its piece (runs in a Spark task or a worker process)."""
    import pyarrow as pa

    from .segment_index import index_chunk

    chunk, region_schemas = args
    target = pa.schema([pa.field("seqno", pa.int64())])
    rows = sum(b.num_rows for b in index_chunk(chunk, target, regions=None, region_schemas=region_schemas,
                                               fields={}))
    return chunk.last_seqno - chunk.first_seqno + 1, rows


def index_journal(instance: str, *, from_seqno: int = 1, to_seqno: int | None = None, spark=None,
                  jobs: int | None = None, index_min_bytes: int = INDEX_MIN_BYTES) -> IndexReport:
    """Write the journal-index pieces missing for seqnos ``from_seqno..to_seqno`` of ``instance``:
    on Spark when ``spark`` is given, else in ``jobs`` local processes (default: the cores)."""
    import time

    t0 = time.time()
    ref = instance_ref(instance)
    todo = [(c, ref.region_schemas) for c in chunks(ref, from_seqno, to_seqno, index="auto",
                                                      index_min_bytes=index_min_bytes) if c.write_piece]
    notes: list[str] = []
    if jobs is not None and jobs < 1:
        from ..errors import ConfigError
        raise ConfigError(f"jobs must be 1 or more, got {jobs}")
    jobs = min(jobs or default_index_jobs(_available_bytes()), max(1, len(todo)))
    if not todo:
        done = []
    elif spark is not None:
        done = spark.sparkContext.parallelize(todo, len(todo)).map(_index_one).collect()
    elif jobs == 1:
        done = [_index_one(t) for t in todo]
    else:
        done, notes = run_workers(_index_one, todo, jobs)
    return IndexReport(ref.name, len(done), sum(f for f, _ in done), sum(r for _, r in done), time.time() - t0,
                       jobs, notes)


def _ddl(columns: list[str], fields: dict) -> str:
    every = {**C.JOURNAL_COLUMNS, **C.JOURNAL_EXTRA_COLUMNS}
    return C.ddl({n: every[n] for n in columns if n != "fields"}, fields if "fields" in columns else None)


def journal_df(spark, instance: str | InstanceRef, columns: list[str] | None = None, *, from_seqno: int = 1,
               to_seqno: int | None = None, regions: frozenset | None = None, index: str = "auto"):
    """The rows ``spark.read.format("multisite")`` gives for ``instance`` (columns ``columns``, default
    the default schema's), reading journal-index pieces with Spark's Parquet reader."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    ref = instance if isinstance(instance, InstanceRef) else instance_ref(instance)
    fields = C.merge_fields(sorted((r, s) for r, s in ref.region_schemas.items() if regions is None or r in regions))
    cols = list(columns or DEFAULT_COLUMNS + (["fields"] if fields else []))
    lo, hi = from_seqno, to_seqno
    pfields = index_fields(ref.region_schemas)
    native: list[str] = []  # piece paths read by Spark
    gaps: list[list[int]] = []  # seqno ranges left to the Python source
    cut = False  # does a piece hold seqnos outside [lo, hi]?
    for c in chunks(ref, lo, hi, index="read" if index != "off" else "off"):
        ok = bool(c.piece)
        cut = cut or (ok and (c.piece_first < c.first_seqno or c.piece_last > c.last_seqno))
        if ok and "fields" in cols:  # a piece whose ``fields`` cannot give these is read as a gap
            meta = pq.read_schema(c.piece).metadata or {}
            ok = piece_fields_serve(json.loads(meta.get(b"multisite.index", b"{}")), ref.region_schemas, fields)
        if ok:
            native.append(c.piece)
        elif gaps and gaps[-1][1] == c.first_seqno - 1:
            gaps[-1][1] = c.last_seqno
        else:
            gaps.append([c.first_seqno, c.last_seqno])
    parts = []
    if native:
        piece_cols = {n: t for n, t in PIECE_COLUMNS.items()}
        df = spark.read.schema(C.ddl(piece_cols, pfields or None)).parquet(*native)
        if cut:
            cond = F.col("seqno") >= lo
            df = df.where(cond & (F.col("seqno") <= hi) if hi is not None else cond)
        if regions is not None:
            df = df.where(F.col("region").isin(sorted(regions)))
        sel = []
        for n in cols:
            if n == "instance":
                sel.append(F.lit(ref.name).alias("instance"))
            elif n == "fields":
                sel.append(F.struct(*[F.col(f"fields.`{f}`").alias(f) for f in fields]).alias("fields"))
            else:
                sel.append(F.col(n))
        parts.append(df.select(*sel))
    for a, b in gaps:
        r = (spark.read.format("multisite").schema(_ddl(cols, fields)).option("from_seqno", a)
             .option("to_seqno", b).option("index", index))
        if regions is not None:
            r = r.option("regions", ",".join(sorted(regions)))
        parts.append(r.load(ref.path).select(*cols))
    if not parts:
        return spark.createDataFrame([], _ddl(cols, fields))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out
