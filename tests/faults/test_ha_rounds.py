"""Seeded fault rounds under a writer on a 3-member HA cluster and a real 3-member etcd (issue 25).

Each round's seed picks its faults (the primary's host SIGKILLed, the primary SIGSTOPped then resumed,
a switchover, an etcd member SIGKILLed, a secondary's host SIGKILLed), its targets and its pauses, and
whether it runs with ``--min-confirm 1`` (odd seeds) or without; ``testing/ha_rounds.py`` says what
each checks: with min-confirm no acknowledged commit lost, without it none silently lost (each on the
primary or in a lost file), never two primaries at once, all members identical after each round, and
the writer's history (``testing/history``): no lost write, phantom, duplicate or stale read.

The rounds of one setting share one cluster (starting a cluster costs seconds), one test per setting.
A failing round names its seed; ``HA_SEED=<seed> pytest tests/faults/test_ha_rounds.py`` replays that
round alone on a fresh cluster. ``HA_ROUNDS`` (default 20) and ``HA_SEED_BASE`` choose the rounds.
"""

from __future__ import annotations

import os

import pytest

from multisite.testing.etcd import EtcdCluster
from multisite.testing.ha import HACluster
from multisite.testing.ha_rounds import Totals, plan, run_round

pytestmark = pytest.mark.timeout(600)

SEED_BASE = int(os.environ.get("HA_SEED_BASE", "2500"))
ROUNDS = int(os.environ.get("HA_ROUNDS", "20"))
REPLAY = os.environ.get("HA_SEED")
SEEDS = [int(REPLAY)] if REPLAY else [SEED_BASE + k for k in range(ROUNDS)]
TOTALS = Totals()


@pytest.mark.parametrize("min_confirm", [0, 1], ids=["async", "min_confirm_1"])
def test_seeded_fault_rounds(tmp_path, min_confirm):
    seeds = [s for s in SEEDS if plan(s).min_confirm == min_confirm]
    if not seeds:
        pytest.skip(f"no round of --min-confirm {min_confirm} among seeds {SEEDS}")
    mine = Totals()
    with EtcdCluster(tmp_path) as etcd:
        c = HACluster(tmp_path, etcd.endpoints, ["A", "B", "C"], ttl_s=1.0, min_confirm=min_confirm,
                      cluster=f"rounds-{min_confirm}")
        c.start()
        try:
            for seed in seeds:
                run_round(c, etcd, plan(seed), mine)
        finally:
            c.stop()
            _add(TOTALS, mine)
            print(f"\n--min-confirm {min_confirm}: {mine.summary()}\nall so far: {TOTALS.summary()}")
    assert mine.lost_min_confirm == 0 and mine.silently_lost == 0 and not mine.anomalies


def _add(into: Totals, t: Totals) -> None:
    for name in ("rounds", "acknowledged", "acknowledged_min_confirm", "lost_min_confirm", "in_lost_files",
                 "silently_lost", "unknown", "refused", "seconds", "history_ops", "reads", "excused"):
        setattr(into, name, getattr(into, name) + getattr(t, name))
    into.faults.update(t.faults)
    into.anomalies.update(t.anomalies)
    if t.smallest_gap_s is not None:
        into.smallest_gap_s = min(t.smallest_gap_s, into.smallest_gap_s or t.smallest_gap_s)
