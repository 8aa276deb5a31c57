"""JournalBytes: the bytes of a link's backlog from the cumulative bytes of commit batches (what
/metrics reports as multisite_source_backlog_bytes, in O(log n) per link)."""

from __future__ import annotations

from multisite.server.metrics import JournalBytes


def test_bytes_between_seqnos_exact_at_batches_interpolated_inside():
    jb = JournalBytes(10)
    jb.on_commit(11, [b"x" * 100])
    jb.on_commit(12, [b"x" * 10, b"x" * 30])  # seqnos 12, 13
    jb.on_commit(14, [b"x" * 5])
    assert jb.between(10, 14) == 145
    assert jb.between(11, 14) == 45
    assert jb.between(13, 14) == 5
    assert jb.between(12, 13) == 20  # inside the batch 12..13: its 40 bytes split evenly
    assert jb.between(14, 14) == 0 and jb.between(15, 14) == 0


def test_older_than_what_is_kept_is_estimated_at_the_mean_frame():
    jb = JournalBytes(100)
    jb.on_commit(101, [b"x" * 50, b"x" * 50])
    assert jb.between(90, 102) == 100 + 10 * 50


def test_a_gap_in_seqnos_starts_over():
    jb = JournalBytes(0)
    jb.on_commit(1, [b"x" * 10])
    jb.reset(0)  # a rollback to 0
    jb.on_commit(1, [b"x" * 7])
    assert jb.between(0, 1) == 7
    jb.on_commit(5, [b"x" * 3])  # not 2: a discontinuity
    assert jb.between(4, 5) == 3


def test_trimming_keeps_the_recent_batches_exact():
    jb = JournalBytes(0)
    jb.MAX_BATCHES = 4
    for s in range(1, 11):  # ten batches of one 10-byte frame: trimmed past 8
        jb.on_commit(s, [b"x" * 10])
    ends, _cum = jb._arrays
    assert len(ends) <= 9 and ends[-1] == 10
    assert jb.between(7, 10) == 30
    assert jb.between(0, 10) == 100  # the trimmed part at the mean frame size: still 10 bytes each
