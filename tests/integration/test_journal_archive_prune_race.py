"""``journal prune`` while ``journal archive --follow`` runs: prune removes segments the archive already
holds. The archiver must take a segment gone from the front of the journal for pruned, not for a
rollback (it stopped, telling the operator to archive the instance to a new URL). The prune runs right
after the archiver lists the segments, deterministically."""

from __future__ import annotations

import multisite.pipeline.archive as arch
from multisite.instance.maintenance import prune
from multisite.pipeline.archive import archive

from .test_journal_archive import journaled, sealed


def test_segments_pruned_after_the_archiver_listed_them_are_not_taken_for_a_rollback(tmp_path, monkeypatch):
    a = journaled(tmp_path / "A", 120)
    dest = tmp_path / "arch"
    first = archive(str(a), str(dest))
    journaled(a, 120, start=121)
    real = arch.list_segments
    calls = []

    def list_then_prune(journal_dir):
        infos = real(journal_dir)
        if not calls:
            calls.append(prune(a, first.last_archived + 1))  # what the archive holds may go
        return infos

    monkeypatch.setattr(arch, "list_segments", list_then_prune)
    rep = archive(str(a), str(dest))
    assert calls and calls[0].removed
    assert rep.segments_copied == [s.path.name for s in sealed(a)[0]]
    assert rep.first_archived == 1 and rep.last_archived == sealed(a)[1][-1].first_seqno - 1


def test_a_read_with_the_archive_is_not_refused_for_a_rollback_when_prune_ran_meanwhile(tmp_path, monkeypatch):
    # The same race on the reading side: an export --follow --archive compares the archive's last segment
    # with the instance's copy; pruned between the listing and the comparison, it read as rolled back.
    import multisite.pipeline.plan as plan

    a = journaled(tmp_path / "A", 120)
    dest = tmp_path / "arch"
    first = archive(str(a), str(dest))
    journaled(a, 120, start=121)
    ref = plan.combine_refs([plan.instance_ref(str(dest)), plan.instance_ref(str(a))])[0]
    real = plan.list_segments
    calls = []

    def list_then_prune(journal_dir):
        infos = real(journal_dir)
        if not calls:
            calls.append(prune(a, first.last_archived + 1))
        return infos

    monkeypatch.setattr(plan, "list_segments", list_then_prune)
    assert plan.ref_bounds(ref) == (1, 240)
    assert calls and calls[0].removed


def test_an_archive_run_with_nothing_new_records_a_mark_that_was_dropped(tmp_path):
    # The mark was written only when a segment was copied: after `journal archive --drop URL` (or an
    # unreadable mark removed) a run found nothing new and left none, so prune required nothing and could
    # remove a segment sealed next before the archiver copied it.
    from multisite.instance import archives
    from multisite.instance.layout import Layout

    a = journaled(tmp_path / "A", 120)
    dest = tmp_path / "arch"
    first = archive(str(a), str(dest))
    lay = Layout.existing(a)
    assert archives.forget(lay, str(dest))
    again = archive(str(a), str(dest))
    assert again.segments_copied == []
    assert [(m.url, m.last_archived) for m in archives.load_all(lay)] == [(str(dest), first.last_archived)]
