"""Review of issue 25: a fenced or lost primary's server, started again, must not take commits beside
the new primary (the fence lived only in the server's memory)."""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import NotPrimary
from multisite.ha.process import start_ha, stop_ha
from multisite.server.process import start_server, stop_server
from multisite.testing.ha import HACluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ha(tmp_path, etcd_cluster):
    c = HACluster(tmp_path, etcd_cluster.endpoints, ["A", "B", "C"], ttl_s=1.0, cluster=f"r-{tmp_path.name}")
    c.start()
    yield c
    c.stop()


def _commit_on(ha: HACluster, name: str) -> None:
    with multisite.connect(ha.address(name)) as db:
        db.set("acct", ("on-the-old-primary",), 1)


def test_ha_review_a_stopped_leader_restarted_stays_fenced(ha):
    old = ha.wait_primary()
    ha.wait_followers()
    with ha.client() as db:
        db.create_region("acct")
        db.set("acct", ("before",), 1)
    ha.wait_identical()
    stop_ha(ha.root(old))
    ha.wait_primary(exclude=old, timeout_s=10)
    stop_server(ha.root(old), 5)  # maintenance: the server is restarted, its manager still stopped
    start_server(ha.root(old), ha.address(old))
    with pytest.raises(NotPrimary):
        _commit_on(ha, old)
    start_ha(ha.root(old), ha.cluster, ha.etcd, ttl_s=1.0)  # a manager again: it rejoins the new primary
    ha.wait_role(old, "secondary", timeout_s=10)
    ha.wait_followers()
    with ha.client() as db:
        db.set("acct", ("after",), 1)
    ha.wait_identical()


def test_ha_review_a_lost_primary_started_again_takes_no_commit_before_its_manager_rejoins_it(ha):
    old = ha.wait_primary()
    ha.wait_followers()
    with ha.client() as db:
        db.create_region("acct")
    ha.lose_host(old)
    ha.wait_primary(exclude=old, timeout_s=10)
    # the host is back: `ha start` starts the server first, then the manager, which rejoins it
    (ha.root(old) / "run" / "ha.json").unlink(missing_ok=True)
    start_server(ha.root(old), ha.address(old))
    with pytest.raises(NotPrimary):
        _commit_on(ha, old)
