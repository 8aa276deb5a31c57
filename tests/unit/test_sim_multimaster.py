"""The simulation of multi-master documents on three real DocDB replicas (issue 28): fixed seeds keep
every invariant (versions never go back, replicas converge, the same replicas converged in two
session orders end identical), a winner rule that depends on arrival order is caught, and the seeds
issue 28 found (1009, 1128, 1085, 1102) keep every invariant since its fix."""

import pytest

from multisite.multimaster import conflicts
from multisite.testing.sim import FAMILIES, replay_steps, run_seed
from multisite.testing.sim.families import STEPS_DEFAULT

FAMILY = FAMILIES["multimaster"]
STEPS = 80


def test_fixed_seeds_keep_every_invariant():
    for seed in range(4):
        r = run_seed(FAMILY, seed, STEPS)
        assert r.ok, r.report()


def test_a_first_arrival_wins_rule_is_caught(monkeypatch):
    monkeypatch.setattr(conflicts, "winner", lambda a, b: a)  # the version held wins: order-dependent
    failed = []
    for seed in range(6):
        r = run_seed(FAMILY, seed, STEPS, shrink_failures=False)
        if not r.ok:
            failed.append(r)
            break
    assert failed, "an arrival-order-dependent winner went unnoticed"
    assert failed[0].violation.invariant in ("replicas-converge", "conflict-winners-independent-of-arrival-order",
                                             "versions-never-go-back")


SEED_1009 = [("create", 0, 71), ("create", 1, 20), ("create", 2, 74), ("session", 2, 0, 0, 0), ("create", 1, 68),
             ("delete", 1, 13925), ("session", 1, 0, 1, 0), ("create", 0, 41), ("update", 2, 54585, 0, 33),
             ("create", 0, 43), ("update", 0, 56513, 0, 57), ("update", 0, 52754, 2, 79),
             ("update", 1, 24620, 2, 40), ("session", 0, 1, 2, 0), ("update", 0, 61070, 0, 3),
             ("delete", 0, 42243), ("update", 2, 41906, 0, 20), ("session", 2, 2, 1, 0)]
SEED_1102 = [("create", 2, 52), ("create", 1, 37), ("create", 0, 41), ("create", 0, 2), ("create", 2, 19),
             ("create", 1, 79), ("create", 1, 55), ("create", 2, 53), ("session", 0, 1, 2, 0),
             ("update", 0, 20194, 2, 65), ("session", 1, 2, 0, 0), ("create", 0, 79), ("create", 0, 13),
             ("create", 0, 19), ("create", 0, 97), ("update", 2, 16106, 2, 44), ("create", 0, 46),
             ("session", 0, 1, 0, 0), ("update", 0, 32528, 2, 86)]


def test_three_lines_merged_or_not_by_session_order_keep_every_invariant():
    """Seed 1009 (found by this simulation, issue 28): three replicas each hold a version of one
    document diverged from the same ancestor, on a form with merge on. A session merged two of them
    when they met first (fields apart) and the merged version beat the third; met by the third first,
    each lost to it: another winner. Sessions no longer merge (conflicts.py, step 9c)."""
    replay_steps("multimaster", 1009, SEED_1009)


def test_the_winners_ancestor_meeting_a_third_line_first_leaves_no_record():
    """Seed 1102 (found by this simulation, issue 28): a replica holding an ancestor of the winner met
    a third line first and kept its version as a conflict document, deleted when the winner came; met
    the other way, no such record was made. A conflict document that stands for no losing leaf is now
    removed with no trace (conflicts.settle)."""
    replay_steps("multimaster", 1102, SEED_1102)


@pytest.mark.parametrize("seed", [1009, 1128, 1085, 1102])
def test_seeds_found_by_issue_28_keep_every_invariant(seed):
    """The whole seeds (1009 and 1128: merge on; 1085 and 1102: merge off), at the family's step count."""
    r = run_seed(FAMILY, seed, STEPS_DEFAULT["multimaster"], shrink_failures=False)
    assert r.ok, r.report()
