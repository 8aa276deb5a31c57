"""Grouping journal chunks into Spark partitions (pure planning: no Spark session)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from multisite.pipeline.decode import Chunk  # noqa: E402
from multisite.pipeline.plan import CHUNK_BYTES, group_chunks  # noqa: E402

MB = 1024 * 1024


def _piece(i: int, rows: int, nbytes: int = 32 * MB) -> Chunk:
    return Chunk("A", f"/j/{i}.msj", 64, i * 1000 + 1, i * 1000 + 1000, segment=i, piece=f"/j/index/{i}.parquet",
                 piece_first=i * 1000 + 1, piece_last=i * 1000 + 1000, nbytes=nbytes, rows=rows)


def _frames(i: int, nbytes: int) -> Chunk:
    return Chunk("A", f"/j/{i}.msj", 64, i * 1000 + 1, i * 1000 + 1000, segment=i, nbytes=nbytes)


def test_indexed_chunks_are_balanced_by_rows_not_bytes():
    # Same bytes, different rows (early transactions are smaller): bytes would split 6/6 unevenly.
    cs = [_piece(i, 580_000 if i < 3 else 400_000) for i in range(12)]
    groups = group_chunks(cs, 10**12, 2)
    loads = sorted(sum(c.rows for c in g) for g in groups)
    assert len(groups) == 2 and loads[1] - loads[0] <= 180_000
    assert sorted(c.segment for g in groups for c in g) == list(range(12))
    for g in groups:  # journal order inside a partition
        assert [c.segment for c in g] == sorted(c.segment for c in g)


def test_a_small_tail_to_decode_joins_a_group_and_big_ones_stand_alone():
    cs = [_piece(i, 450_000) for i in range(5)] + [_frames(5, CHUNK_BYTES), _frames(6, 6 * MB)]
    groups = group_chunks(cs, 10**12, 2)
    assert [c.segment for c in groups[0]] == [5]  # a full chunk to decode: a partition of its own
    rest = groups[1:]
    assert len(rest) == 2 and sorted(c.segment for g in rest for c in g) == [0, 1, 2, 3, 4, 6]
    tail_group = next(g for g in rest if any(not c.piece for c in g))
    other = next(g for g in rest if g is not tail_group)
    assert (len(tail_group), len(other)) == (3, 3)  # two pieces and the tail against three pieces


def test_partition_bytes_caps_a_group_and_a_small_chunk_size_keeps_many_partitions():
    cs = [_piece(i, 400_000) for i in range(8)]
    assert len(group_chunks(cs, 64 * MB, 2)) == 4
    small = [_frames(i, 3000) for i in range(20)]
    assert len(group_chunks(small, 10**12, 2, chunk_bytes=3000)) == 20


def test_a_segment_pruned_after_planning_is_a_journal_gap_not_a_missing_file(tmp_path):
    """A read planned before a prune, run after it: the task says the seqnos are gone and to read
    again, through the error hierarchy, for chunks to decode and for chunks read from the index."""
    import os

    import multisite
    from multisite.journal.sidecars import Sidecar
    from multisite.pipeline.decode import JournalBatchBuilder, read_chunk
    from multisite.pipeline.plan import chunks, instance_ref
    from multisite.pipeline.segment_index import check_piece, journal_schema

    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=16 * 1024)
    with multisite.open(root) as db:
        db.create_region("log")
        for i in range(300):
            db.set("log", (i,), "x" * 100)
    first = chunks(instance_ref(str(root)), 1, None, index="off")[0]
    os.unlink(first.path)
    gone = f"seqnos {first.first_seqno}..{first.last_seqno} are no longer in the journal"
    with pytest.raises(multisite.JournalGap, match=gone):
        list(read_chunk(first, JournalBatchBuilder("A", journal_schema(["seqno"], {}))))
    piece = f"{first.segment:08d}-{first.offset}-{first.offset + first.nbytes}-{first.first_seqno}-{first.last_seqno}" \
            f"-{0:016x}.parquet"
    assert Sidecar.parse(piece) is not None
    with pytest.raises(multisite.JournalGap, match=gone):
        check_piece(str(root / "journal" / "index" / piece), first.path)


def test_the_tail_walker_walks_on_from_where_it_stopped_and_starts_over_after_a_rollback(tmp_path):
    import multisite
    from multisite.pipeline.plan import TailWalker, frame_crc, journal_bounds

    root = multisite.create(tmp_path / "A", name="A", durability="none")
    w = TailWalker(str(root))
    with multisite.open(root) as db:
        db.create_region("log")
        assert w.bounds() == journal_bounds(str(root)) == (1, 0)
        for i in range(1, 21):
            db.set("log", (i,), f"old-{i}")
        assert w.bounds() == (1, 20) and w.crc(20) == frame_crc(str(root), 20) is not None
        old20, old15 = w.crc(20), frame_crc(str(root), 15)
        for i in range(21, 31):
            db.set("log", (i,), i)
        start = w.mark.offset
        assert w.bounds() == (1, 30) and w.mark.offset > start  # walked on, from frame 20
        db.rollback(15)
        assert w.bounds() == (1, 15) and w.crc(15) == old15  # the remembered frame 30 is gone
        for i in range(16, 26):
            db.set("log", (i,), f"new-{i}")
        assert w.bounds() == journal_bounds(str(root)) == (1, 25)
        assert w.crc(20) == frame_crc(str(root), 20) != old20  # another transaction at seqno 20


def test_a_stream_batch_planned_from_the_walkers_last_frame_is_the_same_as_from_the_segments_start(tmp_path):
    """Each batch starts after the previous one's end: the walker knows where that frame is, so
    planning walks from there (not from the segment's start) and gives the same chunks, across
    segment changes; a hint that does not name frame ``lo`` is ignored, and so is one after a rollback."""
    import multisite
    from multisite.pipeline.plan import TailWalker, chunks, instance_ref

    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=16 * 1024)
    w = TailWalker(str(root))
    hinted = 0
    with multisite.open(root) as db:
        db.create_region("log")
        ref = instance_ref(str(root))
        end = w.bounds()[1]
        for step in range(12):
            for i in range(23):
                db.set("log", (step, i), "x" * 100)
            lo, hi = end + 1, w.bounds()[1]
            at = w.start_after(lo - 1)
            hinted += at is not None
            plain = chunks(ref, lo, hi, strict_start=True, index="auto")
            assert chunks(ref, lo, hi, strict_start=True, index="auto", start_at=at) == plain
            end = hi
        assert hinted >= 10  # only the very first batch (nothing walked yet) plans without one
        lo = end + 1
        for i in range(5):
            db.set("log", ("z", i), "y")
        hi = w.bounds()[1]
        seg, off, seq = w.start_after(lo - 1)
        plain = chunks(ref, lo, hi, strict_start=True, index="auto")
        for bad in ((seg, off + 1, seq), (seg, off, seq + 1), (seg + 7, off, seq)):
            assert chunks(ref, lo, hi, strict_start=True, index="auto", start_at=bad) == plain
        db.rollback(lo - 3)
        db.set("log", ("after",), "rollback")
        assert w.start_after(lo - 1) is None  # the remembered frame is gone
