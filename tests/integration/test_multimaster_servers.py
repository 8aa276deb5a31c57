"""Document servers as real processes over TCP: the four modes, bookmarks, ACLs, pull-pull, two
replicators at once, connection documents firing on schedule, mutual TLS."""

from __future__ import annotations

import time

import pytest

from multisite.errors import ServerError
from multisite.multimaster.server import docdb
from multisite.testing.certs import make_test_pki
from multisite.testing.docservers import DocCluster


@pytest.fixture
def dc(tmp_path):
    c = DocCluster(tmp_path, durability="none")
    yield c
    c.stop_all()


def _docs(node, title="P"):
    """Fields of every document, conflict documents included, by UNID (read through the server)."""
    return {d["unid"]: d for d in node_docs(node, title)}


def node_docs(node, title="P"):
    from multisite.multimaster.server.process import call
    return call(node.home, "doc.list", db=title)


def _create(dc, node, fields, form="F", title="P"):
    return dc.call(node, "doc.create", db=title, form=form, fields=fields)


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_the_four_modes_move_what_they_say(dc):
    a = dc.server("A", ["P"])
    b = dc.server("B", ["P"], replica_of=a)
    ua = _create(dc, a, {"n": "from A"})
    ub = _create(dc, b, {"n": "from B"})
    r = dc.replicate(a, b, "pull-only")
    assert r["totals"]["new"] == 1
    assert ub in _docs(a) and ua not in _docs(b)  # pull-only: nothing of A's went to B
    ua2 = _create(dc, a, {"n": "again A"})
    ub2 = _create(dc, b, {"n": "again B"})
    r = dc.replicate(a, b, "push-only")
    assert ua in _docs(b) and ua2 in _docs(b) and ub2 not in _docs(a)
    assert r["dbs"][0]["pushed"]["new"] == 2 and not r["dbs"][0]["pulled"]
    r = dc.replicate(a, b, "pull-push")
    assert ub2 in _docs(a)
    assert _docs(a).keys() == _docs(b).keys()
    # pull-pull: A pulls, then B's own Replicator pulls A's changes (its half, run on B)
    ua3 = _create(dc, a, {"n": "pp A"})
    ub3 = _create(dc, b, {"n": "pp B"})
    r = dc.replicate(a, b, "pull-pull")
    assert ub3 in _docs(a)
    assert _wait(lambda: ua3 in _docs(b)), "B's Replicator did not pull its half"
    assert "pull-pull: A asked for our half" in (b.home / "log" / "docserver.log").read_text()


def test_a_second_session_moves_nothing(dc):
    a = dc.server("A", ["P"])
    b = dc.server("B", ["P"], replica_of=a)
    for i in range(30):
        _create(dc, a, {"i": i})
    r1 = dc.replicate(a, b, "pull-push")
    assert r1["totals"]["new"] == 30
    r2 = dc.replicate(a, b, "pull-push")
    assert {k: v for k, v in r2["totals"].items() if k != "unchanged"} == dict.fromkeys(
        ["new", "updated", "deleted", "conflicts", "merged"], 0)
    r3 = dc.replicate(b, a, "pull-push")  # B's bookmarks for A were stored by A's session too
    assert r3["totals"]["new"] == 0 and r3["totals"]["unchanged"] == 0


def test_a_one_way_conflict_appears_only_on_the_side_holding_the_loser(dc):
    a = dc.server("A", ["P"])
    b = dc.server("B", ["P"], replica_of=a)
    u = _create(dc, a, {"v": 0})
    dc.replicate(a, b, "pull-push")
    dc.call(a, "doc.update", db="P", unid=u, fields={"v": "A1"})
    dc.call(b, "doc.update", db="P", unid=u, fields={"v": "B1"})
    dc.call(b, "doc.update", db="P", unid=u, fields={"v": "B2"})  # B's version wins: higher sequence number
    r = dc.replicate(a, b, "pull-only")
    assert r["totals"]["conflicts"] == 1
    da, db_ = _docs(a), _docs(b)
    assert da[u]["fields"]["v"] == "B2"
    conflicts = [d for d in da.values() if d["conflict"]]
    assert len(conflicts) == 1 and conflicts[0]["fields"]["v"] == "A1" and conflicts[0]["fields"]["$Ref"] == u
    assert not any(d["conflict"] for d in db_.values())  # pull-only: nothing written on B
    dc.replicate(a, b, "pull-push")  # the conflict document replicates as any document
    assert conflicts[0]["unid"] in _docs(b)


def test_acl_hides_databases_and_refuses_a_readers_push(dc):
    a = dc.server("A", ["P", "Q"])
    b = dc.server("B", ["P", "Q"], replica_of=a, start=False)
    with docdb.open(b.path("Q")) as q:
        q.set_access("A", "none")
    with docdb.open(b.path("P")) as p:
        p.set_access("A", "reader")
    dc.start(b)
    _create(dc, a, {"x": 1}, title="P")
    _create(dc, b, {"y": 1}, title="P")
    r = dc.replicate(a, b, "pull-push")
    assert [d["title"] for d in r["dbs"]] == ["P"]  # Q is invisible to A
    p = r["dbs"][0]
    assert p["pulled"].get("new") == 1  # a reader may pull
    assert any("ACCESS_DENIED" in x for x in p["refused"])  # ... but not push
    assert "refused Offer from A" in (b.home / "log" / "docserver.log").read_text()


