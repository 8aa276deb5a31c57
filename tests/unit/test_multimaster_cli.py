"""The document commands through click's runner: create replicas, write, replicate on one machine
(the same-machine form), read back as tables and JSON, and bad input refused with one clear line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from multisite.cli.main import cli


def run(*args: object, ok: bool = True):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, res.output
    return res


def test_replicas_made_and_replicated_from_the_command_line(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run("db", "create", a, "--title", "Profiles", "--durability", "none")
    run("db", "create", b, "--title", "Profiles", "--replica-of", a, "--durability", "none")
    ia = json.loads(run("db", "info", a, "--json").output)
    ib = json.loads(run("db", "info", b, "--json").output)
    assert ia["replica_id"] == ib["replica_id"] and ia["db_id"] != ib["db_id"]
    run("db", "form", a, "Person", "--merge")
    unid = run("doc", "create", a, "Person", '{"name": "Ada"}').output.strip()
    assert len(unid) == 32
    upd = json.loads(run("doc", "update", a, unid, '{"city": "Boston"}').output)
    assert upd["seq"] == 2 and len(upd["revisions"]) == 1 and len(upd["oid"]) == 56
    rep = json.loads(run("db", "replicate", b, a, "--mode", "pull-only", "--json").output)
    assert rep["totals"]["new"] == 1 and rep["mode"] == "pull-only"
    again = run("db", "replicate", b, a).output
    assert "0 new" in again and "pull-push" in again
    docs = json.loads(run("doc", "list", b, "--json").output)
    assert [d["fields"] for d in docs] == [{"name": "Ada", "city": "Boston"}]
    run("doc", "delete", a, unid)
    run("db", "replicate", a, b, "--mode", "push-only")
    assert json.loads(run("doc", "get", b, unid).output)["deleted"] is True
    assert "Ada" not in run("doc", "list", b).output
    run("db", "acl", b, "local-x", "reader")
    assert json.loads(run("db", "info", b, "--json").output)["acl"]["local-x"] == "reader"


def test_bad_input_is_one_line_naming_what_is_wrong(tmp_path):
    run("db", "create", tmp_path / "a", "--title", "T", "--durability", "none")
    run("db", "create", tmp_path / "o", "--title", "T", "--durability", "none")  # another replica ID
    res = run("db", "replicate", tmp_path / "a", tmp_path / "o", ok=False)
    assert res.exit_code == 1 and "REPLICA_MISMATCH" in res.output and "replica IDs differ" in res.output
    res = run("doc", "create", tmp_path / "a", "F", "[1, 2]", ok=False)
    assert "FIELDS must be a JSON object" in res.output
    res = run("doc", "update", tmp_path / "a", "nope", "{}", ok=False)
    assert "DOCUMENT_MALFORMED" in res.output and "UNID" in res.output
    res = run("db", "create", tmp_path / "c", "--title", "T", "--replica-of", "xyz", ok=False)
    assert "CONFIG" in res.output and "replica ID" in res.output
    (tmp_path / "plain").mkdir()
    res = run("db", "info", tmp_path / "plain", ok=False)
    assert "NOT_A_DOCUMENT_DATABASE" in res.output


def test_doc_get_shows_each_revision_with_its_origin(tmp_path):
    a = tmp_path / "a"
    run("db", "create", a, "--title", "P", "--durability", "none")
    unid = run("doc", "create", a, "F", '{"n": 1}').output.strip()
    first = json.loads(run("doc", "get", a, unid).output)
    run("doc", "update", a, unid, '{"n": 2}')
    run("doc", "update", a, unid, '{"n": 3}')
    got = json.loads(run("doc", "get", a, unid).output)
    assert got["seq"] == 3 and [r["seq"] for r in got["revisions"]] == [1, 2]
    assert got["revisions"][0] == {"seq": 1, "time_us": first["seq_time_us"], "origin": first["origin"]}
    assert all(r["origin"] == got["origin"] for r in got["revisions"])  # every version made here


def test_a_refused_direction_exits_3_naming_it(tmp_path):
    """`b` lets `a` read only: a's push is refused (ACCESS_DENIED) and said so, in the pushed row and on
    stderr, with exit status 3; a's pull exits 0; b pulling from a reader of its own is refused too."""
    a, b = tmp_path / "a", tmp_path / "b"
    run("db", "create", a, "--title", "P", "--durability", "none")
    run("db", "create", b, "--title", "P", "--replica-of", a, "--durability", "none")
    run("doc", "create", a, "F", '{"n": 1}')
    run("db", "acl", b, "a", "reader")
    res = run("db", "replicate", a, b, "--mode", "push-only", ok=False)
    assert res.exit_code == 3, res.output
    assert "REPLICATION_REFUSED: push to b refused for P (push: ACCESS_DENIED" in res.output
    pushed = [ln for ln in res.output.splitlines() if "pushed" in ln and "│" in ln]
    pulled = [ln for ln in res.output.splitlines() if "pulled" in ln and "│" in ln]
    assert "ACCESS_DENIED" in pushed[0] and "ACCESS_DENIED" not in pulled[0]
    res = run("db", "replicate", a, b, "--mode", "push-only", "--json", ok=False)
    rep = json.loads(res.stdout)
    assert res.exit_code == 3 and rep["refused_ways"] == ["push"] and list(rep["dbs"][0]["refused_ways"]) == ["push"]
    assert json.loads(run("db", "replicate", a, b, "--mode", "pull-only", "--json").output)["refused_ways"] == []
    res = run("db", "replicate", b, a, "--mode", "pull-only", ok=False)  # b's own ACL: it takes nothing from a reader
    assert res.exit_code == 3 and "pull from a refused for P (a is a reader of P here" in res.output


def test_doc_merge_merges_a_conflict_on_fields_apart_and_the_merge_replicates(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run("db", "create", a, "--title", "P", "--durability", "none")
    run("db", "create", b, "--title", "P", "--replica-of", a, "--durability", "none")
    run("db", "form", a, "Person", "--merge")
    unid = run("doc", "create", a, "Person", '{"name": "Ada", "city": "Boston", "phone": "1"}').output.strip()
    run("db", "replicate", a, b)
    run("doc", "update", a, unid, '{"phone": "2"}')
    run("doc", "update", b, unid, '{"city": "Cambridge"}')
    rep = json.loads(run("db", "replicate", a, b, "--json").output)
    assert rep["totals"]["conflicts"] == 1 and rep["totals"]["merged"] == 0  # a session never merges
    merged = json.loads(run("doc", "merge", a, unid).output)
    assert merged["fields"] == {"name": "Ada", "city": "Cambridge", "phone": "2"}
    assert not any(d["conflict"] for d in json.loads(run("doc", "list", a, "--json").output))
    run("db", "replicate", a, b)
    on_b = json.loads(run("doc", "list", b, "--json").output)
    assert [d["fields"] for d in on_b] == [merged["fields"]]  # the conflict document went on B too
    assert json.loads(run("doc", "merge", a, unid).output) is None  # nothing left to merge
