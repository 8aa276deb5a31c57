"""A rollback that cuts into a segment the journal archiver already copied: the archived copy holds
transactions the instance took off, so the archiver must refuse to go on (not keep the old copy as if
it were the rewritten segment), and ``journal prune`` must not count the rolled-back seqnos as archived."""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import ArchiveError
from multisite.instance import archives
from multisite.instance.layout import Layout
from multisite.instance.maintenance import prune
from multisite.journal.segments import list_segments
from multisite.pipeline.archive import archive

from .test_journal_archive import journaled, sealed


def _archived_then_rolled_back_into(tmp_path):
    a = journaled(tmp_path / "A", 200)
    segs, _ = sealed(a)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    cut = segs[-1].first_seqno + 2  # inside the newest archived segment
    with multisite.open(a) as db:
        db.rollback(cut)
    return a, dest, segs[-1], cut


def test_archiver_refuses_a_sealed_segment_cut_by_a_rollback_and_rewritten(tmp_path):
    a, dest, seg, _ = _archived_then_rolled_back_into(tmp_path)
    journaled(a, 200, start=1000)  # rewrites the cut segment (same name, same header) and seals it
    assert seg.path.name in [s.path.name for s in sealed(a)[0]]
    with pytest.raises(ArchiveError, match="rolled back"):
        archive(str(a), str(dest))



def test_prune_after_a_rollback_into_archived_seqnos_keeps_the_rewritten_segment(tmp_path):
    a, dest, seg, cut = _archived_then_rolled_back_into(tmp_path)
    assert archives.load_all(Layout.existing(a))[0].last_archived <= cut
    journaled(a, 200, start=1000)
    prune(a, 10**6)
    assert seg.path.name in [s.path.name for s in list_segments(Layout.existing(a).journal)]