def test_two_replicators_run_sessions_with_two_servers_at_once(dc):
    a = dc.server("A", ["P"], start=False)
    a.options["start"] = {"replicators": 2}
    dc.start(a)
    peers = []
    for name in ("B", "C"):
        n = dc.server(name, ["P"], replica_of=a, start=False)
        with docdb.open(n.path("P")) as d:  # enough documents that each session lasts a while
            d.create_many([("F", {"i": i, "blob": "x" * 100}) for i in range(6000)])
        peers.append(dc.start(n))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        rb, rc = ex.map(lambda n: dc.replicate(a, n, "pull-only"), peers)
    assert rb["peer"] == "B" and rc["peer"] == "C"
    assert rb["totals"]["new"] == rc["totals"]["new"] == 6000
    overlap = min(rb["ended_at"], rc["ended_at"]) - max(rb["started_at"], rc["started_at"])
    assert overlap > 0, "the two sessions ran one after the other"


def test_a_connection_document_fires_on_schedule(dc, tmp_path):
    b = dc.server("B", ["P"])
    a = dc.server("A", ["P", "Names"], replica_of=b, start=False)
    with docdb.open(a.path("Names")) as book:
        book.create("Connection", {"source": "A", "destination": "B", "address": b.address, "databases": ["P"],
                                   "mode": "pull-only", "range": "00:00-23:59:59", "interval_s": 1,
                                   "enabled": True})
        book.create("Connection", {"source": "A", "destination": "B", "address": b.address, "databases": "*",
                                   "mode": "push-only", "at": "00:00", "enabled": False})
    a.options["start"] = {"address_book": str(a.path("Names"))}
    dc.start(a)
    u1 = _create(dc, b, {"n": 1})
    assert _wait(lambda: u1 in _docs(a), 5), "the connection did not fire"
    t_first = time.time()
    u2 = _create(dc, b, {"n": 2})
    assert _wait(lambda: u2 in _docs(a), 5)
    assert time.time() - t_first < 3  # fired again within the interval, not once only
    rows = dc.call(a, "connections")
    fired = [r for r in rows if r["mode"] == "pull-only"][0]
    off = [r for r in rows if r["mode"] == "push-only"][0]
    assert fired["last_run"] and fired["last_result"].startswith("ok") and fired["next_run"] > fired["last_run"]
    assert off["enabled"] is False and off["next_run"] is None and off["last_run"] is None


