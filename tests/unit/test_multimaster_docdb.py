"""The document database on the engine: the API, versions and revisions, the change feed and
bookmarks, durability across reopen, and bad input (malformed documents, corrupt revisions)."""

from __future__ import annotations

import pytest

import multisite
import multisite.documents as documents
from multisite.errors import (ConfigError, DocumentDeleted, DocumentNotFound, MalformedDocument, NotADocumentDatabase,
                              ReplicaMismatch, RevisionsCorrupt)
from multisite.multimaster.document import Doc
from multisite.multimaster.session import run_local


@pytest.fixture
def pair(tmp_path):
    a = documents.create(tmp_path / "a", "T", durability="none")
    b = documents.create(tmp_path / "b", "T", replica_id=a.replica_id, durability="none")
    yield a, b
    a.close()
    b.close()


def test_create_update_delete_give_oids_revisions_and_field_sequence_numbers(tmp_path):
    with documents.create(tmp_path / "a", "T") as db:
        u = db.create("Person", {"name": "Ada", "age": 36})
        d1 = db.get(u)
        assert (d1.seq, d1.revisions, d1.field_seqs) == (1, (), {"name": 1, "age": 1})
        d2 = db.update(u, {"age": 37})
        assert d2.seq == 2 and d2.revisions == ((d1.time_us, db.db_id),) and d2.field_seqs == {"name": 1, "age": 2}
        assert d2.time_us > d1.time_us and len(d2.oid) == 28 and d2.oid[:16] == bytes.fromhex(u)
        stub = db.delete(u)
        assert stub.deleted and stub.seq == 3 and stub.fields == {}
        assert db.get(u) is None and db.get(u, include_deleted=True) == stub
        with pytest.raises(DocumentDeleted):
            db.update(u, {"age": 1})
        with pytest.raises(DocumentNotFound):
            db.update("ab" * 16, {"x": 1})
        with pytest.raises(MalformedDocument, match="UNID"):
            db.get("nope")


def test_documents_survive_reopen_through_the_journal(tmp_path):
    with documents.create(tmp_path / "a", "T") as db:
        u = db.create("F", {"x": 1})
        db.update(u, {"x": 2})
        rid, dbid = db.replica_id, db.db_id
    with documents.open(tmp_path / "a") as db:
        assert (db.replica_id, db.db_id, db.get(u).fields, db.changeno) == (rid, dbid, {"x": 2}, 2)
    with multisite.open(tmp_path / "a") as inst:  # an ordinary instance: journal, seqnos, regions
        assert {"docs", "changes", "meta", "history"} <= set(inst.regions()) and inst.seqno > 2


def test_changes_since_a_bookmark_list_each_document_once_at_its_latest_change(tmp_path):
    with documents.create(tmp_path / "a", "T", durability="none") as db:
        us = db.create_many([("F", {"i": i}) for i in range(5)])
        _, mark = db.changes(0)
        db.update(us[0], {"i": 10})
        db.update(us[0], {"i": 11})
        ch, last = db.changes(mark)
        assert [u for u, _ in ch] == [us[0]] and ch[0][1].seq == 3 and last == db.changeno
        for i in range(3):  # one write, one change block each
            db.create("F", {"j": i})
        page, last2 = db.changes(db.changeno - 3, limit=2)
        assert len(page) == 2 and last2 == db.changeno - 1  # a page ends with a block
        assert db.changes(last2) == ([(u, s) for u, s in db.changes(db.changeno - 1)[0]], db.changeno)
        assert db.changes(db.changeno) == ([], db.changeno)


