"""``ha switchover``'s checks (cli/ha_cmds.py) against views read from etcd, without etcd: the target
must be a member, not the primary, and within --max-lag of the primary as of the primary's latest record."""

from __future__ import annotations

import pytest

from multisite.cli.ha_cmds import check_switchover, switchover_view
from multisite.errors import ConfigError, ServerError
from multisite.ha.decide import Leader, Member, View


def view(a: int, c: int | None, left: float = 0.7, leader: str | None = "A") -> View:
    ms = [Member("A", "G", seqno=a, role="primary", lease_left_s=left), Member("B", "G", seqno=a)]
    ms += [Member("C", "G", seqno=c)] if c is not None else []
    return View(True, Leader(leader, 1) if leader else None, tuple(ms))


class Reads:
    """Views in the order etcd gives them, on a fake clock."""

    def __init__(self, *views: View):
        self.views, self.now = list(views), 0.0

    def clock(self) -> float:
        return self.now

    def read(self) -> View:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_target_paused_behind_the_primary_is_refused_though_the_first_record_of_the_primary_predates_its_commits():
    """C paused at seqno 31; the primary took 30 more commits, its record (one a pass, every ttl/3) still
    at 31: read once, C looked level with it. The primary's next record shows the 30."""
    r = Reads(view(31, 31), view(31, 31), view(61, 31, left=0.74))
    check_switchover(view(31, 31), "c1", "C", max_lag=5)  # the first read alone: accepted (it was)
    v = switchover_view(r.read, sleep=r.sleep, clock=r.clock)
    with pytest.raises(ConfigError, match="lags the primary A by 30 transactions"):
        check_switchover(v, "c1", "C", max_lag=5)


def test_a_leader_that_does_not_publish_again_leaves_its_last_record_after_the_wait():
    r = Reads(view(31, 31))
    v = switchover_view(r.read, wait_s=1.0, sleep=r.sleep, clock=r.clock)
    assert r.now >= 1.0
    check_switchover(v, "c1", "C", max_lag=5)  # nothing newer to go by


def test_an_unknown_or_current_target_and_a_cluster_with_no_leader_are_refused():
    for v, to, err, what in [(view(5, None), "C", ConfigError, "not a member"),
                             (view(5, 5), "A", ConfigError, "primary already"),
                             (view(5, 5, leader=None), "C", ServerError, "no leader")]:
        r = Reads(v)
        got = switchover_view(r.read, sleep=r.sleep, clock=r.clock)
        with pytest.raises(err, match=what):
            check_switchover(got, "c1", to, max_lag=5)


def test_a_leader_whose_record_is_missing_is_a_try_again_not_a_crash():
    """The demo's switchover back to A met a view whose leader key was held and its holder's record
    gone (a new leader that had not published yet): the lag check raised StopIteration."""
    no_record = View(True, Leader("B", 2), (Member("A", "G", seqno=9), Member("C", "G", seqno=9)))
    with pytest.raises(ServerError, match="not published its record yet; try again"):
        check_switchover(no_record, "c1", "A", max_lag=5)
    r = Reads(view(31, 31), View(True, Leader("A", 1), (Member("B", "G", seqno=31), Member("C", "G", seqno=31))))
    v = switchover_view(r.read, wait_s=1.0, sleep=r.sleep, clock=r.clock)
    check_switchover(v, "c1", "C", max_lag=5)  # the record gone meanwhile: the first view, which had it
