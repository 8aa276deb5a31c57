"""Export on a real 2-worker Spark standalone cluster from the journal archive on S3, beside ``local[*]``
from the instance directory, in the same run (issue 18). Run through ``bench/pipeline.py --figure cluster``.

The instance of ``--updates`` updates (cached under bench/out/) is copied, indexed, and archived to a
moto S3 server (its own process); a master and two workers (1 core, 1 GiB each) are started from
PySpark's ``spark-class``. Each export runs in a driver process of its own (one SparkContext per
process); its job seconds (Spark start excluded) and wall seconds are reported, and the two exports'
change tables are checked to hold the same number of rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DRIVER = r"""
import json, sys, time
from multisite import pipeline
master, conf, inst, lake, url = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
from multisite.testing.spark_cluster import SparkCluster
spark = pipeline.session(master=master, conf=conf)
out = {"executors": SparkCluster.wait_for_executors(spark, int(conf["spark.cores.max"]) // int(conf["spark.executor.cores"]))}
t0 = time.perf_counter()
rep = pipeline.export(inst, lake, spark=spark, archive=url or None)
out.update(rep.to_dict(), job_s=time.perf_counter() - t0)
spark.stop()
print("RESULT " + json.dumps(out))
"""


def _drive(master: str, conf: dict, inst: Path, lake: Path, url: str) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", DRIVER, master, json.dumps(conf), str(inst), str(lake), url],
                       capture_output=True, text=True, env=dict(os.environ))
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"export on {master} failed: {p.stderr[-3000:]}")
    return {**json.loads(line[7:]), "wall_s": time.perf_counter() - t0}


def cluster_export(a, out_dir: Path, build) -> dict:
    from multisite import pipeline
    from multisite.pipeline.archive import archive
    from multisite.testing.s3server import running_s3
    from multisite.testing.spark_cluster import SparkCluster

    src = out_dir / f"pipeline-{a.updates}"
    build(src, a.updates, a.keys)
    work = out_dir / "cluster-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    inst = work / "A"
    shutil.copytree(src, inst)
    report: dict = {"updates": a.updates, "load_avg_before": round(os.getloadavg()[0], 1)}
    t0 = time.perf_counter()
    idx = pipeline.index_journal(str(inst), jobs=2)
    report["index_s"] = round(time.perf_counter() - t0, 1)
    with running_s3("lake"):
        url = "s3://lake/bench/A"
        t0 = time.perf_counter()
        arch = archive(str(inst), url)
        dt = time.perf_counter() - t0
        report["archive"] = {"segments": len(arch.segments_copied), "pieces": arch.pieces_copied,
                             "bytes": arch.bytes_copied, "seconds": round(dt, 1),
                             "bytes_per_s": int(arch.bytes_copied / dt), "last_archived": arch.last_archived,
                             "index_pieces": idx.pieces_written}
        print(json.dumps(report["archive"]), file=sys.stderr)
        cluster = SparkCluster(work / "cluster", workers=2).start()
        try:
            c = _drive(cluster.master_url, cluster.session_conf(), inst, work / "lake-cluster", url)
        finally:
            cluster.stop()
        local = _drive("local[*]", {}, inst, work / "lake-local", "")
    assert c["updates"] == local["updates"], (c, local)
    report["cluster_from_archive"] = {"job_s": round(c["job_s"], 1), "wall_s": round(c["wall_s"], 1),
                                      "updates": c["updates"], "updates_per_s": int(c["updates"] / c["job_s"])}
    report["local_from_instance"] = {"job_s": round(local["job_s"], 1), "wall_s": round(local["wall_s"], 1),
                                     "updates": local["updates"],
                                     "updates_per_s": int(local["updates"] / local["job_s"])}
    report["ratio_cluster_to_local_updates_per_s"] = round(local["job_s"] / c["job_s"], 3)
    report["load_avg_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(report, indent=2))
    (out_dir / "pipeline-cluster-report.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return report
