"""Change-table files written straight from journal chunks: Arrow to Parquet in Spark tasks.

An export's new rows are a seqno range of the journal, columns and all. Handing them to Spark from
the Python source and letting Spark write them would convert every row twice (Arrow to Spark rows,
rows to Parquet); instead Spark tasks take the chunks' Arrow batches (from their journal-index
pieces, or decoded, writing the pieces: grouped like the source's partitions, a chunk to decode
alone) and write them with pyarrow, one file per task and commit date, under
``commit_date=YYYY-MM-DD/`` (the layout ``partitionBy`` gives; dates in UTC, as the session's).
Nothing but a row count and the dates goes back to the driver.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from . import columns as C
from .plan import PARTITION_BYTES, InstanceRef, chunks, group_chunks

CHANGE_FILE_ROW_GROUP_ROWS = 131_072
_US_PER_DAY = 86_400_000_000
_EPOCH = dt.date(1970, 1, 1)


def change_columns(fields: dict) -> list[str]:
    return [*C.JOURNAL_COLUMNS, "txn_crc"] + (["fields"] if fields else [])


def _write_one(args) -> tuple[int, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .segment_index import PIECE_COMPRESSION, PIECE_DICTIONARY_COLUMNS, chunk_batches, journal_schema

    i, group, region_schemas, fields, dest = args
    target = journal_schema(change_columns(fields), fields)
    writers: dict[str, pq.ParquetWriter] = {}
    rows = 0
    batches = (b for chunk in group
               for b in chunk_batches(chunk, target, regions=None, region_schemas=region_schemas, fields=fields))
    try:
        for batch in batches:
            us = batch.column("commit_time").cast(pa.int64()).to_numpy(zero_copy_only=False)
            days = us // _US_PER_DAY
            lo, hi = int(days.min()), int(days.max())
            for dn in range(lo, hi + 1):
                part = batch if lo == hi else batch.filter(pa.array(days == dn))
                if not part.num_rows:
                    continue
                day = (_EPOCH + dt.timedelta(days=dn)).isoformat()
                w = writers.get(day)
                if w is None:
                    d = Path(dest) / f"commit_date={day}"
                    d.mkdir(parents=True, exist_ok=True)
                    w = writers[day] = pq.ParquetWriter(d / f"part-{i:05d}.parquet", target,
                                                        compression=PIECE_COMPRESSION,
                                                        use_dictionary=[c for c in PIECE_DICTIONARY_COLUMNS
                                                                        if c in target.names] + ["instance"])
                w.write_batch(part, row_group_size=CHANGE_FILE_ROW_GROUP_ROWS)
            rows += batch.num_rows
    finally:
        for w in writers.values():
            w.close()
    return rows, sorted(writers)


def write_changes(spark, ref: InstanceRef, lo: int, hi: int, dest: Path, fields: dict) -> tuple[int, list[str]]:
    """Write the journal rows of seqnos ``lo..hi`` under ``dest``; ``(rows, commit dates)``."""
    cs = chunks(ref, lo, hi, index="auto", strict_start=True)
    groups = group_chunks(cs, PARTITION_BYTES, os.cpu_count() or 2)  # each task costs ~0.1 s: few of them
    tasks = [(i, g, ref.region_schemas, fields, str(dest)) for i, g in enumerate(groups)]
    if not tasks:
        return 0, []
    done = spark.sparkContext.parallelize(tasks, len(tasks)).map(_write_one).collect()
    return sum(r for r, _ in done), sorted({d for _, ds in done for d in ds})
