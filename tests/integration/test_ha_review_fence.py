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


def test_ha_review_ha_start_with_min_confirm_0_after_1_turns_it_off(tmp_path, etcd_cluster):
    # a manager set min-confirm only when it was not 0, so the server kept the previous manager's 1:
    # with no secondary, every commit waited 5 s and was refused MIN_CONFIRM_TIMEOUT
    c = HACluster(tmp_path, etcd_cluster.endpoints, ["A"], ttl_s=1.0, min_confirm=1, cluster=f"r-{tmp_path.name}")
    c.start()
    try:
        c.wait_primary()
        stop_ha(c.root("A"))
        start_ha(c.root("A"), c.cluster, c.etcd, ttl_s=1.0, min_confirm=0)
        assert (c.status("A") or {}).get("min_confirm") is None
        with multisite.connect(c.address("A"), failover_timeout_s=10) as db:
            db.create_region("acct")
        with multisite.connect(c.address("A"), timeout=10) as db:
            _wait_not_fenced(db)
            assert db.set("acct", (1,), 1) > 0
    finally:
        c.stop()


def _wait_not_fenced(db) -> None:
    import time

    deadline = time.monotonic() + 10
    while db.info().get("fenced") and time.monotonic() < deadline:
        time.sleep(0.05)


def test_ha_review_a_member_joining_as_a_primary_takes_no_commit_beside_the_leader(ha, tmp_path):
    # a new instance is a primary (the default of `instance create`); once `ha start` returned, it is
    # under the manager, which must not leave it taking commits until its first pass rejoins it
    from multisite import engine

    lead = ha.wait_primary()
    ha.wait_followers()
    with ha.client() as db:
        db.create_region("acct")
        db.set("acct", ("before",), 1)
    root = engine.create(tmp_path / "D", "D")
    info = start_server(root, "127.0.0.1:0")
    try:
        start_ha(root, ha.cluster, ha.etcd, ttl_s=1.0)
        with multisite.connect(f"127.0.0.1:{info['client_port']}") as db:
            try:
                db.create_region("acct")
            except NotPrimary:
                pass
            with pytest.raises(NotPrimary):  # fenced, or a secondary already: either way no primary
                db.set("acct", ("on-the-new-member",), 1)
    finally:
        stop_ha(root)
        stop_server(root, 5)
    assert lead == ha.wait_primary()
