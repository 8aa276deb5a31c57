"""A received stream's seqno as of a journal position: what a supplementary instance may confirm.

A received transaction moves its stream's seqno (in memory, under the commit lock) before its
journal write and fdatasync, and a Receiver Server's answer reads that seqno without the lock: it
must count only what the journal has hardened, as a BC secondary's answer counts only its hardened
seqno. So every write of received transactions marks each stream it moves, before moving it:
``(the journal position where the write moves it, the stream's seqno before)``. As of a hardened
position ``hard``, the stream is at the seqno before the first mark past ``hard`` or, with no mark
past it, at its seqno now.

Pure functions over those marks; the engine keeps them (``Core.mark_stream``) and replaces a
stream's whole tuple at each mark, so a reader without the lock sees one or the other. A reader
takes the stream's seqno first, then its marks, then the hardened position: a seqno it read was
marked before it moved, and a mark leaves only once the journal hardened past it.

The marks stay few: a mark the journal hardened leaves at the next one, and one at a position
written again (a write undone, a rollback) is replaced. A stream moved otherwise (``set_stream_seqno``,
a rollback) is on disk before that call returns, and is read as it is now.
"""

from __future__ import annotations

StreamMarks = tuple[tuple[int, int], ...]  # (journal position, the stream's seqno before it), ascending


def marked(marks: StreamMarks, at: int, before: int, *, hard: int) -> StreamMarks:
    """``marks`` and a write from journal position ``at`` moving the stream from seqno ``before``;
    without the marks the journal hardened (at or below ``hard``) or that a write at or past ``at``
    replaces (it was undone)."""
    return tuple(m for m in marks if hard < m[0] < at) + ((at, before),)


def seqno_as_of(marks: StreamMarks, current: int, *, hard: int) -> int:
    """The stream's seqno as of journal position ``hard``, given its seqno now (``current``).
    Never above ``current``: after a rollback the stream is back below its old marks."""
    for at, before in marks:
        if at > hard:
            return min(before, current)
    return current