def test_a_malformed_or_corrupt_document_from_a_peer_is_refused_and_nothing_is_applied(pair):
    a, b = pair
    u = a.create("F", {"x": 1})
    good = a.get(u).to_value()
    bad_revisions = list(a.update(u, {"x": 2}).to_value())
    bad_revisions[6] = []  # seq 2 with no $Revisions entry
    with pytest.raises(RevisionsCorrupt, match=r"\$Revisions holds 0 entries"):
        Doc.from_value(bad_revisions)
    junk = list(good)
    junk[2] = "not a map"
    with pytest.raises(MalformedDocument, match="fields"):
        Doc.from_value(junk)
    with pytest.raises(MalformedDocument):
        Doc.from_value({"unid": u})
    from multisite.multimaster.session import Responder
    from multisite.multimaster.wire import Hello, Push, Refused
    r = Responder("B", {b.replica_id: b})
    r.handle(Hello(1, "A"))
    before = b.changeno
    out = r.handle(Push(b.replica_id, a.db_id, [good, bad_revisions], 99))
    assert isinstance(out, Refused) and out.code == "REVISIONS_CORRUPT"
    assert b.changeno == before and b.get(u) is None and b.bookmark(f"{a.db_id}@A", "in") == 0


def test_wrong_replica_ids_are_refused(pair, tmp_path):
    a, _ = pair
    with documents.create(tmp_path / "other", "T", durability="none") as other:
        with pytest.raises(ReplicaMismatch, match="replica IDs differ"):
            run_local(a, other, "pull-push")
        from multisite.multimaster.session import Responder
        from multisite.multimaster.wire import Changes, Hello, Refused
        r = Responder("X", {other.replica_id: other})
        r.handle(Hello(1, "A"))
        out = r.handle(Changes(a.replica_id, 0, 10))
        assert isinstance(out, Refused) and out.code == "REPLICA_MISMATCH"


def test_a_reader_may_pull_but_its_push_is_refused_and_logged(pair):
    a, b = pair
    b.set_access("local-a", "reader")
    a.create("F", {"x": 1})
    b.create("F", {"y": 1})
    rep = run_local(a, b, "pull-push")
    d = rep.dbs[0]
    assert d.pulled["new"] == 1 and any("ACCESS_DENIED" in x for x in d.refused)
    b.set_access("local-a", "none")
    assert run_local(a, b, "pull-push").dbs == []


def test_bad_configuration_is_named(tmp_path):
    with pytest.raises(ConfigError, match="title"):
        documents.create(tmp_path / "x", " ")
    with pytest.raises(ConfigError, match="replica ID"):
        documents.create(tmp_path / "y", "T", replica_id="xyz")
    multisite.create(tmp_path / "plain2", "p")  # an instance, but not a document database
    with pytest.raises(NotADocumentDatabase):
        documents.open(tmp_path / "plain2")
    with pytest.raises(NotADocumentDatabase):
        documents.open(tmp_path / "nothing")
    with documents.create(tmp_path / "z", "T", durability="none") as db:
        with pytest.raises(ConfigError, match="access"):
            db.set_access("B", "admin")
        with pytest.raises(MalformedDocument):
            db.create("", {})


def test_a_backup_of_a_document_database_opens_as_the_same_replica(tmp_path):
    from multisite.instance.maintenance import backup
    with documents.create(tmp_path / "a", "T", durability="none") as db:
        u = db.create("F", {"x": 1})
        ident = (db.replica_id, db.db_id)
        backup(tmp_path / "a", tmp_path / "copy")
    with documents.open(tmp_path / "copy") as copy:
        assert (copy.replica_id, copy.db_id) == ident and copy.get(u).fields == {"x": 1}
    assert documents.read_identity(tmp_path / "copy")["replica_id"] == ident[0]


def test_batch_reads_give_the_same_documents_by_range_or_one_by_one(tmp_path):
    with documents.create(tmp_path / "a", "T", durability="none") as db:
        us = db.create_many([("F", {"i": i}) for i in range(300)])
        close = us[100:140]  # a dense key range: one range read
        far = [us[0], us[299], "ff" * 16]  # 300 documents between them: read one by one; one missing
        for batch in (close, far):
            got = db.current_many(batch)
            assert list(got) == batch
            assert all(got[u] == (db.get(u) if u != "ff" * 16 else None) for u in batch)
            assert db.stored_many(batch) == [db.get(u).to_value() for u in batch if u != "ff" * 16]


