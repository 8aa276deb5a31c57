"""An archive read together with its instance's directory, after the instance rolled back past the
archive's end: the archive holds transactions the instance took off (and lacks those written again),
so the combined read must be refused, not give the rolled-back transactions as the journal."""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import ArchiveError
from multisite.pipeline.archive import archive
from multisite.pipeline.plan import chunks, combine_refs, instance_ref, ref_bounds, ref_crcs

from .test_journal_archive import journaled, sealed


@pytest.mark.parametrize("rewrite", [False, True], ids=["rolled-back", "rolled-back-and-rewritten"])
def test_archive_with_the_instance_tail_is_refused_after_a_rollback_past_its_end(tmp_path, rewrite):
    a = journaled(tmp_path / "A", 200)
    dest = tmp_path / "arch"
    rep = archive(str(a), str(dest))
    with multisite.open(a) as db:
        db.rollback(sealed(a)[0][-1].first_seqno + 2)  # inside the newest archived segment
    if rewrite:
        journaled(a, 200, start=1000)  # the instance holds the archive's last seqno again, another record
    ref = combine_refs([instance_ref(str(dest)), instance_ref(str(a))])[0]
    assert ref.archive and ref.path
    for read in (lambda: ref_bounds(ref), lambda: ref_crcs(ref, 1, rep.last_archived),
                 lambda: chunks(ref, 1, None)):
        with pytest.raises(ArchiveError, match="rolled back past"):
            read()
