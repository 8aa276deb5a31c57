"""The simulation of the HA managers' decisions (issue 28): fixed seeds keep every invariant with
skewed, drifting clocks, late renewals, crashes and partitions from etcd; and a primary that fenced
after its lease could end is caught taking a commit while another may hold the leader key."""

from multisite.testing.sim import FAMILIES, ha, run_seed

FAMILY = FAMILIES["ha"]
STEPS = 500


def test_fixed_seeds_keep_every_invariant():
    for seed in range(40):
        r = run_seed(FAMILY, seed, STEPS)
        assert r.ok, r.report()


def test_seeds_exercise_elections_fencing_and_rejoins():
    notes = {}
    for seed in range(20):
        for k, v in run_seed(FAMILY, seed, STEPS).stats.notes.items():
            notes[k] = notes.get(k, 0) + v
    for what in ("elections", "action:fence", "action:rejoin", "rollbacks", "crashes"):
        assert notes.get(what), (what, notes)


def test_a_primary_fencing_past_its_lease_is_caught(monkeypatch):
    monkeypatch.setattr(ha, "fence_deadline", lambda sent, timing: sent + timing.ttl_s * 1.5)
    failed = [r for r in (run_seed(FAMILY, s, STEPS, shrink_failures=False) for s in range(40)) if not r.ok]
    assert failed and {r.violation.invariant for r in failed} == {"no-two-primaries-in-overlapping-epochs"}
    assert len(run_seed(FAMILY, failed[0].seed, STEPS).shrunk) < 60
