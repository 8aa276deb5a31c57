"""Documents of a served database, edited through its running document server (issue 29): the ``doc``
and ``db`` commands find the server from DIR (its ``run/served_by.json``) or ``--on HOME``, and
``multisite.documents.connect`` is a client with DocDB's methods. Real docserver processes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import multisite.documents as documents
from multisite.cli.main import cli
from multisite.errors import (ConfigError, DocumentDeleted, DocumentNotFound, InstanceLocked, MalformedDocument,
                              ServerError)
from multisite.multimaster.server import docdb, docdb_files
from multisite.testing.docservers import DocCluster


@pytest.fixture
def dc(tmp_path):
    c = DocCluster(tmp_path, durability="none")
    yield c
    c.stop_all()


def _cli(*args: str) -> str:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_the_doc_commands_edit_a_served_database_through_its_server_and_the_edit_replicates(dc):
    a = dc.server("A", ["P"])
    b = dc.server("B", ["P"], replica_of=a)
    pa = a.path("P")
    assert docdb_files.served_by(pa) == {"home": str(a.home.absolute()), "name": "A", "pid": a.pid}
    with pytest.raises(InstanceLocked, match=r"held open by the document server A .*documents\.connect"):
        documents.open(pa)  # what a user met before, now with the way through

    unid = _cli("doc", "create", pa, "Person", '{"name": "Ada"}').strip()
    updated = json.loads(_cli("doc", "update", pa, unid, '{"age": 37}'))
    assert updated["seq"] == 2 and updated["fields"] == {"name": "Ada", "age": 37}
    assert [d["unid"] for d in json.loads(_cli("doc", "list", pa, "--json"))] == [unid]
    assert json.loads(_cli("doc", "get", pa, unid, "--on", a.home))["fields"]["age"] == 37
    _cli("db", "form", pa, "Person", "--merge")
    assert json.loads(_cli("db", "info", pa, "--json"))["forms"] == {"Person": {"merge": True}}

    _cli("replicate", b.address, "P", "--on", a.home)
    on_b = documents.connect(b.path("P"))
    got = on_b.get(unid)
    assert got.fields == {"name": "Ada", "age": 37} and got.seq == 2 and got.origin == updated["origin"]

    dc.stop(a)  # a server that stops clears its record: DIR is opened here again
    assert docdb_files.served_by(pa) is None
    assert json.loads(_cli("doc", "get", pa, unid))["seq"] == 2


def test_connect_creates_reads_updates_and_deletes_and_errors_keep_their_class(dc):
    a = dc.server("A", ["P", "Q"])
    with pytest.raises(ConfigError, match=r"serves 2 databases \(P, Q\): name one"):
        documents.connect(a.home)
    db = documents.connect(a.home, db="P")
    assert (db.title, db.path, db.server) == ("P", a.path("P"), "A")
    assert documents.connect(a.path("P")).replica_id == db.replica_id  # found from the directory too

    unid = db.create("Person", {"name": "Ada", "tags": ["x", "y"]})
    doc = db.get(unid)
    assert isinstance(doc, documents.Doc) and doc.fields == {"name": "Ada", "tags": ["x", "y"]} and doc.seq == 1
    v2 = db.update(unid, {"city": "London"})
    assert v2.seq == 2 and v2.fields["city"] == "London" and v2.revisions == ((doc.time_us, doc.origin),)
    u2, u3 = db.create_many([("Note", {"t": 1}), ("Person", {"name": "Grace"})])
    assert [d.unid for d in db.documents()] == sorted([unid, u2, u3]) and db.count() == 3
    stub = db.delete(u2)
    assert stub.deleted and db.get(u2) is None and db.get(u2, include_deleted=True).deleted
    assert len(list(db.documents())) == 2 and len(list(db.documents(include_deleted=True))) == 3
    db.set_access("B", "reader")
    assert db.acl()["B"] == "reader" and db.info()["documents"] == 3 and db.changeno == 5

    with pytest.raises(DocumentNotFound, match="no document"):
        db.update("0" * 32, {"x": 1})
    with pytest.raises(DocumentDeleted):
        db.update(u2, {"t": 2})
    with pytest.raises(MalformedDocument):
        db.create("", {"x": 1})
    with pytest.raises(ConfigError, match="serves no database 'R'"):
        documents.connect(a.home, db="R")
    with db:  # a context manager, as DocDB is
        assert db.get(unid).fields["name"] == "Ada"


def test_without_a_running_server_the_error_says_what_to_do(dc, tmp_path):
    never = docdb.create(tmp_path / "never", "N", durability="none")
    never.close()
    with pytest.raises(ServerError, match=r"no document server serves .*never.*documents\.open"):
        documents.connect(tmp_path / "never")
    (tmp_path / "home").mkdir()
    with pytest.raises(ServerError, match=r"no document server is running for .*home; start one"):
        documents.connect(tmp_path / "home")

    a = dc.server("A", ["P"])
    pa = a.path("P")
    res = CliRunner().invoke(cli, ["doc", "list", str(tmp_path / "never"), "--on", str(a.home)])
    assert res.exit_code == 1 and "serves no database" in res.output

    dc.kill(a)  # a killed server leaves its record behind
    assert docdb_files.served_by(pa) is not None
    with pytest.raises(ServerError, match=r"the document server A of .*A \(recorded in .*served_by\.json\) is not "
                                          r"running: it was killed"):
        documents.connect(pa)
    unid = _cli("doc", "create", pa, "F", '{"n": 1}').strip()  # nobody holds DIR: the command opens it here
    with documents.open(pa) as d:
        assert d.get(unid).fields == {"n": 1}
