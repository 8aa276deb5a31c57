"""A rollback on the instance while the archiver copies a segment it cuts: the archiver read the old
bytes, so its mark must not end above the rollback's target, or ``journal prune`` removes records
written again that no archive holds. (The rollback runs from the archiver's progress callback: after
the segment was read, before it is put and recorded, deterministically.)"""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import ArchiveError
from multisite.instance import archives
from multisite.instance.layout import Layout
from multisite.pipeline.archive import archive

from .test_journal_archive import journaled, sealed


def test_a_rollback_during_the_copy_of_the_segment_it_cuts_leaves_no_mark_past_its_target(tmp_path):
    a = journaled(tmp_path / "A", 120)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    done = len(sealed(a)[0])
    journaled(a, 120, start=121)
    target = sealed(a)[0][done].first_seqno + 2  # inside the first segment the next run copies
    rolled = []

    def rollback_once(_msg):
        if not rolled:
            with multisite.open(a) as db:
                rolled.append(db.rollback(target))

    with pytest.raises(ArchiveError, match="rolled back"):
        archive(str(a), str(dest), progress=rollback_once)
    assert rolled
    assert max(m.last_archived for m in archives.load_all(Layout.existing(a))) <= target
