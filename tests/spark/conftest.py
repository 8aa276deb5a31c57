"""One SparkSession for the whole test run (local[2], quiet), and small instances with known content."""

from __future__ import annotations

import pytest

import multisite


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto, its own process) with a bucket ``lake``, its endpoint and keys in
    the environment before Spark starts (its Python workers inherit them); None without moto."""
    from multisite.testing.s3server import S3Server, running_s3

    if not S3Server.available():
        yield None
        return
    with running_s3("lake") as server:
        yield server


@pytest.fixture(scope="session")
def spark(s3):
    pytest.importorskip("pyspark")
    from multisite import pipeline

    s = pipeline.session(master="local[2]", conf={"spark.sql.shuffle.partitions": "4",
                                                  "spark.driver.memory": "2g"})
    yield s
    s.stop()


def build(path, name="A", txns=None, *, segment_bytes=64 * 1024 * 1024):
    """Create an instance and commit ``txns``: lists of (op, region, key, value)."""
    root = multisite.create(path, name=name, durability="none", segment_bytes=segment_bytes)
    with multisite.open(root) as db:
        db.create_region("acct", schema='{"owner": "string", "n": "long"}')
        db.create_region("log")
        for t in txns or []:
            commit(db, t)
    return root


def commit(db, ops):
    with db.transaction() as tx:
        for op, region, key, value in ops:
            if op == "set":
                tx.set(region, key, value)
            elif op == "kill":
                tx.kill(region, key)
            else:
                tx.zkill(region, key)



KNOWN = [
    [("set", "acct", ("a", 1), {"owner": "ann", "n": 1}), ("set", "log", (1,), "one")],
    [("set", "acct", ("a", 2), {"owner": "bob", "n": 2}), ("set", "acct", ("b",), {"owner": 7, "n": "x"})],
    [("set", "acct", ("a", 1), {"owner": "ann", "n": 10}), ("zkill", "log", (1,), None)],
    [("kill", "acct", ("a",), None)],
    [("set", "acct", ("a", 3), {"owner": "cy", "n": 3}), ("set", "log", ("x", 2), [1, 2])],
]


@pytest.fixture
def known(tmp_path):
    return build(tmp_path / "A", "A", KNOWN)
