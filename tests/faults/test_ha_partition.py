"""A network partition across hosts (issue 25): the primary cut off from etcd and from the secondaries.

Six network namespaces joined by a bridge (``testing/netns.py``): three etcd members (e1, e2, e3) and
three members (A, B, C), each an instance server with its HA manager inside its namespace. The writer, in
the test's own namespace, reaches every member. The primary's host is then cut from every other host
(nft drops, both ways), but not from the writer, which goes on sending it commits. Checked:

- the old primary stops accepting commits within its lease, before it can end (a client of its own
  gets NOT_PRIMARY), though it never heard from etcd that it lost;
- a secondary is promoted and the writer's commits go on there;
- after the heal the old primary rolls back what it took after the cut into its lost file and rejoins;
- every acknowledged commit is on the new primary or in that lost file, none silently lost, and all
  members end identical;
- from the journals and lost files: no two members took commits at the same time, and the gap between
  the old primary's last commit and the new one's first is at least the fence margin.
"""

from __future__ import annotations

import time

import pytest

import multisite
from multisite.errors import NotPrimary
from multisite.ha.decide import Timing
from multisite.journal.lostfile import LostFile, list_lost_files
from multisite.testing.checks import wait_until
from multisite.testing.etcd import EtcdCluster
from multisite.testing.ha import REGION, HACluster
from multisite.testing.ha_checks import check_one_primary_at_a_time, history_report, journal_updates, leadership_periods
from multisite.testing.netns import Hosts, netns_unavailable

WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}"),
              pytest.mark.timeout(300)]

ETCD_HOSTS = ["e1", "e2", "e3"]
MEMBERS = ["A", "B", "C"]
TTL_S = 1.0
TIMING = Timing(ttl_s=TTL_S)
CLOCK_SLACK_S = 0.05  # wall clock (journal times) against the monotonic clock the fence reads
PROMOTION_TIMEOUT_S = 20.0
REJOIN_TIMEOUT_S = 60.0  # the old primary's manager has etcd calls to time out before it sees the heal


@pytest.fixture
def partitioned(tmp_path):
    with Hosts("msha", [*ETCD_HOSTS, *MEMBERS]) as hosts, \
            EtcdCluster(tmp_path, hosts=[hosts.address(h) for h in ETCD_HOSTS],
                        prefixes=[hosts.prefix(h) for h in ETCD_HOSTS]) as etcd:
        c = HACluster(tmp_path, etcd.endpoints, MEMBERS, ttl_s=TTL_S, cluster="partition", hosts=hosts)
        try:
            c.start()
            yield hosts, c
        finally:
            hosts.heal_all()
            c.stop()


def test_a_primary_cut_off_is_fenced_within_its_lease_replaced_and_rejoins_with_its_lost_file(partitioned):
    hosts, c = partitioned
    old = c.wait_primary()
    c.wait_followers()
    w = c.writer()
    wait_until(lambda: len(w.acked) >= 50, timeout_s=30, what="the writer's first commits")

    cut_wall, cut = time.time(), time.monotonic()
    hosts.isolate(old)  # from etcd and the other members; the writer still reaches it
    new = c.wait_primary(exclude=old, timeout_s=PROMOTION_TIMEOUT_S)
    first_new = w.wait_commit_after(cut, PROMOTION_TIMEOUT_S, on=c.address(new))
    with multisite.connect(c.address(old)) as db, pytest.raises(NotPrimary, match="fenced"):
        db.set("acct", ("on-the-old-primary",), 1)  # still cut off: it refuses by itself
    acked_by_old_after_cut = [i for t, i, a in w.ack_times if t > cut and a == c.address(old)]

    hosts.heal_all()
    c.wait_role(old, "secondary", timeout_s=REJOIN_TIMEOUT_S)
    time.sleep(0.5)
    w.stop()
    c.wait_followers(timeout_s=REJOIN_TIMEOUT_S)
    c.wait_identical()
    c.check_acknowledged(w)  # on the new primary or in a lost file: none silently lost
    h = w.history.history()  # and the writer's history (testing/history): what it read after the cut too
    keys = {o.key for o in h}
    report = history_report(h, keys, c.rows(new), c.lost_rows(), journal_updates(c.root(new), REGION, keys),
                            min_confirm=False)
    report.assert_clean("partition")
    assert c.primary() == new
    lost = {tuple(u["key"]) for path in list_lost_files(c.root(old) / "lost")
            for t in LostFile.read(path).transactions for u in t["updates"]}
    new_rows = set(c.rows(new))
    # what the old primary acknowledged after the cut and the new one never got (commits between the cut's
    # taking effect and the old primary's fence): in its lost file, rolled back when it rejoined. Under load
    # the writer may make no commit in that window, and then there is nothing to lose.
    unreplicated = {w.key(i) for i in acked_by_old_after_cut} - new_rows
    assert unreplicated <= lost, (f"{len(unreplicated - lost)} of {len(acked_by_old_after_cut)} commits {old} "
                                  f"acknowledged after the cut are neither on {new} nor in {old}'s lost file")
    assert not lost & new_rows  # rolled back on the old primary, never on the new one
    c.stop()

    periods = leadership_periods(c.root(n) for n in MEMBERS)
    gap = check_one_primary_at_a_time(periods)
    last_old = max(p.last_time for p in periods if p.origin == old)
    first_of_new = min(p.first_time for p in periods if p.origin == new)
    print(f"\npartition: {old} cut at 0; its last commit at {last_old - cut_wall:+.3f} s (fence deadline at most "
          f"{TTL_S - TIMING.margin_s:.2f} s); {new} primary, its first commit at {first_of_new - cut_wall:+.3f} s "
          f"(the writer's at {first_new - cut:+.3f} s); smallest gap between two leaders {gap:.3f} s; "
          f"{len(acked_by_old_after_cut)} acknowledged by {old} after the cut, {len(lost)} in its lost file; "
          f"{len(w.acked)} acknowledged in all; history: {report.summary()}")
    assert last_old <= cut_wall + TTL_S - TIMING.margin_s + CLOCK_SLACK_S, "the old primary committed past its lease"
    assert gap is not None and gap >= TIMING.margin_s - CLOCK_SLACK_S
