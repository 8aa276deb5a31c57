"""``journal prune`` removing a segment an archive run has listed but not yet read: the first segment
of a new archive (no mark yet, so prune is free to remove it), or a segment whose index pieces the run
is about to copy. Either is "pruned meanwhile", as in test_journal_archive_prune_race.py, not a
FileNotFoundError traceback. The prune runs right after the archiver lists the segments."""

from __future__ import annotations

import sys

import multisite.pipeline.archive as arch
from multisite.instance.maintenance import prune
from multisite.pipeline.archive import archive, check
from multisite.pipeline.journal_frames import index_journal

from .test_journal_archive import journaled, sealed


def test_a_first_segment_pruned_before_it_was_read_starts_the_archive_later(tmp_path, monkeypatch):
    a = journaled(tmp_path / "A", 200)
    segs, infos = sealed(a)
    real = arch.list_segments
    calls = []

    def list_then_prune(journal_dir):
        listed = real(journal_dir)
        if not calls:
            calls.append(prune(a, segs[1].first_seqno, require_archived=False))
        return listed

    monkeypatch.setattr(arch, "list_segments", list_then_prune)
    dest = tmp_path / "arch"
    rep = archive(str(a), str(dest))
    assert calls[0].removed == [segs[0].path.name]
    assert rep.segments_copied == [s.path.name for s in segs[1:]]
    assert rep.first_archived == segs[1].first_seqno and rep.last_archived == infos[-1].first_seqno - 1
    assert check(str(dest)).damaged == []


def test_a_segment_pruned_before_its_index_pieces_were_read_is_skipped(tmp_path, monkeypatch):
    a = journaled(tmp_path / "A", 200)
    index_journal(str(a), jobs=1)
    segs, infos = sealed(a)
    real = arch.list_segments
    calls = []

    def list_then_prune(journal_dir):
        listed = real(journal_dir)
        if not calls and sys._getframe(1).f_code.co_name == "_archive_pieces":
            calls.append(prune(a, segs[1].first_seqno, require_archived=False))
        return listed

    monkeypatch.setattr(arch, "list_segments", list_then_prune)
    dest = tmp_path / "arch"
    rep = archive(str(a), str(dest))
    assert calls and calls[0].removed == [segs[0].path.name]
    assert rep.segments_copied == [s.path.name for s in segs] and rep.pieces_copied > 0
    assert rep.last_archived == infos[-1].first_seqno - 1 and check(str(dest)).damaged == []
