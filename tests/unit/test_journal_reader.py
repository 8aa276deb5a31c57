"""Reading the journal as runs of frames (what a Source Server sends when it reads journal files)."""

from __future__ import annotations

import multisite
from multisite.journal.reader import iter_frames, iter_runs
from multisite.journal.segments import list_segments


def test_runs_hold_every_frame_once_in_order_and_never_span_a_segment(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=8192)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(400):
            db.set("r", (i,), {"i": i, "pad": "p" * (i % 50)})
    journal = root / "journal"
    assert len(list_segments(journal)) >= 5
    firsts = {s.first_seqno for s in list_segments(journal)}
    frames = list(iter_frames(journal, 37, whole=True))
    for max_bytes in (1, 700, 1 << 20):
        runs = list(iter_runs(journal, 37, max_bytes))
        assert [(s, fr) for r in runs for s, fr in r.frames()] == frames
        assert [r.first_seqno for r in runs] == [37] + [r.last_seqno + 1 for r in runs[:-1]]
        for r in runs:  # a run ends at its segment's end, or at the first frame that reaches max_bytes
            assert not any(r.first_seqno < f <= r.last_seqno for f in firsts)
            assert len(r) == 1 or r.ends[-2] < max_bytes
    assert list(iter_runs(journal, 401, 1000)) == []
    bounded = list(iter_runs(journal, 37, 1 << 20, to_seqno=300))
    assert [(s, fr) for r in bounded for s, fr in r.frames()] == [f for f in frames if f[0] <= 300]
