"""The simulation of the grid's vote and the catalog's promotions (issue 28): fixed seeds keep every
invariant, and the two bugs it found stay fixed (a refused vote visible on a promoted replica; a
partition that could never commit again after a COMMIT its primary undid)."""

import pytest

from multisite.grid import voting
from multisite.testing.sim import FAMILIES, grid, run_seed

FAMILY = FAMILIES["grid_vote"]
STEPS = 600


@pytest.mark.parametrize("chunk", range(3))
def test_fixed_seeds_keep_every_invariant(chunk):
    for seed in range(chunk, 45, 3):
        r = run_seed(FAMILY, seed, STEPS)
        assert r.ok, r.report()


def test_seeds_exercise_promotions_rollbacks_and_unknown_outcomes():
    notes = {}
    for seed in range(20):
        for k, v in run_seed(FAMILY, seed, STEPS).stats.notes.items():
            notes[k] = notes.get(k, 0) + v
    for what in ("primaries-taken", "voted-rollback", "outcome-unknown", "crashes", "cuts"):
        assert notes.get(what), (what, notes)


def test_seed_290_a_refused_vote_stays_off_a_promoted_replica():
    assert run_seed(FAMILY, 290, STEPS).ok


def test_seed_290_found_the_refused_vote_on_a_promoted_replica(monkeypatch):
    def old_settle(self, v):  # before the fix: after a rollback only the ROLLBACK and silent voters were behind
        self.in_flight.pop(v.txn, None)
        seqno = self._seqno.pop(v.txn, None)
        if seqno is not None and v.decision.commit:
            self.committed(seqno)
        for r in v.decision.behind:
            self.fell_behind(r)
    monkeypatch.setattr(voting.SyncReplicas, "_settle", old_settle)
    r = run_seed(FAMILY, 290, STEPS)
    assert not r.ok and r.violation.invariant == "refused-vote-visible-nowhere", r.report()


def test_seed_3_a_commit_undone_by_a_lost_lease_leaves_the_partition_able_to_commit(monkeypatch):
    assert run_seed(FAMILY, 3, STEPS).ok
    monkeypatch.setattr(grid, "ABORT_TELLS_SYNC", False)  # the primary before the fix
    r = run_seed(FAMILY, 3, STEPS)
    assert not r.ok and r.violation.invariant == "grid-settles", r.report()


def test_a_lease_longer_than_the_catalog_s_timeout_is_caught(monkeypatch):
    """Not vacuous: a primary that kept committing three heartbeat timeouts after the catalog last
    answered it takes a commit in its old epoch after the promoted replica took one in the new."""
    from multisite.testing.sim import grid_container
    assert run_seed(FAMILY, 101, STEPS).ok
    monkeypatch.setattr(grid_container, "LEASE_FRACTION", 3.0)
    r = run_seed(FAMILY, 101, STEPS, shrink_failures=False)
    assert not r.ok and r.violation.invariant == "no-two-primaries-in-overlapping-epochs"


def test_seed_102690_min_sync_0_answers_nothing_past_the_lease():
    """primary.py's _settle: with min_sync 0 a commit decided after the lease ran out is not
    acknowledged (the mirror had acknowledged it, in its old epoch, after the promoted replica's)."""
    assert run_seed(FAMILY, 102690, STEPS).ok
