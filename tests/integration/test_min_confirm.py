"""``--min-confirm N``: a commit is answered only once N secondaries confirmed they hardened it (issue 25)."""

from __future__ import annotations

import time

import pytest

import multisite
from multisite.errors import ConfigError, MinConfirmTimeout


def test_a_commit_waits_for_the_secondary_and_is_answered_once_it_confirmed(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    res = a.call("min_confirm", n=1, timeout_s=5)
    assert res["min_confirm"] == 1
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        for i in range(50):
            seqno = db.set("acct", (i,), i)
            assert b.seqno() >= seqno  # answered only once B had it
    st = a.status()["min_confirm"]
    assert st["n"] == 1 and list(st["counting"]) == ["B"]


def test_without_enough_secondaries_a_commit_is_refused_after_the_timeout_naming_why(cluster):
    a = cluster.instance("A")
    a.call("min_confirm", n=1, timeout_s=0.5)
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        t0 = time.monotonic()
        with pytest.raises(MinConfirmTimeout, match="not confirmed by 1 secondary within 0.5 s .*0 of the 1"):
            db.set("acct", (1,), 1)
        assert 0.4 < time.monotonic() - t0 < 3
        a.call("min_confirm", n=0)
        assert db.set("acct", (2,), 2) == 2
        assert db.get("acct", (1,)) == 1  # it was hard here: refused means unconfirmed, not undone


def test_min_confirm_refuses_nonsense(cluster):
    a = cluster.instance("A")
    with pytest.raises(ConfigError, match="min-confirm"):
        a.call("min_confirm", n=-1)
