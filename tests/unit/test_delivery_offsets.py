"""Log offsets (journal.offsets): every committed transaction has one, they only grow across segment
switches and restarts, and reading from any transaction's offset gives exactly the later ones."""

from __future__ import annotations

import pytest

import multisite.engine as engine
from multisite.errors import JournalCorrupt
from multisite.journal.offsets import end_offset, format_offset, iter_commits, split_offset, start_offset


def test_offsets_grow_across_segment_switches_and_restarts(tmp_path):
    root = engine.create(tmp_path / "A", "A", durability="none", segment_bytes=4096)
    db = engine.open(root)
    db.create_region("r")
    s0 = start_offset(db.layout.journal)
    for i in range(150):
        db.set("r", (i,), {"v": "x" * 40})
    db.close()
    db = engine.open(root, segment_bytes=4096)
    for i in range(150, 200):
        db.set("r", (i,), {"v": "x" * 40})
    got = list(iter_commits(db.layout.journal, s0))
    offsets = [o for o, _, _ in got]
    assert [s for _, s, _ in got] == list(range(1, 201))
    assert offsets == sorted(set(offsets))
    assert len({split_offset(o)[0] for o in offsets}) > 3  # several segments
    assert end_offset(db.layout.journal) == offsets[-1]
    for k in (0, 17, 99, 150, 199):  # from any transaction's offset: exactly the later ones
        assert [s for _, s, _ in iter_commits(db.layout.journal, offsets[k])] == list(range(k + 2, 201))
    assert len(format_offset(s0)) >= 10
    db.close()


def test_an_offset_inside_a_sealed_frame_is_refused(tmp_path):
    root = engine.create(tmp_path / "A", "A", durability="none", segment_bytes=4096)
    db = engine.open(root)
    db.create_region("r")
    for i in range(100):
        db.set("r", (i,), {"v": "x" * 40})
    first = next(iter_commits(db.layout.journal, start_offset(db.layout.journal)))[0]
    with pytest.raises(JournalCorrupt, match="does not start a frame"):
        list(iter_commits(db.layout.journal, first - 3))
    db.close()
