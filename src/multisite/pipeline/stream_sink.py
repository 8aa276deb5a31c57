"""A low-latency sink for streams of the journal: each micro-batch written to Parquet with pyarrow.

``writeStream.foreachBatch(change_sink("/lake/A-changes"))`` keeps a Parquet change table current
from ``spark.readStream.format("multisite")``. Rather than ``df.write.parquet`` in ``foreachBatch``
(Spark's file-commit protocol per micro-batch: job and task commit, a temporary directory, renames,
``_SUCCESS``, and a rewrite of the batch directory on replay), the batch's rows come to the driver as
Arrow (``DataFrame.toArrow``: the batch's one Spark job, the source read) and pyarrow writes them as one
file, ``<table>/batch=<id, 8 digits>/part-00000.parquet``: one file a batch, complete when it appears,
measured faster in most same-run comparisons (bench/RESULTS.md; the batch's time is mostly the read job).

The file is written under a hidden temporary name (``.``-prefixed: Spark, pyarrow and pandas readers
skip it), fsynced, then renamed into place and the directory fsynced: a reader sees a batch's file
complete or not at all. A batch replayed after a restart (Spark re-runs the last planned batch from its
checkpoint with the same rows) replaces its own file, so every transaction lands once. Empty batches
write nothing. Rows stay on the driver only for the batch's duration: size batches with the source's
``max_transactions_per_batch`` when a stream starts far behind.

``stream_changes`` (``multisite pipeline stream DIR --to TABLE``) runs such a stream for users, and
``await_stream`` makes sure it never ends silently: a query that died is a ``PipelineError`` saying why.
A fatal error of the JVM (a ``StackOverflowError`` in regex code was seen in the shared Spark log) can
end the query's thread with no exception recorded, and ``awaitTermination`` then returns as if the
query had finished: a stream that is not ``availableNow`` never finishes by itself, so that is an error
too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, PipelineError
from ..fsutil import ensure_dir, fsync_dir

PART_NAME = "part-00000.parquet"


def batch_dir(table: Path, batch_id: int) -> Path:
    return table / f"batch={batch_id:08d}"


class ChangeSink:
    """The ``foreachBatch`` function; ``rows``/``batches`` count what it wrote (this process)."""

    def __init__(self, table: str | os.PathLike, *, compression: str = "zstd"):
        self.table = Path(table).absolute()
        if self.table.exists() and not self.table.is_dir():
            raise ConfigError(f"the change table {self.table} is a file, not a directory")
        self.compression = compression
        self.rows = 0
        self.batches = 0

    def __call__(self, df, batch_id: int) -> None:
        self.write(df.toArrow(), batch_id)

    def write(self, table, batch_id: int) -> Path | None:
        """Write the Arrow ``table`` as micro-batch ``batch_id``; the file's path (None if empty)."""
        import pyarrow.parquet as pq

        if table.num_rows == 0:
            return None
        for new in reversed([p for p in (self.table, *self.table.parents) if not p.exists()]):
            ensure_dir(new)  # its parent fsynced: the table survives a power loss as the checkpoint does
        d = batch_dir(self.table, batch_id)
        ensure_dir(d)
        dest = d / PART_NAME
        tmp = d / f".{PART_NAME}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression=self.compression)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(d)
        self.rows += table.num_rows
        self.batches += 1
        return dest


def change_sink(table: str | os.PathLike, **kw) -> ChangeSink:
    """A ``foreachBatch`` function writing each micro-batch to the Parquet change table ``table``."""
    return ChangeSink(table, **kw)


@dataclass
class StreamReport:
    instance: str
    table: str
    checkpoint: str
    batches: int
    rows: int
    seconds: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


STREAM_COLUMNS = ("seqno", "ord", "op", "region", "key_text", "value", "commit_time")


def stream_changes(instance: str, table: str, *, checkpoint: str | None = None, consumer: str = "changes",
                   max_transactions_per_batch: int | None = None, available_now: bool = False,
                   seconds_s: float | None = None, spark=None, progress=None) -> StreamReport:
    """Keep the Parquet change table ``table`` current from the live ``instance``: a ``readStream`` of
    its journal, micro-batches back to back, each written by :class:`ChangeSink`. Runs until interrupted,
    ``seconds_s`` elapse, or (``available_now``) what the journal holds at the start is written. The
    checkpoint (default ``table/_checkpoint``: ``_``-prefixed, which readers skip) makes a restart go on
    where the last run stopped; ``consumer`` names the position ``journal prune`` honours."""
    from .env import session

    spark = spark or session()
    dest = Path(table).absolute()
    ckpt = str(Path(checkpoint).absolute() if checkpoint else dest / "_checkpoint")
    sink = ChangeSink(dest)
    reader = spark.readStream.format("multisite").option("consumer", consumer)
    if max_transactions_per_batch:
        reader = reader.option("max_transactions_per_batch", max_transactions_per_batch)
    writer = (reader.load(str(Path(instance).absolute())).select(*STREAM_COLUMNS).writeStream
              .foreachBatch(sink).option("checkpointLocation", ckpt))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    t0 = time.monotonic()
    q = writer.start()
    if progress:
        progress(f"streaming {instance} -> {dest} (checkpoint {ckpt})")
    await_stream(q, available_now=available_now, seconds_s=seconds_s,
                 what=lambda: f"the stream of {instance} into {dest} (after {sink.batches} batch(es), {sink.rows} "
                              f"row(s))")
    return StreamReport(str(instance), str(dest), ckpt, sink.batches, sink.rows, round(time.monotonic() - t0, 3))


_ERROR_LINE = re.compile(r"^[\w.]+(Error|Exception)(: .*)?$")


def _why(e: BaseException) -> str:
    """A query's exception in a line: Spark's first line (without the Python traceback it opens, when the
    foreachBatch function raised) and the error that traceback ends with."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    head = lines[0].split("Traceback (most recent call last):")[0].rstrip(" :")
    errors = [ln for ln in lines[1:] if _ERROR_LINE.match(ln)]
    return head + (f": {errors[-1]}" if errors else "")


def await_stream(q, *, available_now: bool, seconds_s: float | None, what) -> None:
    """Wait for the streaming query ``q``: until it finishes (``available_now``), ``seconds_s`` pass
    (then it is stopped), or for ever. A query that died, or that ended by itself when only a stop
    could end it, raises PipelineError naming ``what()`` and why (see the module's text)."""
    try:
        try:
            if seconds_s is not None and not available_now:
                ended = q.awaitTermination(seconds_s)  # False: still running when the time was up
            else:
                q.awaitTermination()
                ended = True
        except Exception as e:  # noqa: BLE001 - pyspark's StreamingQueryException: the query died
            raise PipelineError(f"{what()} stopped: its query died: {_why(e)}") from None
    finally:
        if q.isActive:
            q.stop()
    failed = q.exception()
    if failed is not None:
        raise PipelineError(f"{what()} stopped: its query died: {_why(failed)}")
    status = (getattr(q, "status", None) or {}).get("message", "")
    if "exception" in status.lower():  # Spark's "Terminated with exception: …", the exception itself lost
        raise PipelineError(f"{what()} stopped: {status}")
    if ended and not available_now:
        raise PipelineError(f"{what()} ended by itself, with no error recorded by Spark (status {status!r}): "
                            f"a fatal error in the JVM (a StackOverflowError, out of memory) ends a query so; the "
                            f"Spark driver's log says which. Run it again: it goes on from its checkpoint")
