"""The engine's leader lease (``Database.set_lease``): HA fencing refuses local commits once it ends."""

from __future__ import annotations

import time

import pytest

import multisite
from multisite.errors import NotPrimary
from multisite.journal.reader import iter_frames
from multisite.journal.records import FrameRun


@pytest.mark.parametrize("durability", ["fsync", "group", "none"])
def test_commits_are_refused_once_the_lease_has_ended_and_accepted_again_when_renewed(tmp_path, durability):
    multisite.create(tmp_path / "A", name="A", durability=durability)
    with multisite.open(tmp_path / "A") as db:
        db.create_region("acct")
        db.set_lease(time.monotonic() + 60)
        assert db.set("acct", (1,), 1) == 1
        db.set_lease(time.monotonic() - 0.001)  # ended
        with pytest.raises(NotPrimary, match="fenced"):
            db.set("acct", (2,), 2)
        with pytest.raises(NotPrimary):
            with db.transaction() as tx:
                tx.set("acct", (3,), 3)
        assert db.seqno == 1 and db.get("acct", (2,)) is None  # nothing of a refused commit stays
        db.set_lease(None)
        assert db.set("acct", (2,), 2) == 2


def test_a_fenced_member_still_applies_what_it_receives(tmp_path):
    multisite.create(tmp_path / "A", name="A")
    multisite.create(tmp_path / "B", name="B")
    with multisite.open(tmp_path / "A") as a:
        a.create_region("acct")
        a.set("acct", (1,), 1)
        frames = list(iter_frames(a.layout.journal, whole=True))
    with multisite.open(tmp_path / "B") as b:
        b.update_info(lambda i: setattr(i, "role", "secondary"))
        b.set_lease(0.0)  # fenced: a demoted primary that now receives from the new one
        b.apply_frames([FrameRun.of(frames)])
        assert b.seqno == a.seqno and b.get("acct", (1,)) == 1


@pytest.mark.parametrize("durability", ["fsync", "group", "none"])
def test_a_lease_that_ends_between_the_check_and_the_commit_time_refuses_the_commit(tmp_path, durability,
                                                                                    monkeypatch):
    """A primary paused after ``prepare`` checked its lease and before its record took its time wrote a
    record dated after the lease, when another member may already be primary (a seeded HA round found
    two primaries' commits overlapping so). The lease is checked again once the time is taken."""
    from multisite.engine import core as core_mod

    multisite.create(tmp_path / "A", name="A", durability=durability)
    with multisite.open(tmp_path / "A") as db:
        db.create_region("acct")
        db.set_lease(time.monotonic() + 60)
        assert db.set("acct", (1,), 1) == 1
        real = time.time

        def paused_at_the_stamp() -> float:  # the lease ends while the record takes its time
            db.set_lease(time.monotonic() - 0.001)
            return real()

        monkeypatch.setattr(core_mod.time, "time", paused_at_the_stamp)
        with pytest.raises(NotPrimary, match="fenced"):
            db.set("acct", (2,), 2)
        monkeypatch.setattr(core_mod.time, "time", real)
        assert db.seqno == 1 and db.get("acct", (2,)) is None
        db.set_lease(time.monotonic() + 60)
        assert db.set("acct", (2,), 2) == 2
    assert [seqno for seqno, _ in iter_frames(tmp_path / "A" / "journal")] == [1, 2]
