"""Prune (``instance.maintenance.prune``) keeps what someone still needs: the records an interrupted
rollback undoes from, and the segments a pipeline consumer has not consumed."""

from __future__ import annotations

import json

import multisite
from multisite.instance import consumers
from multisite.instance.layout import Layout
from multisite.instance.maintenance import prune
from multisite.testing.checks import filled_instance


def test_prune_keeps_what_an_interrupted_rollback_needs(tmp_path):
    # A rollback to seqno 10 was under way (its marker written) when the process died; the next open
    # finishes it from the before-images of records 11.. . Prune ignored the marker and removed
    # those segments: the instance then could not open ("cannot roll A back to seqno 10: the journal
    # starts at 79 (older segments were pruned)").
    root = filled_instance(tmp_path / "A", 100)
    Layout.existing(root).rollback_marker.write_text(json.dumps({"to_seqno": 10, "lost_file": str(root / "lost" / "x.utl")}))
    rep = prune(root, 90)
    assert rep.limit_seqno == 11 and "rollback" in rep.reason
    with multisite.open(root) as db:
        assert db.seqno == 10
        assert db.get("acct", ("k", 9)) == {"i": 9, "pad": "x" * 100} and db.get("acct", ("k", 10)) is None
    assert "rollback" not in prune(root, 90).reason  # finished: no longer held


def segmented(path):
    """An instance of 400 transactions in segments of 4 KiB."""
    root = multisite.create(path, name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(400):
            db.set("r", ("k", i), "x" * 50)
    return root


def test_prune_keeps_segments_a_consumer_has_not_consumed(tmp_path):
    root = segmented(tmp_path / "A")
    lay = Layout.existing(root)
    consumers.record(lay, "stream1", 10)
    rep = prune(root, before=400)
    assert rep.limit_seqno == 11 and "stream1" in rep.reason
    assert rep.kept_from_seqno <= 11
    consumers.record(lay, "stream1", 300)
    rep = prune(root, before=400)
    assert 11 < rep.kept_from_seqno <= 301
    assert consumers.forget(lay, "stream1")
    assert consumers.load_all(lay) == []


def test_prune_refuses_when_an_archive_mark_is_unreadable(tmp_path):
    # An archive mark (instance/archives/*.json) that cannot be read was skipped: with it the only
    # mark, prune saw "no archive recorded", required no archiving and removed segments no archive held.
    from multisite.errors import ConfigError
    from multisite.instance import archives

    root = segmented(tmp_path / "A")
    lay = Layout.existing(root)
    archives.record(lay, "/mnt/archive/A", 10)
    mark = next(archives.archives_dir(lay).glob("*.json"))
    mark.write_text('{"url": "/mnt/archive/A", "last_archi')  # damaged (a disk error, a hand edit)
    before = sorted(p.name for p in lay.journal.glob("*.msj"))
    try:
        rep = prune(root, before=400)
    except ConfigError as e:
        assert str(mark) in str(e)
    else:
        raise AssertionError(f"prune removed {rep.removed} past an unreadable archive mark")
    assert sorted(p.name for p in lay.journal.glob("*.msj")) == before
