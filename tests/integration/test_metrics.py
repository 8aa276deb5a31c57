"""/metrics of real instance servers: parsed with prometheus-client's own text parser, and every value
checked against the same server's ``status --json`` (control ``status``) taken at the same quiet moment."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from multisite.errors import RegionNotFound
from multisite.testing.checks import wait_until


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def one(samples: dict, metric: str, **labels) -> float:
    want = tuple(sorted(labels.items()))
    hits = [v for (n, lab), v in samples.items() if n == metric and all(x in lab for x in want)]
    assert len(hits) == 1, f"{metric}{labels}: {len(hits)} samples"
    return hits[0]


def test_metrics_match_status_on_a_primary_and_its_secondary(cluster):
    a = cluster.instance("A", start=False).start(metrics=True)
    b = cluster.instance("B", start=False).start(metrics=True)
    cluster.link(a, b)
    n = 40
    with a.client() as db:
        db.create_region("acct")
        for i in range(n):
            db.set("acct", ("k", i), i)
        with pytest.raises(RegionNotFound):
            db.get("nowhere", ("k",))
    cluster.wait_caught_up(a, b)
    wait_until(lambda: a.status()["sources"]["B"]["last_confirmed"] == a.seqno(), timeout_s=10)

    st, m = a.status(), scrape(a.metrics_port)
    assert st["metrics"].endswith(f":{a.metrics_port}")
    inst = {}
    assert one(m, "multisite_instance_seqno", **inst) == st["seqno"] == n
    assert one(m, "multisite_instance_info", name="A", role="primary") == 1
    assert one(m, "multisite_journal_pool_bytes", **inst) == st["pool"]["bytes"]
    assert one(m, "multisite_journal_pool_capacity_bytes", **inst) == st["pool"]["capacity_bytes"]
    assert one(m, "multisite_journal_transactions_total", **inst) == n
    assert one(m, "multisite_journal_fsyncs_total", **inst) >= 1
    assert one(m, "multisite_journal_commits_per_fsync", **inst) > 0
    s = st["sources"]["B"]
    link = {"secondary": "B"}
    assert one(m, "multisite_source_last_confirmed_seqno", **link) == s["last_confirmed"] == n
    assert one(m, "multisite_source_backlog_transactions", **link) == s["backlog"] == 0
    assert one(m, "multisite_source_backlog_bytes", **link) == 0
    assert one(m, "multisite_source_sent_transactions_total", **link) == s["sent_records"]
    assert one(m, "multisite_source_connects_total", **link) == s["connects"] == 1
    assert one(m, "multisite_source_info", **link, state="streaming", mode="active") == 1
    assert one(m, "multisite_source_lag_seconds", **link) == s["lag_s"] == 0
    assert one(m, "multisite_source_xoff_seconds_total", **link) == 0
    # Observed as they happen: one commit per set plus create_region, and the error by its code.
    assert one(m, "multisite_commit_seconds_count", **inst) == n
    assert one(m, "multisite_commit_seconds_bucket", **inst, le="+Inf") == n
    assert 0 < one(m, "multisite_commit_seconds_sum", **inst) < n * 5
    assert one(m, "multisite_client_errors_total", **inst, code="REGION_NOT_FOUND") == 1
    sampled = ("multisite_source_lag_sampled_seconds_count", ())
    wait_until(lambda: scrape(a.metrics_port).get(sampled, 0) >= 1, timeout_s=5)

    st, m = b.status(), scrape(b.metrics_port)
    r = st["receiver"]
    binst = {}
    assert one(m, "multisite_instance_info", name="B", role="secondary") == 1
    assert one(m, "multisite_instance_seqno", **binst) == st["seqno"] == n
    assert one(m, "multisite_receiver_received_seqno", **binst, source="A") == r["received_seqno"]
    assert one(m, "multisite_receiver_received_transactions_total", **binst) == r["received_records"] == n
    assert one(m, "multisite_receiver_connections_total", **binst) == r["connections"]
    assert one(m, "multisite_receiver_refusals_total", **binst) == r["refusals"]
    assert one(m, "multisite_receiver_xoffs_total", **binst) == r["xoffs"]
    assert one(m, "multisite_receiver_connected", **binst) == 1
    assert one(m, "multisite_update_applied_transactions_total", **binst) == st["update"]["applied"] == n
    assert one(m, "multisite_update_running", **binst) == 1
    assert one(m, "multisite_receive_pool_transactions", **binst) == len([]) == r["backlog"]
    assert one(m, "multisite_receive_pool_high_bytes", **binst) > 0


def test_backlog_metrics_follow_a_stopped_secondary(cluster):
    """With the secondary's server gone, the backlog grows in transactions and in bytes, and the link
    leaves the streaming state."""
    a = cluster.instance("A", start=False).start(metrics=True)
    b = cluster.instance("B")
    cluster.link(a, b)
    with a.client() as db:
        db.create_region("acct")
    cluster.wait_caught_up(a, b)
    b.kill()
    with a.client() as db:
        for i in range(25):
            db.set("acct", ("k", i), "x" * 100)
    link = {"secondary": "B"}
    wait_until(lambda: not [k for k in scrape(a.metrics_port) if k[0] == "multisite_source_info"
                            and dict(k[1])["state"] in ("streaming", "xoff")], timeout_s=15, what="A→B down")
    m, s = scrape(a.metrics_port), a.status()["sources"]["B"]
    assert one(m, "multisite_source_backlog_transactions", **link) == s["backlog"] >= 25
    assert one(m, "multisite_source_backlog_bytes", **link) > 25 * 100
    assert one(m, "multisite_source_lag_seconds", **link) > 0


def test_a_server_with_metrics_stops_cleanly(cluster):
    """The endpoint closes with the server, and the rest of the shutdown (clients, engine) still runs."""
    a = cluster.instance("A", start=False).start(metrics=True)
    port = a.metrics_port
    assert scrape(port)
    a.stop()
    log = (a.root / "log" / "server.log").read_text()
    assert "instance server stopped at seqno 0" in log and "Traceback" not in log
    with pytest.raises(OSError):
        scrape(port)


def test_metrics_address_taken_is_a_clear_error(cluster, tmp_path):
    from multisite.errors import ServerError
    from multisite.server.process import start_server

    a = cluster.instance("A", start=False).start(metrics=True)
    b = cluster.instance("B", start=False)
    with pytest.raises(ServerError, match=f"cannot serve metrics on 127.0.0.1:{a.metrics_port}"):
        start_server(b.root, None, metrics=f"127.0.0.1:{a.metrics_port}")


def test_docserver_metrics_match_its_status(tmp_path):
    """A document server's /metrics (docserver start --metrics) against its status after a session."""
    import json

    from multisite.testing.docservers import DocCluster

    with DocCluster(tmp_path, durability="none") as dc:
        a = dc.server("A", ["P"])
        b = dc.server("B", ["P"], replica_of=a, start=False)
        b.options["start"] = {"metrics": "127.0.0.1:0"}
        dc.start(b)
        for i in range(3):
            dc.call(a, "doc.create", db="P", form="F", fields={"n": i})
        dc.replicate(b, a, "pull-only")  # B's Replicator runs the session
        port = json.loads((b.home / "run" / "docserver.json").read_text())["metrics_port"]
        m, st = scrape(port), dc.call(b, "status")
        assert one(m, "multisite_docserver_info", name="B") == 1
        assert one(m, "multisite_docserver_replicators") == st["replicators"] == 1
        assert one(m, "multisite_docserver_sessions_total") == st["sessions_done"] == 1
        assert one(m, "multisite_docserver_sessions_active") == len(st["active"]) == 0
        assert one(m, "multisite_docserver_sessions_queued") == st["queued"] == 0
        (d,) = st["databases"]
        assert one(m, "multisite_docdb_changeno", title="P", replica_id=d["replica_id"]) == d["changeno"] >= 3


