"""The data pipeline on Spark: the journal and the state as Spark sources, and bulk jobs over them.

Nothing here imports pyspark until it is used, so ``import multisite`` stays light::

    from multisite import pipeline
    spark = pipeline.session()                       # local[*], quiet, sources registered
    df = spark.read.format("multisite").load("/data/A")
    pipeline.export("/data/A", "/lake/A")            # analytics replica (Parquet), incremental
    pipeline.snapshot("/data/A", "/snap/A", at=1000) # state at a seqno as Parquet
    pipeline.seed("/snap/A", "/data/C", name="C")    # a new replica from a snapshot
    pipeline.verify("/data/A", "/data/B")            # keys that differ
    pipeline.fold("/data/A", "/data/B", 1001, 5000)  # bring B from 1000 to 5000 in bulk
    pipeline.journal_df(spark, "/data/A")            # the journal's rows at Parquet speed (its index)
    (spark.readStream.format("multisite").load("/data/A").writeStream   # a change table kept current,
     .foreachBatch(pipeline.change_sink("/lake/A-changes"))             # a batch or two behind
     .option("checkpointLocation", "/lake/A-ckpt").trigger(processingTime="0 seconds").start())

See ``DESIGN.md`` beside this file for how each works.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "session": ("env", "session"),
    "register": ("env", "register"),
    "export": ("analytics", "export"),
    "snapshot": ("seeding", "snapshot"),
    "seed": ("seeding", "seed"),
    "verify": ("compare", "verify"),
    "fold": ("catchup", "fold"),
    "journal_df": ("journal_frames", "journal_df"),
    "index_journal": ("journal_frames", "index_journal"),
    "JournalOffset": ("offsets", "JournalOffset"),
    "change_sink": ("stream_sink", "change_sink"),
    "stream_changes": ("stream_sink", "stream_changes"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'multisite.pipeline' has no attribute {name!r}")
    mod, attr = _LAZY[name]
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
