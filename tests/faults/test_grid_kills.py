"""Seeded rounds of SIGKILL among a grid's catalog and containers, checked on the placement after each.

Every round, from a seeded random generator: SIGKILL a container (while at least two are up), SIGKILL
the catalog and start it again on its address, or start a killed container again. Then, once the
catalog has seen it (a lost container marked down, every up container on the current placement,
every sync replica current), the checks: no two shards of a partition in one container; every
partition has its primary on a container that is up; a down container holds no shard; after a
catalog kill, the placement (version included) is the one before it. Nothing commits through the
grid yet, so these are placement invariants only (grid/DESIGN.md, "next").

A failing seed replays the same decisions: ``MULTISITE_GRID_SEED=<seed> pytest ...``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from multisite.grid.server.process import catalog_status, start_catalog, start_container, stop_process

SEED = int(os.environ.get("MULTISITE_GRID_SEED", "20261124"))
ROUNDS = int(os.environ.get("MULTISITE_GRID_ROUNDS", "10"))
HEARTBEAT_TIMEOUT_S = 1.0
SETTLE_TIMEOUT_S = 20.0
NAMES = ("c1", "c2", "c3", "c4")
GRID_TOML = 'name = "orders"\npartitions = 8\nmin_sync = 1\nmax_sync = 1\nmax_async = 1\n[maps.m]\n'


def _pid(d, what):
    return json.loads((d / "run" / f"{what}.json").read_text())["pid"]


def _settled(address, up):
    try:
        st = catalog_status(address)
    except Exception:
        return None
    state = {c["name"]: c["up"] for c in st["containers"]}
    if any(state.get(n) is not True for n in up) or any(state.get(n) for n in set(state) - set(up)):
        return None
    if any(c["applied_version"] != st["version"] for c in st["containers"] if c["up"]):
        return None
    if not all(set(p["sync"]) == set(p["current"]) for p in st["partitions"]):
        return None
    return st


def _check(st, up, seed, rnd):
    where = f"(seed {seed}, round {rnd})"
    for p in st["partitions"]:
        shards = [p["primary"], *p["sync"], *p["async"]]
        assert len(shards) == len(set(shards)), f"two shards of partition {p['partition']} in one container {where}"
        assert p["primary"] in up, f"partition {p['partition']} has its primary on {p['primary']}, not up {where}"
        assert set(shards) <= set(up), f"partition {p['partition']} has a shard on a down container {where}"


@pytest.mark.parametrize("seed", [SEED])
def test_random_kills_keep_the_placement_sound(tmp_path, seed):
    rng = random.Random(seed)
    toml = tmp_path / "grid.toml"
    toml.write_text(GRID_TOML)
    cat_dir = tmp_path / "catalog"
    address = start_catalog(cat_dir, toml, "127.0.0.1:0", HEARTBEAT_TIMEOUT_S)["listen"]
    up: set[str] = set()
    try:
        for n in NAMES:
            start_container(tmp_path / n, address, "127.0.0.1:0", name=n)
            up.add(n)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not (st := _settled(address, up)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert st, "the grid did not settle at start"
        for rnd in range(ROUNDS):
            down = sorted(set(NAMES) - up)
            choices = ["catalog"] + (["kill"] if len(up) >= 2 else []) + (["restart"] if down else [])
            action = rng.choice(choices)
            before = st
            if action == "kill":
                victim = rng.choice(sorted(up))
                os.kill(_pid(tmp_path / victim, "container"), signal.SIGKILL)
                up.discard(victim)
            elif action == "restart":
                back = rng.choice(down)
                start_container(tmp_path / back, address, "127.0.0.1:0", name=back)
                up.add(back)
            else:
                os.kill(_pid(cat_dir, "catalog"), signal.SIGKILL)
                time.sleep(rng.uniform(0, HEARTBEAT_TIMEOUT_S / 2))
                start_catalog(cat_dir, toml, address, HEARTBEAT_TIMEOUT_S)
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while not (st := _settled(address, up)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert st, f"the grid did not settle after {action} (seed {seed}, round {rnd})"
            _check(st, up, seed, rnd)
            if action == "catalog":
                assert (st["version"], st["partitions"]) == (before["version"], before["partitions"]), (
                    f"a catalog kill moved the placement (seed {seed}, round {rnd})")
    finally:
        for n in NAMES:
            try:
                stop_process(tmp_path / n, "container")
            except Exception:
                pass
        try:
            stop_process(cat_dir, "catalog")
        except Exception:
            pass