def test_grid_catalog_and_container_metrics_match_their_status(tmp_path):
    """A grid container's /metrics (container start --metrics) against its status: roles, seqnos and
    epochs of its shards, and the primaries' replica links; the catalog's (catalog start --metrics)
    against grid status."""
    import json

    from multisite.net import control
    from multisite.testing.grid import GridCluster

    g = GridCluster(tmp_path, partitions=2, min_sync=1, max_sync=1, max_async=0)
    try:
        g.start_catalog(metrics="127.0.0.1:0")
        g.start_container("c1", metrics="127.0.0.1:0")
        g.start_container("c2")
        wait_until(lambda: g.settled(), timeout_s=60, what="a settled placement")
        with g.client() as cl:
            for i in range(10):
                cl.put("m", ("k", i), i)
        root = tmp_path / "c1"
        port = json.loads((root / "run" / "container.json").read_text())["metrics_port"]

        def agree():
            st, m = control.call(root, "status"), scrape(port)
            return st if all(one(m, "multisite_shard_seqno", partition=p) == sh["seqno"]
                             for p, sh in st["shards"].items()) else None
        st = wait_until(agree, timeout_s=10, what="a quiet moment")
        m = scrape(port)
        assert one(m, "multisite_container_info", name="c1") == 1
        assert one(m, "multisite_container_registered") == 1 and one(m, "multisite_container_lease_ok") == 1
        assert one(m, "multisite_container_placement_version") == st["applied_version"]
        assert len(st["shards"]) == 2  # each partition: primary on one container, sync replica on the other
        for p, sh in st["shards"].items():
            assert one(m, "multisite_shard_info", partition=p, role=sh["role"]) == 1
            assert one(m, "multisite_shard_epoch", partition=p) == sh["epoch"]
            for n, lk in (sh.get("links") or {}).items():
                assert one(m, "multisite_shard_replica_backlog_transactions", partition=p, replica=n) == lk["backlog"]
                assert one(m, "multisite_shard_replica_live", partition=p, replica=n) == 1
        assert sum(one(m, "multisite_shard_seqno", partition=p) for p in st["shards"]) >= 10

        cport = json.loads((tmp_path / "catalog" / "run" / "catalog.json").read_text())["metrics_port"]
        cst, cm = g.status(), scrape(cport)
        assert one(cm, "multisite_catalog_info", grid="orders") == 1
        assert one(cm, "multisite_catalog_placement_version") == cst["version"]
        assert one(cm, "multisite_catalog_partitions_without_primary") == 0
        assert one(cm, "multisite_catalog_under_replicated") == len(cst["under_replicated"])
        for c in cst["containers"]:
            assert one(cm, "multisite_catalog_container_up", container=c["name"]) == 1
            assert one(cm, "multisite_catalog_container_shards", container=c["name"]) == c["shards"] == 2
            assert one(cm, "multisite_catalog_container_primaries", container=c["name"]) == c["primaries"]
        # Seqnos arrive with heartbeats: the backlogs move between two reads, the replicas do not.
        assert {(str(p["partition"]), c) for p in cst["partitions"] for c in p["backlog"]} == \
            {(dict(lab)["partition"], dict(lab)["container"]) for (n, lab) in cm
             if n == "multisite_catalog_replica_backlog_transactions"}
    finally:
        g.stop_all()


