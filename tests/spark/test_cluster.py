"""The pipeline on a real Spark standalone cluster: a master and two workers, each its own JVM process
started from the installed PySpark's ``spark-class`` (``testing.spark_cluster``), each worker with its own
work directory; the journal archive on a real S3-compatible server (moto, its own process). Export,
verify and a readStream run on the cluster (in a driver process of their own: one SparkContext per
process) and give the same results as on ``local[2]`` in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import multisite
from multisite import pipeline
from multisite.pipeline.archive import archive
from multisite.testing.spark_cluster import SparkCluster

DRIVER = r"""
import json, sys
from multisite import pipeline
from multisite.testing.spark_cluster import SparkCluster
master, conf, url, inst, lake, sink, ckpt = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
spark = pipeline.session(master=master, conf=conf)
assert spark.sparkContext.master == master
out = {"executors": SparkCluster.wait_for_executors(spark, 2)}  # they register after the session starts
out["export"] = pipeline.export(inst, lake, spark=spark, archive=url).to_dict()
v = pipeline.verify(url, inst, engine="spark", spark=spark)
out["verify"] = {**v.to_dict(), "seconds": 0}
q = (spark.readStream.format("multisite").option("consumer", "cluster-test")
     .option("paths", json.dumps([url, inst])).load()
     .select("seqno", "ord", "op", "region", "key_text", "value")
     .writeStream.format("parquet").option("path", sink).option("checkpointLocation", ckpt)
     .trigger(availableNow=True).start())
q.awaitTermination()
out["stream_batches"] = len(q.recentProgress)
spark.stop()
print("RESULT " + json.dumps(out, default=str))
"""


def journaled(path, n):
    root = multisite.create(path, name=path.name, durability="none", segment_bytes=64 * 1024)
    with multisite.open(root) as db:
        db.create_region("r", schema='{"n": "long"}')
        for i in range(1, n + 1):
            with db.transaction() as tx:
                tx.set("r", ("k", i % 40), {"n": i, "pad": "p" * 400})
                if i % 97 == 0:
                    tx.kill("r", ("k", i % 7))
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3):
    if s3 is None:
        pytest.skip("moto[server] is not installed: the cluster reads its archive from S3")
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2).start()
    yield c
    c.stop()


def test_export_verify_and_a_stream_on_the_cluster_match_local(spark, cluster, tmp_path):
    a = journaled(tmp_path / "A", 600)
    url = f"s3://lake/{tmp_path.name}/A"
    pipeline.index_journal(str(a))
    rep = archive(str(a), url)
    assert 0 < rep.last_archived < 600  # the rest (the open segment) is read from the instance
    out = subprocess.run([sys.executable, "-c", DRIVER, cluster.master_url, json.dumps(cluster.session_conf()), url,
                          str(a), str(tmp_path / "lakeC"), str(tmp_path / "sink"), str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stdout[-3000:] + out.stderr[-5000:]
    res = json.loads(line[len("RESULT "):])
    assert res["executors"] == 2
    assert res["export"]["to_seqno"] == 600
    local = pipeline.export(str(a), str(tmp_path / "lakeL"), spark=spark)
    assert local.updates == res["export"]["updates"]

    def read(p, t):
        return sorted(map(tuple, spark.read.parquet(str(p / t)).drop("commit_date").collect()))

    for t in ("changes", "state"):
        assert read(tmp_path / "lakeC", t) == read(tmp_path / "lakeL", t), t
    v = pipeline.verify(url, str(a), engine="spark", spark=spark)
    assert {**v.to_dict(), "seconds": 0} == {k: res["verify"][k] for k in v.to_dict()} | {"seconds": 0}
    assert v.equal and v.ahead == "B" and v.ahead_by == 600 - rep.last_archived
    cols = ["seqno", "ord", "op", "region", "key_text", "value"]
    want = sorted(map(tuple, spark.read.format("multisite").load(str(a)).select(*cols).collect()))
    got = sorted(map(tuple, spark.read.parquet(str(tmp_path / "sink")).select(*cols).collect()))
    assert got == want and res["stream_batches"] >= 1
    for i in range(2):  # the executors ran in the workers' own work directories
        assert any((cluster.folder / f"worker-{i}").iterdir())
