"""Sidecars (columnar copies of journal frames kept by the pipeline): validity keys, and every writer
that cuts or removes segments drops the sidecars that no longer match."""

from __future__ import annotations

import mmap
import os

import multisite
from multisite.instance.layout import Layout
from multisite.instance.maintenance import prune
from multisite.journal.records import parse_header
from multisite.journal.segments import SEGMENT_HEADER_SIZE, SegmentView, list_segments
from multisite.journal.sidecars import Sidecar, index_dir, list_sidecars


def _fill(root, n, size=60):
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(n):
            db.set("r", ("k", i), "x" * size)


def _sidecar_for(info, lo_seqno, hi_seqno) -> Sidecar:
    """The key of a sidecar covering frames lo..hi of a segment, made as the pipeline makes it."""
    with SegmentView(info) as view:
        frames = [(off, h) for off, h in view.headers(tail=True) if lo_seqno <= h.seqno <= hi_seqno]
        import zlib

        hcrc = zlib.crc32(view.buf[:SEGMENT_HEADER_SIZE])
    (start, first), (last_off, last) = frames[0], frames[-1]
    return Sidecar(info.index, start, last_off, first.seqno, last.seqno, hcrc, last.payload_crc)


def _touch(journal, sc: Sidecar):
    index_dir(journal).mkdir(exist_ok=True)
    (index_dir(journal) / sc.name).write_bytes(b"PAR1")
    return index_dir(journal) / sc.name


def _matches(info, sc):
    with open(info.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return sc.matches(buf, size)
        finally:
            buf.close()


def test_name_round_trip_and_unknown_files_are_ignored(tmp_path):
    sc = Sidecar(3, 64, 9000, 101, 180, 0xDEADBEEF, 0x1234)
    assert Sidecar.parse(sc.name) == sc
    assert Sidecar.parse("notes.txt") is None and Sidecar.parse(sc.name + ".tmp") is None


def test_matches_until_the_frames_change(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    _fill(root, 30)
    info = list_segments(Layout.existing(root).journal)[-1]
    sc = _sidecar_for(info, 5, 20)
    end = _matches(info, sc)
    with SegmentView(info) as view:
        nxt = [off for off, h in view.headers(tail=True) if h.seqno == 21][0]
        assert end == nxt and parse_header(view.buf, nxt).seqno == 21
    other = Sidecar(sc.segment, sc.start, sc.last_offset, sc.first, sc.last, sc.header_crc, sc.last_crc ^ 1)
    assert _matches(info, other) is None
    with open(info.path, "r+b") as f:  # cut inside the covered frames
        f.truncate(sc.last_offset + 10)
    assert _matches(info, sc) is None


def test_rollback_drops_the_sidecars_past_its_target(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    _fill(root, 200)
    journal = Layout.existing(root).journal
    infos = list_segments(journal)
    assert len(infos) > 3
    kept = _touch(journal, _sidecar_for(infos[0], infos[0].first_seqno, infos[1].first_seqno - 1))
    cut = infos[1].first_seqno + 2  # inside the second segment
    mid = _touch(journal, _sidecar_for(infos[1], infos[1].first_seqno, infos[2].first_seqno - 1))
    late = _touch(journal, _sidecar_for(infos[2], infos[2].first_seqno, infos[3].first_seqno - 1))
    with multisite.open(root) as db:
        db.rollback(cut)
    assert kept.exists() and not mid.exists() and not late.exists()


def test_prune_drops_the_sidecars_of_removed_segments(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    _fill(root, 200)
    journal = Layout.existing(root).journal
    infos = list_segments(journal)
    for i in range(3):
        _touch(journal, _sidecar_for(infos[i], infos[i].first_seqno, infos[i + 1].first_seqno - 1))
    rep = prune(root, before=infos[2].first_seqno)
    assert rep.removed
    left = {s.segment for s, _ in list_sidecars(journal)}
    assert left == {infos[2].index}
