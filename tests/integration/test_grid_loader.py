"""Issue 16: the grid's write-through Loader through real containers: commits land in SQLite and in a
throwaway PostgreSQL (rows and applied ids), a refused write (a constraint) and a database that is down
fail the commit with the database's error and leave nothing committed on either side."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multisite.errors import MultisiteError
from multisite.net import control
from multisite.testing.grid import GridCluster
from multisite.testing.postgres import PostgresServer


def sqlite_rows(path: Path) -> tuple[dict, list]:
    with sqlite3.connect(path) as c:
        rows = {tuple(json.loads(k)): json.loads(v) for k, v in c.execute("SELECT key, value FROM m")}
        ids = c.execute("SELECT partition, seqno, digest FROM multisite_applied").fetchall()
    return rows, ids


def pg_rows(pg: PostgresServer, table: str = "m") -> tuple[dict, list]:
    with pg.connect() as c:
        rows = {tuple(json.loads(k)): v for k, v in c.execute(f"SELECT key, value FROM {table}")}
        ids = c.execute("SELECT partition, seqno, digest FROM multisite_applied").fetchall()
    return rows, ids


def grid_rows(g: GridCluster, st: dict) -> dict:
    g.stop_all()
    states = g.shard_states()
    return {k: v for p in states for k, v in states[p][st["partitions"][p]["primary"]]["rows"].items()}


def test_sqlite_write_through_and_a_refused_write(make, tmp_path):
    db = tmp_path / "loader.db"
    with sqlite3.connect(db) as c:  # the user's table, with a constraint the grid does not know
        c.execute("CREATE TABLE m (key TEXT PRIMARY KEY, value TEXT NOT NULL CHECK (json_extract(value, '$') >= 0))")
    g = make(partitions=2, min_sync=1, max_sync=1, max_async=0, map_settings=f'loader = "sqlite"\npath = "{db}"\n')
    g.start_catalog()
    g.start_container("a")
    g.start_container("b")
    g.wait_settled()
    cl = g.client(timeout_s=10)
    for i in range(100):
        cl.put("m", i, i)
    with pytest.raises(MultisiteError, match="CHECK constraint failed"):
        cl.put("m", 7, -1)
    assert cl.get("m", 7) == 7
    cl.put("m", 1000, 5)  # the partition takes commits again
    # concurrent clients: a refused transaction batched with others fails alone (the batch is retried
    # one by one)
    errors: list[tuple[int, str]] = []

    def writer(t: int) -> None:
        c2 = g.client(timeout_s=10)
        for i in range(20):
            k = 2000 + t * 100 + i
            try:
                c2.put("m", k, -1 if i == 10 else k)
            except MultisiteError as e:
                errors.append((k, str(e)))
        c2.close()
    ts = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    assert sorted(k for k, _ in errors) == [2000 + t * 100 + 10 for t in range(8)], errors
    assert all("CHECK constraint failed" in m for _, m in errors), errors
    st = g.wait("replicas caught up", g.caught_up)
    for p in range(2):  # the container's status: the primary's Loader, the replica's buffer
        prim = control.call(g.root / st["partitions"][p]["primary"], "status")["shards"][str(p)]
        assert prim["loader"]["state"] == "ready" and prim["loader"]["state"] == "ready", prim["loader"]
        rep = control.call(g.root / st["partitions"][p]["sync"][0], "status")["shards"][str(p)]
        assert rep["loader_buffer"]["buffered"] == 0 and rep["loader_buffer"]["committed"] > 0, rep
    # grid status learns the replicas' buffers from heartbeats: wait until they report the empty buffer too
    gst = g.wait("grid status with the loaders", lambda: (x := g.status()) and all(
        (p["loader"]["primary"] or {}).get("applied", 0) > 0 and p["loader"]["buffered"] == {p["sync"][0]: 0}
        for p in x["partitions"]) and x)
    for p in gst["partitions"]:  # grid status: the primary's Loader state, the replicas' buffers
        assert p["loader"]["primary"]["state"] == "ready" and p["loader"]["primary"]["database"] == "up", p
        assert p["loader"]["buffered"] == {p["sync"][0]: 0}, p
    out = subprocess.run([sys.executable, "-c", "from multisite.cli.main import main; main()", "grid", "status",
                          "--catalog", g.address], capture_output=True, text=True, check=False)
    assert "loader" in out.stdout and "ready" in out.stdout, out.stdout + out.stderr
    refused = sum(control.call(g.root / c, "status")["shards"][str(p)].get("loader", {}).get("refused", 0)
                  for c in ("a", "b") for p in range(2))
    assert refused >= 9
    rows, ids = sqlite_rows(db)
    good = {(2000 + t * 100 + i,): 2000 + t * 100 + i for t in range(8) for i in range(20) if i != 10}
    assert rows == grid_rows(g, st) == {**{(i,): i for i in range(100)}, (1000,): 5, **good}
    assert len(ids) == len(set(ids)) == 101 + len(good)


def test_postgresql_write_through_refused_and_down(make, pg):
    with pg.connect() as c:
        c.execute("DROP TABLE IF EXISTS m2, multisite_applied")
        c.execute("CREATE TABLE m2 (key TEXT PRIMARY KEY, value JSONB NOT NULL CHECK ((value->>'n')::int >= 0))")
    g = make(partitions=2, min_sync=1, max_sync=1, max_async=0,
             map_settings=f'loader = "postgresql"\ndsn = "{pg.dsn}"\ntable = "m2"\nstatement_timeout_ms = 500\n')
    g.start_catalog()
    g.start_container("a")
    g.start_container("b")
    g.wait_settled()
    cl = g.client(timeout_s=10)
    for i in range(100):
        cl.put("m", i, {"n": i})
    with pytest.raises(MultisiteError, match="check constraint"):
        cl.put("m", 3, {"n": -5})
    assert cl.get("m", 3) == {"n": 3}
    with pg.connect() as lock:  # slow: a held row lock; the loader's lock_timeout ends the wait
        lock.execute("BEGIN")
        lock.execute("SELECT * FROM m2 WHERE key = '[6]' FOR UPDATE")
        t0 = time.monotonic()
        with pytest.raises(MultisiteError, match="statement timeout|lock timeout"):
            cl.put("m", 6, {"n": 60})
        assert time.monotonic() - t0 < 5
        lock.execute("ROLLBACK")
    assert cl.get("m", 6) == {"n": 6}
    pg.stop("immediate")  # the database down: a clear error, nothing committed in the grid
    try:
        with pytest.raises(MultisiteError, match="(?i)postgresql|database"):
            cl.put("m", 4, {"n": 40})
    finally:
        pg.start()
    deadline = time.monotonic() + 15
    while True:  # the loader reconnects (backoff)
        try:
            cl.put("m", 5, {"n": 50})
            break
        except MultisiteError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    st = g.wait("replicas caught up", g.caught_up)
    rows, ids = pg_rows(pg, "m2")
    want = {**{(i,): {"n": i} for i in range(100)}, (5,): {"n": 50}}
    assert rows == {k: v for k, v in grid_rows(g, st).items()} == want
    assert len(ids) == len(set(ids))
