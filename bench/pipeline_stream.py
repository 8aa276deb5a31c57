"""Streaming latency (issue 18): a writer process commits ``--rate`` transactions per second to a live
instance; a Spark ``readStream`` of the instance (``trigger(processingTime="0 seconds")``: the next
micro-batch as soon as the last is done) appends each micro-batch to a Parquet change table. For every
row, the latency is the time its micro-batch's files were complete in the change table minus its
``commit_time`` (the transaction's commit time in the journal). Reports p50/p99/max over the measured
seconds after a warm-up (at least ``WARMUP_S`` and ``WARMUP_BATCHES`` micro-batches done), the rows per batch, and the writer's achieved rate. Run through
``bench/pipeline.py --figure stream``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

WARMUP_S = 10.0
WARMUP_BATCHES = 3  # and at least this many micro-batches done: Spark's first batch starts its Python
WARMUP_MAX_S = 240.0  # workers, which on a loaded machine takes tens of seconds and a backlog to catch up

WRITER = r"""
import os, sys, time
import multisite
root, rate, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with multisite.open(root) as db:
    t0 = time.monotonic(); i = 0; checked = 0.0
    print("ready", flush=True)
    while True:
        now = time.monotonic() - t0
        if now - checked > 0.1:
            checked = now
            if os.path.exists(stop):
                break
        due = int(now * rate)
        while i < due:
            with db.transaction() as tx:
                tx.set("ev", ("e", i % 10000), {"i": i, "pad": "x" * 100})
            i += 1
        time.sleep(0.001)
    print(f"done {i} {time.monotonic() - t0:.3f}", flush=True)
"""


def stream_latency(a, out_dir: Path, sink_kind: str = "arrow") -> dict:
    """One run: ``sink_kind`` ``arrow`` writes each micro-batch with ``pipeline.change_sink`` (the
    supported path), ``spark`` with ``df.write.parquet`` in ``foreachBatch`` (the baseline)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import multisite
    from multisite import pipeline

    work = out_dir / "stream-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # durability none: the writer is one Python thread, and an fsync per commit would hold it below the
    # rate on a shared machine; the pipeline reads what is written to the journal files either way.
    root = multisite.create(work / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("ev")
    load_before = os.getloadavg()[0]
    spark = pipeline.session(a.master, conf={"spark.sql.streaming.numRecentProgressUpdates": "10000"})
    table = work / "changes"
    lat: list[np.ndarray] = []
    sizes: list[int] = []
    t_start = [0.0]

    write_s: list[float] = []

    sink = pipeline.change_sink(table)

    def on_batch(df, batch_id):
        part = table / f"batch={batch_id:08d}"
        t0 = time.perf_counter()
        if sink_kind == "spark":
            df.write.mode("overwrite").parquet(str(part))
        else:
            sink(df, batch_id)
        visible = time.time()
        write_s.append(time.perf_counter() - t0)
        if not any(part.glob("*.parquet")):
            return
        ct = pq.read_table(str(part), columns=["commit_time"]).column("commit_time")
        secs = pc.cast(pc.cast(ct, pa.timestamp("us", tz="UTC")), pa.int64()).to_numpy(zero_copy_only=False) / 1e6
        if t_start[0] and secs.size:
            keep = secs >= t_start[0]
            lat.append(visible - secs[keep])
            sizes.append(int(keep.sum()))

    q = (spark.readStream.format("multisite").option("consumer", "bench-stream").load(str(root))
         .select("seqno", "ord", "op", "region", "key_text", "value", "commit_time")
         .writeStream.foreachBatch(on_batch).option("checkpointLocation", str(work / "ckpt"))
         .trigger(processingTime="0 seconds").start())
    stop = work / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(a.rate), str(stop)],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        writer.stdout.readline()
        t_w = time.time()
        while time.time() - t_w < WARMUP_MAX_S and (time.time() - t_w < WARMUP_S or len(write_s) < WARMUP_BATCHES):
            if not q.isActive:  # it failed (q.exception() below says why)
                break
            time.sleep(0.2)
        t_start[0] = time.time()
        warmup_s = t_start[0] - t_w
        time.sleep(a.seconds)
        stop.touch()
        done = writer.stdout.readline().split()
        time.sleep(3)  # the last commits reach the table
    finally:
        all_progress = q.recentProgress
        progress = [p for p in all_progress if p.timestamp >= time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.gmtime(t_start[0]))] if t_start[0] else []
        failed = q.exception()
        q.stop()
        if writer.poll() is None:
            writer.kill()
        writer.wait()
        spark.stop()
    if failed is not None:
        raise RuntimeError(f"the stream failed: {failed}")
    all_lat = np.concatenate(lat) if lat else np.zeros(0)
    rep = {"sink": sink_kind, "rate_tx_per_s": a.rate, "measured_s": a.seconds, "warmup_s": round(warmup_s, 1), "rows": int(all_lat.size),
           "writer_tx": int(done[1]) if len(done) > 1 else None,
           "writer_rate_tx_per_s": round(int(done[1]) / float(done[2]), 1) if len(done) > 2 else None,
           "latency_p50_s": round(float(np.percentile(all_lat, 50)), 3) if all_lat.size else None,
           "latency_p99_s": round(float(np.percentile(all_lat, 99)), 3) if all_lat.size else None,
           "latency_max_s": round(float(all_lat.max()), 3) if all_lat.size else None,
           "batches": len(sizes), "rows_per_batch_median": int(np.median(sizes)) if sizes else 0,
           "batch_ms_median": _phases(progress), "foreach_batch_write_ms_median": _ms(write_s),
           "master": a.master, "load_avg_before": round(load_before, 1),
           "load_avg_after": round(os.getloadavg()[0], 1)}
    print(json.dumps(rep, indent=2))
    (out_dir / f"pipeline-stream-{sink_kind}-progress.json").write_text(
        json.dumps([{"batch": p.batchId, "at": p.timestamp, "rows": p.numInputRows, "ms": p.durationMs}
                    for p in all_progress], indent=1))
    (out_dir / f"pipeline-stream-{sink_kind}-report.json").write_text(json.dumps(rep, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return rep


def _ms(xs: list[float]) -> float | None:
    import numpy as np

    return round(float(np.median(xs)) * 1000, 1) if xs else None


def _phases(progress) -> dict:
    """Median milliseconds per phase of the measured micro-batches (Spark's own ``durationMs``:
    latestOffset, queryPlanning, addBatch (the foreachBatch: the read and the write), walCommit,
    commitOffsets, triggerExecution = the whole batch)."""
    import numpy as np

    keys = sorted({k for p in progress for k in p.durationMs})
    return {k: float(np.median([p.durationMs.get(k, 0) for p in progress])) for k in keys}