def test_mutual_tls_replicates_and_an_untrusted_server_is_refused(dc, tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    tls = {"cert": pki["server_cert"], "key": pki["server_key"], "ca": pki["ca_cert"],
           "client_cert": pki["client_cert"], "client_key": pki["client_key"]}
    a = dc.server("A", ["P"], start=False)
    a.options["start"] = {"tls": tls}
    dc.start(a)
    b = dc.server("B", ["P"], replica_of=a, start=False)
    b.options["start"] = {"tls": tls}
    dc.start(b)
    _create(dc, b, {"n": 1})
    assert dc.replicate(a, b, "pull-only")["totals"]["new"] == 1
    rogue = dc.server("R", ["P"], replica_of=a, start=False)
    rogue.options["start"] = {"tls": {"cert": pki["untrusted_cert"], "key": pki["untrusted_key"],
                                      "ca": pki["ca_cert"]}}
    dc.start(rogue)
    with pytest.raises(Exception) as e:
        dc.replicate(rogue, a, "pull-only")
    assert "CONNECTION_LOST" in str(e.value) or "cut" in str(e.value)
    assert _wait(lambda: "TLS handshake failed" in (a.home / "log" / "docserver.log").read_text(), 5)


def test_starting_a_server_on_a_directory_that_is_not_a_document_database_fails_clearly(dc, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="NOT_A_DOCUMENT_DATABASE|not a document database"):
        from multisite.multimaster.server.process import start_docserver
        start_docserver(tmp_path / "home", [str(tmp_path / "empty")], "X", "127.0.0.1:0")
    assert ServerError


def test_with_names_bound_to_certificates_a_server_cannot_claim_another_name(dc, tmp_path):
    from multisite.testing.certs import make_named_cert
    pki = make_test_pki(tmp_path / "pki")

    def tls(name):
        c = make_named_cert(pki, name)
        return {"cert": c["cert"], "key": c["key"], "ca": pki["ca_cert"], "names": True}

    b = dc.server("B", ["P"], start=False)
    b.options["start"] = {"tls": tls("B")}
    with docdb.open(b.path("P")) as p:
        p.set_access("*", "none")
        p.set_access("A", "writer")
    dc.start(b)
    _create(dc, b, {"secret": 1})
    a = dc.server("A", ["P"], replica_of=b, start=False)
    a.options["start"] = {"tls": tls("A")}
    dc.start(a)
    assert dc.replicate(a, b, "pull-only")["totals"]["new"] == 1  # A is A: its certificate says so
    # R holds a valid certificate of the same CA, named R, and says it is A in its Hello.
    from multisite.testing.docservers import DocNode
    r = DocNode("A", tmp_path / "R", dc.make_dbs("R", ["P"], replica_of=b), "127.0.0.1:0",
                {"start": {"tls": tls("R")}})  # named "A", with R's certificate
    dc.nodes["R"] = r
    dc.start(r)
    with pytest.raises(Exception, match="ACCESS_DENIED|certificate names"):
        dc.replicate(r, b, "pull-only")
    assert "its certificate names 'R'" in (b.home / "log" / "docserver.log").read_text()


def test_the_console_verbs_and_status_commands(tmp_path):
    import json

    from click.testing import CliRunner

    from multisite.cli.main import cli

    def run(*args, ok=True):
        res = CliRunner().invoke(cli, [str(x) for x in args], catch_exceptions=False)
        assert (res.exit_code == 0) == ok, res.output
        return res.output

    for name in ("a", "b"):
        run("db", "create", tmp_path / name, "--title", "P", "--durability", "none",
            *(["--replica-of", tmp_path / "a"] if name == "b" else []))
    run("doc", "create", tmp_path / "b", "F", '{"n": 1}')
    run("db", "create", tmp_path / "names", "--title", "Names", "--durability", "none")
    try:
        run("docserver", "start", tmp_path / "a", "--name", "A", "--listen", "127.0.0.1:0", "--home", tmp_path / "hA",
            "--replicators", "2", "--address-book", tmp_path / "names")
        run("docserver", "start", tmp_path / "b", "--name", "B", "--listen", "127.0.0.1:0")  # default home
        st_b = json.loads(run("docserver", "status", tmp_path / "docserver-B", "--json"))
        assert st_b["name"] == "B" and [d["title"] for d in st_b["databases"]] == ["P"]
        addr = st_b["listen"]
        out = run("pull", addr, "P", "--on", tmp_path / "hA")
        assert "pull-only A ⇄ B: 1 new" in out
        pushed = json.loads(run("push", addr, "--on", tmp_path / "hA", "--json"))
        assert pushed["mode"] == "push-only" and pushed["totals"]["new"] == 0
        rep = json.loads(run("replicate", addr, "--on", tmp_path / "hA", "--json"))
        assert rep["mode"] == "pull-push" and rep["peer"] == "B" and rep["seconds"] >= 0
        assert json.loads(run("connections", "list", "--on", tmp_path / "hA", "--json")) == []
        table = run("docserver", "status", tmp_path / "hA")
        assert "2 replicator(s)" in table and "Names" in table and "P" in table
        out = run("replicate", "127.0.0.1:1", "--on", tmp_path / "hA", ok=False)
        assert "CONNECTION_LOST" in out and "cannot reach" in out
    finally:
        for home in (tmp_path / "hA", tmp_path / "docserver-B"):
            if (home / "run" / "docserver.json").exists():
                run("docserver", "stop", home)


def test_a_refused_push_exits_3_and_an_unknown_peer_is_named(dc):
    """`push B --on HOME` where B lets A only read: the report's pushed row names the refusal and the
    command exits 3 (REPLICATION_REFUSED) naming the direction; a name that is not one of HOME's peers
    is refused before any session, listing those it knows."""
    from click.testing import CliRunner

    from multisite.cli.main import cli

    b = dc.server("B", ["P"], start=False)
    with docdb.open(b.path("P")) as p:
        p.set_access("A", "reader")
    dc.start(b)
    a = dc.server("A", ["P"], replica_of=b, start=False)
    a.options["start"] = {"peers": {"B": b.address}}
    dc.start(a)
    _create(dc, a, {"x": 1})
    res = CliRunner().invoke(cli, ["push", "B", "--on", str(a.home)])
    assert res.exit_code == 3, res.output
    assert "REPLICATION_REFUSED: push to B refused for P (push: ACCESS_DENIED" in res.output
    assert [ln for ln in res.output.splitlines() if "pushed" in ln and "ACCESS_DENIED" in ln]
    res = CliRunner().invoke(cli, ["pull", "B", "--on", str(a.home)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["push", "C", "--on", str(a.home)])
    assert res.exit_code == 1 and f"'C' is not a known peer of the document server of {a.home}" in res.output
    assert f"B ({b.address})" in res.output and "expected HOST:PORT" not in res.output


def test_a_document_server_that_goes_away_mid_request_is_called_a_document_server(tmp_path):
    """A control connection cut during `replicate` (the server died) names the document server."""
    import socket
    import threading

    from multisite.multimaster.server.process import call
    from multisite.net.control import control_address

    home = tmp_path / "home"
    home.mkdir()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(control_address(home.absolute()))
    srv.listen(1)

    def die_mid_request() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.close()
    t = threading.Thread(target=die_mid_request)
    t.start()
    try:
        with pytest.raises(ServerError, match="the document server of .* closed the control connection during "
                                              "'replicate'") as e:
            call(home, "replicate", server="B", mode="push-only")
        assert "instance server" not in str(e.value)
    finally:
        t.join(timeout=10)
        srv.close()
