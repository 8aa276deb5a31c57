"""The dashboard's sans-IO model: link states, roles, the series kept in memory, who may read the page,
and a status rebuilt from /metrics samples."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from multisite.web import model


def test_link_states_from_source_status():
    assert model.link_state({"state": "streaming"}) == "streaming"
    assert model.link_state({"state": "xoff"}) == "xoff"
    assert model.link_state({"state": "passive", "mode": "passive"}) == "passive"
    assert model.link_state({"state": "connecting", "last_error": "WRONG_NAME: this is C, not B"}) == "refused"
    assert model.link_state({"state": "error", "last_error": "FILTER: failed"}) == "refused"
    tcp = "connection refused by 127.0.0.1:1 (is B's receiver server running?)"
    assert model.link_state({"state": "connecting", "last_error": tcp}) == "disconnected"
    assert model.link_state({"state": "lost"}) == "disconnected"
    assert model.link_state({"state": "streaming"}, source_reachable=False) == "disconnected"


def cascade(b_reachable: bool = True):
    a = {"name": "A", "role": "primary", "seqno": 10, "sources": {"B": {"state": "streaming", "backlog": 2,
                                                                          "lag_s": 0.5}}}
    b = {"name": "B", "role": "secondary", "seqno": 8, "sources": {"C": {"state": "streaming", "backlog": 0}}}
    c = {"name": "C", "role": "secondary", "seqno": 8, "sources": {}}
    return [("/a", a, True, None), ("/b", b, b_reachable, None if b_reachable else "gone"), ("/c", c, True, None)]


def test_topology_roles_and_links():
    t = model.topology(cascade())
    assert [(i["name"], i["role"]) for i in t["instances"]] == [("A", "primary"), ("B", "cascading"),
                                                                ("C", "secondary")]
    assert [(ln["id"], ln["state"], ln["backlog"]) for ln in t["links"]] == [("A→B", "streaming", 2),
                                                                             ("B→C", "streaming", 0)]
    t = model.topology(cascade(b_reachable=False))
    assert [ln["state"] for ln in t["links"]] == ["streaming", "disconnected"]  # B's source is gone with B
    sup = model.topology([("/s", {"name": "S", "role": "primary", "supplementary": True}, True, None)])
    assert sup["instances"][0]["role"] == "supplementary"


def test_a_link_to_an_instance_not_targeted_adds_its_node():
    t = model.topology(cascade()[:1])
    assert [(i["name"], i["reachable"]) for i in t["instances"]] == [("A", True), ("B", False)]


def test_series_keep_an_hour_and_rate_commits():
    s = model.Series(interval_s=1.0, history_s=5.0)
    for k in range(10):
        targets = cascade()
        targets[0][1]["seqno"] = 100 + 50 * k
        topo = model.topology(targets)
        s.add(1000.0 + k, topo, {v[1]["name"]: v[1] for v in targets})
    j = s.to_json()
    assert len(j["links"]["A→B"]["t"]) == 6 and j["links"]["A→B"]["t"][-1] == 1009.0
    assert j["links"]["A→B"]["lag_s"][-1] == 0.5 and j["links"]["A→B"]["backlog"][-1] == 2
    assert j["commits"]["A"]["rate"][-1] == 50.0
    assert "B" not in j["commits"]  # a secondary commits nothing of its own


def test_access_is_loopback_or_token():
    assert model.access_allowed("127.0.0.1", None, None)
    assert model.access_allowed("::1", None, "t")
    assert not model.access_allowed("192.0.2.7", None, None)
    assert not model.access_allowed("192.0.2.7", "t", None)  # no token configured: no way in
    assert not model.access_allowed("192.0.2.7", "x", "t")
    assert model.access_allowed("192.0.2.7", "t", "t")
    assert not model.access_allowed(None, None, None)


def test_status_from_metrics_text():
    text = """# TYPE multisite_instance_info gauge
multisite_instance_info{name="A",role="primary",group="",durability="group"} 1.0
multisite_instance_seqno 42.0
multisite_source_info{secondary="B",state="streaming",mode="active"} 1.0
multisite_source_backlog_transactions{secondary="B"} 3.0
multisite_source_lag_seconds{secondary="B"} 0.25
"""
    st = model.status_from_metrics((s.name, s.labels, s.value) for f in text_string_to_metric_families(text)
                                   for s in f.samples)
    assert st["name"] == "A" and st["role"] == "primary" and st["seqno"] == 42
    assert st["sources"]["B"] == {"state": "streaming", "mode": "active", "backlog": 3, "lag_s": 0.25}


def test_connection_rows_take_each_document_from_the_server_that_fires_it():
    doc = {"unid": "U1", "source": "A", "destination": "B", "address": "h:1", "databases": "*", "mode": "pull-push",
           "at": None, "range": "08:00:00-18:00:00", "interval_s": 600.0, "days": [0, 1, 2, 3, 4],
           "enabled": True, "last_run": None, "last_result": None, "runs": 0}
    seen_by_b = {**doc, "mine": False, "next_run": None}
    fired_by_a = {**doc, "mine": True, "next_run": 1000.0, "last_run": 400.0, "runs": 2}
    rows = model.connection_rows([("/homes/B", [seen_by_b, {"unid": "U2", "error": "bad mode", "mine": False}], None),
                                  ("/homes/A", [fired_by_a], None),
                                  ("/homes/C", [], "no document server is running with home /homes/C")])
    assert [(r.get("unid"), r["instance"]) for r in rows] == [("U1", "A"), ("U2", "/homes/B"), (None, "/homes/C")]
    one = rows[0]
    assert one["schedule"] == "08:00:00-18:00:00 every 600 s on Mon,Tue,Wed,Thu,Fri" and one["next_run"] == 1000.0
    assert one["updated"] == 400.0 and one["runs"] == 2 and one["kind"] == "connection document"
    assert rows[1]["error"] == "bad mode" and "no document server" in rows[2]["error"]
