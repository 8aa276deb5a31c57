"""Reading a journal that changes under the reader: directory listings that miss or race segments,
segments missing or misnamed, frames still being written while a reader looks at them, and an
instance whose segments were all removed. Each race is a clean read; each real loss is JournalCorrupt."""

from __future__ import annotations

import os
import pathlib

import pytest

import multisite
from multisite.errors import JournalCorrupt
from multisite.journal.reader import iter_records
from multisite.journal.records import FRAME_HEADER_SIZE, Record, Update, encode_record, parse_header
from multisite.journal.segments import SegmentView, list_segments
from multisite.testing.checks import filled_instance


@pytest.fixture
def chain(tmp_path):
    root = filled_instance(tmp_path / "A", 120)
    infos = list_segments(root / "journal")
    assert len(infos) >= 4
    return root, infos


def _listing_misses(monkeypatch, missing: set[str], times: int = 1):
    """Directory listings of the journal that miss ``missing`` (a listing racing segment creation:
    a large directory is read in several getdents calls, and entries created meanwhile can be
    missed while later ones are seen)."""
    real = pathlib.Path.glob
    left = [times]

    def glob(self, pattern, *a, **kw):
        out = list(real(self, pattern, *a, **kw))
        if self.name == "journal" and left[0] > 0:
            left[0] -= 1
            out = [p for p in out if p.name not in missing]
        return iter(out)

    monkeypatch.setattr(pathlib.Path, "glob", glob)


@pytest.mark.parametrize("which", ["middle", "oldest"])
def test_a_listing_that_missed_a_live_segment_still_gives_the_whole_chain(chain, monkeypatch, which):
    root, infos = chain
    miss = infos[1] if which == "middle" else infos[0]
    _listing_misses(monkeypatch, {miss.path.name})
    got = list_segments(root / "journal")
    assert [i.path for i in got] == [i.path for i in infos]


def test_a_segment_really_missing_is_still_corruption(chain):
    root, infos = chain
    os.unlink(infos[1].path)
    with pytest.raises(JournalCorrupt, match=infos[2].path.name):
        list_segments(root / "journal")


def test_a_segment_file_named_for_another_index_is_corruption(chain):
    root, infos = chain
    os.rename(infos[-1].path, infos[-1].path.with_name(f"{infos[-1].index + 5:08d}.msj"))
    with pytest.raises(JournalCorrupt, match="holds the header of segment"):
        list_segments(root / "journal")


def test_a_segment_pruned_during_the_listing_starts_it_again(chain, monkeypatch):
    root, infos = chain
    real = pathlib.Path.glob
    calls = [0]

    def glob(self, pattern, *a, **kw):
        out = list(real(self, pattern, *a, **kw))
        calls[0] += 1
        if calls[0] == 1:  # listed, then removed before its header is read (a prune beside us)
            os.unlink(infos[0].path)
        return iter(out)

    monkeypatch.setattr(pathlib.Path, "glob", glob)
    got = list_segments(root / "journal")
    assert [i.path for i in got] == [i.path for i in infos[1:]]


# -- a live owner writing while a reader walks the newest segment ---------------------------------

def _rec(seqno: int, pad: int = 300) -> bytes:
    return encode_record(Record(seqno, 0, seqno, "A", 0.0, [Update(1, "acct", ("k", seqno), b"\xa1x" * pad)]))


class _Settling(bytearray):
    """A buffer whose bytes at [lo, hi) are completed with ``final`` the first time a slice is taken:
    a page of a live segment that the writer finishes copying in between two reads of it."""

    def __init__(self, data: bytes, lo: int, final: bytes):
        super().__init__(data)
        self.lo, self.final, self.done = lo, final, False

    def __getitem__(self, i):
        if isinstance(i, slice) and not self.done:
            self.done = True
            self[self.lo : self.lo + len(self.final)] = self.final
        return super().__getitem__(i)


def test_a_header_is_checked_on_the_bytes_it_was_read_from():
    # The writer had copied the frame's length and checksums but not yet its seqno when the header
    # was unpacked; the checksum, taken from a second read, matched the finished header and vouched
    # for seqno 0: a reader of a live journal then raised "seqno 0 where N was expected".
    fr = _rec(7)
    torn = bytearray(fr[:FRAME_HEADER_SIZE])
    torn[4:12] = bytes(8)  # seqno not there yet
    buf = _Settling(bytes(torn) + bytes(64), 0, fr[:FRAME_HEADER_SIZE])
    hdr = parse_header(buf, 0)
    assert hdr is None or hdr.seqno == 7


@pytest.fixture
def live_tail(tmp_path):
    """An open instance's newest segment (preallocated zeros after its records) and two frames that
    come next, not written yet."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(5):
            db.set("acct", ("k", i), i)
        info = list_segments(root / "journal")[-1]
        end = 64
        with SegmentView(info) as view:
            for off, hdr in view.frames(tail=True):
                end = off + hdr.total
        nxt = _rec(db.seqno + 1) + _rec(db.seqno + 2)
        yield root, info, end, nxt, db.seqno


def test_a_frame_written_while_the_reader_looked_at_it_is_not_corruption(live_tail, monkeypatch):
    # The reader finds zeros where the next frame goes; by the time it has checked that only zeros
    # follow, the writer has written that frame and the next one. It used to raise JournalCorrupt
    # ("frame header is damaged") on a healthy journal: a source server or `journal show` beside a
    # busy owner failed now and then. The frame is read again before it is called corruption.
    root, info, end, nxt, last = live_tail
    real = SegmentView.zeros_from
    wrote = []

    def zeros_from(self, off):
        if not wrote and off == end:
            wrote.append(True)
            with open(info.path, "r+b") as f:  # the owner's write, through the page cache the map shows
                f.seek(end)
                f.write(nxt)
        return real(self, off)

    monkeypatch.setattr(SegmentView, "zeros_from", zeros_from)
    seqnos = [s for s, _ in iter_frames_of(root)]
    assert wrote and seqnos == list(range(1, last + 3))


def test_a_frame_damaged_for_good_before_an_intact_one_is_still_corruption(live_tail):
    root, info, end, nxt, last = live_tail
    bad = bytearray(nxt)
    bad[FRAME_HEADER_SIZE + 10] ^= 0xFF  # the first new frame's payload, damaged for good
    with open(info.path, "r+b") as f:
        f.seek(end)
        f.write(bad)
    with pytest.raises(JournalCorrupt, match=f"offset {end}"):
        list(iter_frames_of(root))


def iter_frames_of(root):
    from multisite.journal.reader import iter_frames

    return iter_frames(root / "journal", 1)


def test_an_instance_whose_segments_were_all_removed_is_refused_and_left_alone(chain):
    # Opening used to create a new empty segment 1 (first seqno 1) before refusing (the store was
    # further on): restoring the real segments (the oldest pruned long ago) then gave a journal whose
    # first segment claimed seqnos it never held, and every read from it failed.
    root, infos = chain
    saved = {i.path: i.path.read_bytes() for i in infos}
    for p in saved:
        p.unlink()
    with pytest.raises(JournalCorrupt, match="no segment files"):
        multisite.open(root)
    assert list((root / "journal").glob("*.msj")) == []
    for p, data in list(saved.items())[1:]:  # restored, as pruned before the loss
        p.write_bytes(data)
    with multisite.open(root) as db:
        assert db.seqno == 120
    assert [r.seqno for r in iter_records(root / "journal", infos[1].first_seqno)][-1] == 120
