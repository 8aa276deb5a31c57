"""Seeded rounds of faults under a writer on a grid coordinated through etcd (issue 24), replayable from
their seed (``GRID_ETCD_SEEDS=24,25``): each round SIGKILLs the leading catalog, SIGSTOPs a catalog
or a container past its lease and resumes it, SIGKILLs a container, or SIGKILLs an etcd member, then
brings it back and waits for a settled grid. The checker (``testing.grid_checks.check_grid``): every
acknowledged commit in every shard's journal at its seqno, no two acknowledged at one partition's
seqno (no two primaries of a partition took commits at once), nothing refused present, every
partition's shards identical."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from multisite.testing.etcd import EtcdCluster
from multisite.testing.grid import GridCluster
from multisite.testing.grid_checks import GridWriter, check_grid

ROUNDS = int(os.environ.get("GRID_ETCD_ROUNDS", "20"))
CATALOGS = ["k1", "k2"]
CONTAINERS = ["c1", "c2", "c3"]
FAULTS = ["kill-leader", "pause-catalog", "kill-container", "pause-container", "kill-etcd"]
PAUSE_S = (1.4, 2.2)  # past the 1 s lease: the paused process's lease ends and it is replaced


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("GRID_ETCD_SEEDS", "24").split(",")])
def test_seeded_faults_under_a_writer_lose_nothing_and_never_split_a_partition(tmp_path, seed):
    rng = random.Random(seed)
    done: list[str] = []
    with EtcdCluster(tmp_path) as etcd:
        g = GridCluster(tmp_path / "grid", name="rounds", partitions=4, etcd=etcd.endpoints)
        w = None
        try:
            for k in CATALOGS:
                g.start_catalog(name=k)
            for c in CONTAINERS:
                g.start_container(c)
            g.wait_settled(30)
            w = GridWriter(g, seed=seed, timeout_s=10.0)
            w.start()
            for rnd in range(ROUNDS):
                time.sleep(rng.uniform(0.1, 0.5))
                fault = rng.choice(FAULTS)
                if fault == "kill-leader":
                    victim = g.leader() or rng.choice(CATALOGS)
                    g.kill(victim)
                    time.sleep(rng.uniform(0.2, 1.0))
                    g.start_catalog(name=victim)
                elif fault == "pause-catalog" or fault == "pause-container":
                    victim = rng.choice(CATALOGS if fault == "pause-catalog" else CONTAINERS)
                    g.signal(victim, signal.SIGSTOP)
                    try:
                        time.sleep(rng.uniform(*PAUSE_S))
                    finally:
                        g.signal(victim, signal.SIGCONT)
                elif fault == "kill-container":
                    victim = rng.choice(CONTAINERS)
                    g.kill(victim)
                    time.sleep(rng.uniform(0.2, 1.2))
                    g.start_container(victim)
                else:
                    victim = f"etcd m{rng.randrange(3)}"
                    i = int(victim[-1])
                    etcd.kill(i)
                    time.sleep(rng.uniform(0.3, 1.2))
                    etcd.restart(i)
                done.append(f"{fault} {victim}")
                g.wait(f"round {rnd} ({fault} {victim}) settled", g.settled, timeout_s=40)
            time.sleep(0.3)
            w.stop()
            st = g.wait("every replica caught up", g.caught_up, timeout_s=40)
        finally:
            if w is not None:
                w.stop()
            g.stop_all()
            print(f"seed {seed}: " + "; ".join(done))
    summary = check_grid(g, w, st)
    assert summary["acked"] > 200, summary
    print(summary)