def test_delivery_agent_metrics_match_its_table(tmp_path):
    """A real `delivery agent --metrics` process: its poll counts and SYSREMOTEUSER offsets on /metrics,
    checked against `delivery status` once it is stopped (nothing moves by then)."""
    import signal

    from multisite import engine
    from multisite.delivery.server import api
    from multisite.testing.delivery import FIELD, REGION, agent_process, make_topology, poll
    from multisite.testing.ports import free_port

    top = make_topology(tmp_path, {"P": "fr"}, durability="none")
    with engine.open(top.hq) as db:
        for i in range(5):
            db.set(REGION, ("hq", i), {FIELD: "fr", "n": i})
    port = free_port()
    proc = agent_process(top.hq, "--interval", "0.1", "--metrics", f"127.0.0.1:{port}")
    try:
        def sent():
            try:
                m = scrape(port)
            except OSError:
                return None
            return m if one(m, "multisite_agent_sent_transactions_total") == 5 else None
        wait_until(sent, timeout_s=30, what="the agent sent 5 transactions")
        poll(top.remotes["P"])  # P applies them and confirms
        def confirmed():
            m = scrape(port)
            sent = one(m, "multisite_agent_log_sent_offset", user="P")
            return m if one(m, "multisite_agent_confirm_sent_offset", user="P") == sent > 0 else None
        m = wait_until(confirmed, timeout_s=30, what="HQ received P's confirmation")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    with engine.open(top.hq) as db:
        st = api.status(db)
    (row,) = st["remote_users"]
    assert one(m, "multisite_agent_info", instance="HQ", role="consolidated") == 1
    for f in ("log_sent", "confirm_sent", "log_received", "confirm_received"):
        assert one(m, f"multisite_agent_{f}_offset", user="P", publication="sales") == row[f]
    assert one(m, "multisite_agent_polls_total") >= 2 and one(m, "multisite_agent_rejected_total") == 0