def test_a_server_cannot_move_the_bookmarks_of_another_servers_replica(pair):
    from multisite.multimaster.session import Responder
    from multisite.multimaster.wire import Bookmarks, GetBookmarks, Hello, PullDone
    a, b = pair
    b.create_many([("F", {"i": i}) for i in range(5)])
    r = Responder("B", {b.replica_id: b})
    r.handle(Hello(1, "X"))  # X claims to have pulled everything into A's replica
    r.handle(PullDone(b.replica_id, a.db_id, b.changeno))
    honest = Responder("B", {b.replica_id: b})
    honest.handle(Hello(1, "A"))
    assert honest.handle(GetBookmarks(b.replica_id, a.db_id)) == Bookmarks(b.db_id, 0, 0)
    assert run_local(a, b, "pull-only", server_a="A", server_b="B").totals()["new"] == 5


def test_small_pages_chunks_and_batches_move_everything_once(pair, monkeypatch):
    from multisite.multimaster import session
    monkeypatch.setattr(session, "CHANGES_PAGE_ENTRIES", 3)
    monkeypatch.setattr(session, "FETCH_BATCH_DOCS", 2)
    monkeypatch.setattr(session, "PUSH_LIST_ENTRIES", 7)
    a, b = pair
    us = [a.create("F", {"i": i}) for i in range(20)]  # one change block each
    for u in us[::3]:
        a.update(u, {"i": -1})  # stale entries in older blocks
    t = run_local(a, b, "push-only").totals()
    assert t["new"] == 20
    assert [d.to_value() for d in b.documents()] == [d.to_value() for d in a.documents()]
    assert run_local(a, b, "push-only").totals()["new"] == 0
    for u in us[1::3]:
        b.update(u, {"i": -2})
    t = run_local(a, b, "pull-only").totals()
    assert t["updated"] == len(us[1::3])
    assert [d.to_value() for d in b.documents()] == [d.to_value() for d in a.documents()]


def test_a_replica_restored_from_a_backup_has_its_new_writes_replicated(tmp_path):
    """Its change numbers go back to the backup's, below the peer's record of what it pulled: the
    session starts from the point both sides agree on, so the new writes are not skipped."""
    import shutil

    from multisite.instance.maintenance import backup
    a = documents.create(tmp_path / "a", "T", durability="none")
    b = documents.create(tmp_path / "b", "T", replica_id=a.replica_id, durability="none")
    for i in range(3):
        a.create("F", {"x": i})
    run_local(a, b, "pull-push")
    a.close()
    backup(tmp_path / "a", tmp_path / "a-backup")
    a = documents.open(tmp_path / "a")
    for i in range(3):
        a.create("F", {"y": i})
    run_local(a, b, "pull-push")  # b's record of a's changes moves past the backup's
    a.close()
    shutil.rmtree(tmp_path / "a")
    shutil.copytree(tmp_path / "a-backup", tmp_path / "a")
    a = documents.open(tmp_path / "a")
    new = [a.create("F", {"z": i}) for i in range(3)]  # change numbers the backup had not used yet
    run_local(b, a, "pull-only", server_a="local-b", server_b="local-a")
    assert all(b.get(u) is not None for u in new)
    a.close()
    b.close()


def test_merge_conflicts_follows_the_forms_setting_here_as_an_edit_does(pair):
    """``db form F --merge`` after the document was made: the merge is an edit made here, so it takes
    the form's setting here (as ``update`` does), not the flag the document was created with."""
    a, b = pair
    u = a.create("F", {"x": 0, "y": 0})
    run_local(a, b, "pull-push")
    a.update(u, {"x": 1})
    b.update(u, {"y": 1})
    run_local(a, b, "pull-push")
    assert a.merge_conflicts(u) is None  # the form does not merge here
    a.define_form("F", merge=True)
    m = a.merge_conflicts(u)
    assert m is not None and m.fields == {"x": 1, "y": 1} and m.merge
    assert not [d for d in a.documents(include_deleted=True) if d.is_conflict]
    with pytest.raises(DocumentNotFound):
        a.merge_conflicts("00" * 16)


def test_merge_conflicts_of_a_deleted_document_is_refused_as_an_update_is(pair):
    a, _ = pair
    u = a.create("F", {"x": 0})
    a.delete(u)
    with pytest.raises(DocumentDeleted):  # not a silent null from 'doc merge'
        a.merge_conflicts(u)
