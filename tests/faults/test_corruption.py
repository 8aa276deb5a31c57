"""Corruption: a torn tail is cut at every byte offset; damage anywhere else is JournalCorrupt.

The instances here are small and closed, then damaged on disk with plain file operations. The
store is put back to an older copy where a test needs recovery to roll forward (as after a crash,
when the store lags the journal), so that every check also covers replay.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import multisite
from multisite import JournalCorrupt, JournalError
from multisite.journal.reader import iter_records
from multisite.journal.segments import SEGMENT_HEADER_SIZE, SegmentView, list_segments


def _frames(seg: Path) -> list[tuple[int, int, int]]:
    """(offset, end, seqno) of every frame in a segment."""
    (info,) = [i for i in list_segments(seg.parent) if i.path == seg]
    with SegmentView(info) as view:
        return [(off, off + hdr.total, hdr.seqno) for off, hdr in view.frames(tail=True)]


def _state(db) -> dict:
    return {r: list(db.items(r)) for r in sorted(db.regions())}


def _commit(db, i: int) -> None:
    with db.transaction() as tx:  # several updates, so a partial record would show
        tx.set("acct", ("a", i), {"i": i, "pad": "x" * (i % 7)})
        tx.set("acct", ("b", i), i)
        if i % 3 == 0:
            tx.kill("acct", ("a", i - 1))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """An instance of 20 transactions, with copies of its store at seqno 0 and at seqno 19."""
    base = tmp_path_factory.mktemp("history")
    root = multisite.create(base / "A", name="A", durability="none")
    shutil.copytree(root / "db", base / "store-empty")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(1, 20):
            _commit(db, i)
        before_last = _state(db)
    shutil.copytree(root / "db", base / "store-19")
    with multisite.open(root) as db:
        with db.transaction() as tx:
            tx.set("acct", ("last", 1), "one")
            tx.set("acct", ("last", 2), {"two": [2, 2]})
            tx.kill("acct", ("b",))
        after_last = _state(db)
    return {"root": root, "base": base, "before_last": before_last, "after_last": after_last}


def _copy(history, dest: Path, store: str) -> Path:
    shutil.copytree(history["root"], dest)
    shutil.rmtree(dest / "db")
    shutil.copytree(history["base"] / store, dest / "db")
    return dest


@pytest.mark.parametrize("store", ["store-19", "store-empty"])
def test_truncating_the_last_record_at_every_offset_cuts_the_torn_tail(history, tmp_path, store):
    """Every offset with the store one transaction behind; with an empty store (all 19 replayed), every
    offset of the header and a sample of the payload. Some cuts also check that the journal goes on."""
    seg = sorted((history["root"] / "journal").glob("*.msj"))[-1]
    start, end, seqno = _frames(seg)[-1]
    assert seqno == 20 and end == seg.stat().st_size
    cuts = list(range(start, end))
    if store == "store-empty":
        cuts = [c for c in cuts if c < start + 24 or c % 5 == 0 or c == end - 1]
    for n, cut in enumerate(cuts):
        go_on = n % 8 == 0 or cut >= end - 2
        root = _copy(history, tmp_path / f"cut{cut}", store)
        tail = root / "journal" / seg.name
        os.truncate(tail, cut)
        with multisite.open(root) as db:
            assert db.seqno == 19, cut
            assert db.recovery.torn_bytes == cut - start, cut  # 0: the record was removed exactly
            assert _state(db) == history["before_last"], cut
            assert tail.stat().st_size == start  # the torn bytes are gone from the file
            if cut > start:
                assert any("torn" in note for note in db.recovery.notes)
            if go_on:
                db.set("acct", ("after",), cut)  # the journal takes new records after the cut
        if go_on:
            with multisite.open(root) as db:
                assert db.seqno == 20 and db.get("acct", ("after",)) == cut
                assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 21))
        shutil.rmtree(root)


def test_the_untouched_copy_opens_with_every_transaction(history, tmp_path):
    for store in ("store-19", "store-empty"):
        root = _copy(history, tmp_path / store, store)
        with multisite.open(root) as db:
            assert db.seqno == 20 and _state(db) == history["after_last"]
            assert db.recovery.replayed == (1 if store == "store-19" else 20)


def _positions(start: int, end: int) -> list[int]:
    """Every header byte, and payload bytes at the start, middle and end."""
    head = list(range(start, start + 20))
    return head + sorted({start + 20, (start + 20 + end) // 2, end - 1})


def test_bit_flips_in_earlier_records_raise_journal_corrupt_naming_file_and_offset(history, tmp_path):
    root = _copy(history, tmp_path / "A", "store-19")
    seg = sorted((root / "journal").glob("*.msj"))[-1]
    frames = _frames(seg)
    original = seg.read_bytes()
    checked = 0
    for start, end, seqno in frames[:-1]:
        for pos in _positions(start, end):
            for bit in (0, 5):
                data = bytearray(original)
                data[pos] ^= 1 << bit
                seg.write_bytes(data)
                with pytest.raises(JournalCorrupt) as ei:
                    multisite.open(root).close()
                assert (ei.value.path, ei.value.offset) == (str(seg), start), (seqno, pos, bit)
                assert seg.name in str(ei.value) and str(start) in str(ei.value)
                assert seg.read_bytes() == bytes(data), "recovery must not 'repair' a corrupt journal"
                checked += 1
    seg.write_bytes(original)
    with multisite.open(root) as db:
        assert db.seqno == 20 and _state(db) == history["after_last"]
    assert checked == sum(len(_positions(s, e)) * 2 for s, e, _ in frames[:-1])


def test_a_damaged_segment_header_raises(history, tmp_path):
    root = _copy(history, tmp_path / "A", "store-19")
    seg = sorted((root / "journal").glob("*.msj"))[-1]
    original = seg.read_bytes()
    for pos in range(0, 48):  # magic, fields and the header checksum (the rest is padding)
        data = bytearray(original)
        data[pos] ^= 0x10
        seg.write_bytes(data)
        with pytest.raises(JournalCorrupt) as ei:
            multisite.open(root).close()
        assert (ei.value.path, ei.value.offset) == (str(seg), 0)
    seg.write_bytes(original[:SEGMENT_HEADER_SIZE - 30])
    with pytest.raises(JournalCorrupt):
        multisite.open(root).close()


@pytest.fixture
def sealed(tmp_path):
    """An instance whose journal spans several segments, closed, with a copy of its empty store."""
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    shutil.copytree(root / "db", tmp_path / "store-empty")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(1, 200):
            _commit(db, i)
        state, last = _state(db), db.seqno
    segs = sorted((root / "journal").glob("*.msj"))
    assert len(segs) >= 4
    return root, segs, state, last, tmp_path / "store-empty"


@pytest.mark.parametrize("where", ["header", "payload"])
def test_a_damaged_sealed_segment_is_found_when_reading(sealed, where):
    root, segs, state, last, _ = sealed
    seg = segs[1]
    start, end, seqno = _frames(seg)[3]
    data = bytearray(seg.read_bytes())
    data[start + 9 if where == "header" else end - 2] ^= 0x04
    seg.write_bytes(data)
    with multisite.open(root) as db:  # the store holds everything: open needs no replay
        assert db.seqno == last and _state(db) == state
    with pytest.raises(JournalCorrupt) as ei:
        list(iter_records(root / "journal"))
    assert (ei.value.path, ei.value.offset) == (str(seg), start)
    assert "sealed" in str(ei.value)
    nxt = _frames(segs[2])[0][2]  # reading from the next segment on does not pass the damage
    assert [r.seqno for r in iter_records(root / "journal", nxt)] == list(range(nxt, last + 1))


def test_a_damaged_sealed_segment_stops_replay(sealed):
    root, segs, state, last, empty = sealed
    shutil.rmtree(root / "db")
    shutil.copytree(empty, root / "db")  # the store must be rolled forward across the damage
    seg = segs[1]
    start, end, seqno = _frames(seg)[0]
    data = bytearray(seg.read_bytes())
    data[end - 1] ^= 0x80
    seg.write_bytes(data)
    with pytest.raises(JournalCorrupt) as ei:
        multisite.open(root).close()
    assert (ei.value.path, ei.value.offset) == (str(seg), start)


def test_a_sealed_segment_cut_at_a_frame_boundary_is_a_gap_not_silence(sealed):
    root, segs, state, last, empty = sealed
    seg = segs[1]
    frames = _frames(seg)
    os.truncate(seg, frames[-2][0])  # its last record is gone, cleanly
    with pytest.raises(JournalCorrupt) as ei:
        list(iter_records(root / "journal"))
    assert (ei.value.path, ei.value.offset) == (str(seg), frames[-2][0])
    shutil.rmtree(root / "db")
    shutil.copytree(empty, root / "db")
    with pytest.raises(JournalError):
        multisite.open(root).close()


def test_a_missing_middle_segment_is_detected(sealed):
    root, segs, state, last, _ = sealed
    segs[2].unlink()
    with pytest.raises(JournalCorrupt) as ei:
        multisite.open(root).close()
    assert ei.value.path == str(segs[3])


def test_a_store_ahead_of_its_journal_is_refused(sealed):
    root, segs, state, last, _ = sealed
    seg = segs[-1]
    start, _, seqno = _frames(seg)[-1]
    os.truncate(seg, start)  # a journal that lost a record the store already holds
    with pytest.raises(JournalError, match="journal files are missing"):
        multisite.open(root).close()


def test_a_checked_tail_reads_the_same_frames_and_still_checks_seqnos(history, tmp_path):
    """Replay after recovery skips the CRCs recovery has just verified, but not lengths or seqnos."""
    root = _copy(history, tmp_path / "A", "store-empty")
    (info,) = list_segments(root / "journal")
    with SegmentView(info) as view:
        full = [(off, hdr.seqno, hdr.length) for off, hdr in view.frames(tail=True)]
        quick = [(off, hdr.seqno, hdr.length) for off, hdr in view.frames(tail=True, checked=True)]
    assert quick == full and len(full) == 20
    off = full[5][0]
    with open(info.path, "r+b") as f:  # seqno 6 rewritten as 60; its header CRC no longer matches
        f.seek(off + 4)
        f.write((60).to_bytes(8, "little"))
    with SegmentView(info) as view, pytest.raises(JournalCorrupt) as e:
        list(view.frames(tail=True, checked=True))
    assert str(info.path) in str(e.value) and e.value.offset == off
