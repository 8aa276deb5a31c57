"""Review of issue 25's --min-confirm: commits answered before a secondary confirmed them."""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import MinConfirmTimeout


def test_ha_review_min_confirm_holds_commits_of_a_primary_with_durability_none(cluster):
    # durability none: nothing to fdatasync here, so the batch had no token and its commits were
    # answered at once, whatever --min-confirm said
    a = cluster.instance("A", durability="none")
    a.call("min_confirm", n=1, timeout_s=0.5)
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        with pytest.raises(MinConfirmTimeout):
            db.set("acct", (1,), 1)


def test_ha_review_min_confirm_set_to_zero_and_back_still_holds_commits(cluster):
    # min-confirm 0 answered what waited by "confirming" up to 2**62, and that mark stayed: once set
    # to 1 again, every commit was answered with no secondary at all
    a = cluster.instance("A")
    a.call("min_confirm", n=1, timeout_s=0.5)
    a.call("min_confirm", n=0)
    a.call("min_confirm", n=1, timeout_s=0.5)
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        with pytest.raises(MinConfirmTimeout):
            db.set("acct", (1,), 1)


def test_ha_review_min_confirm_after_a_rollback_holds_the_seqnos_given_again(cluster):
    # B confirmed up to 10; A rolled back to 4 (as a demoted primary does at rejoin) and B is gone.
    # The mark "confirmed up to 10" stayed, so A's new commits 5..10, which nobody has, were answered
    # as confirmed at once
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    a.call("min_confirm", n=1, timeout_s=5)
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        for i in range(10):
            db.set("acct", (i,), i)
    assert a.seqno() == 10
    a.call("source.deactivate", secondary="B")
    a.call("source.stop", secondary="B", timeout_s=0.5)
    b.stop()
    assert a.call("rollback", resync=4)["rolled_back"]
    a.call("min_confirm", n=1, timeout_s=0.5)
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        with pytest.raises(MinConfirmTimeout):
            db.set("acct", ("after",), 1)
