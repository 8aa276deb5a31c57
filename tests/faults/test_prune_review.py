"""Prune beside a rollback that a crash interrupted: the records it undoes from must stay."""

from __future__ import annotations

import json

import multisite
from multisite.testing.checks import filled_instance
from multisite.instance.maintenance import prune
from multisite.instance.layout import Layout


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

