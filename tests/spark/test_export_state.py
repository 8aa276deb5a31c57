"""The export's state table against the engine's own state, over random histories with kills and zkills,
run after run (the Arrow fold of ``state_files`` must agree with replaying)."""

from __future__ import annotations

import json
import random

import multisite
from conftest import build, commit
from multisite.testing.builders import state_of
from multisite import pipeline
from multisite.keys import key_text


def _random_txns(rnd: random.Random, n: int) -> list:
    heads = ["a", "b", "é", 1, 12, "a,b"]
    txns = []
    for _ in range(n):
        ops = []
        for _ in range(rnd.randint(1, 6)):
            depth = rnd.choice([1, 2, 2, 3])
            key = tuple([rnd.choice(heads)] + [rnd.choice([rnd.randrange(15), f"s{rnd.randrange(4)}"])
                                               for _ in range(depth - 1)])
            region = rnd.choice(["acct", "log"])
            r = rnd.random()
            if r < 0.07:
                ops.append(("kill", region, key[:rnd.randint(1, len(key))], None))
            elif r < 0.15:
                ops.append(("zkill", region, key, None))
            else:
                val = {"owner": f"o{rnd.randrange(9)}", "n": rnd.randrange(100)} if region == "acct" else \
                    rnd.choice([rnd.randrange(1000), f"v{rnd.randrange(50)}", [1, {"x": "y"}]])
                ops.append(("set", region, key, val))
        txns.append(ops)
    return txns


def _lake_state(spark, path):
    return {(r.region, r.key_text): json.loads(r.value) for r in spark.read.parquet(str(path)).collect()}


def test_state_after_each_run_is_the_instance_state(spark, tmp_path):
    rnd = random.Random(7)
    root = build(tmp_path / "R", "R", _random_txns(rnd, 60))
    lake = tmp_path / "lake"
    for run in range(3):
        pipeline.export(str(root), str(lake), spark=spark)
        want = {(r, key_text(k)): v for (r, k), v in state_of(root).items()}
        assert _lake_state(spark, lake / "state") == want, f"run {run}"
        assert len(list((lake / "state").glob("*.parquet"))) <= 2 * 8  # rewritten, not accumulated
        with multisite.open(root) as db:
            for ops in _random_txns(rnd, 25):
                commit(db, ops)
