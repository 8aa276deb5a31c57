"""Where a rollback must go: from a common point in the source's seqno space to a local seqno.

In BC replication seqnos are shared, so the local target is the common point itself. A
supplementary instance receiving an SI stream keeps its own seqnos: it must roll back to just before
its first transaction that came from the stream with a ``stream_seqno`` beyond the common point
(database update serialization then takes every later local transaction off too, as the seed's
{101,1,18}, {102,0,11} example shows).
"""

from __future__ import annotations

from ..journal.records import decode_payload
from ..journal.segments import SegmentView, list_segments


def local_target_for_stream(db, stream: int, common_stream_seqno: int) -> int:
    """The local seqno to roll back to so that no record of ``stream`` beyond ``common_stream_seqno``
    remains. Walks segments from the newest back, and stops at the first stream record at or below
    the common point."""
    target = db.seqno
    for info in reversed(list_segments(db.layout.journal)):
        recs = []
        with SegmentView(info) as view:
            for off, hdr in view.frames(tail=True):
                rec = decode_payload(view.payload(off, hdr))
                recs.append((rec.seqno, rec.stream, rec.stream_seqno))
        for seqno, st, sseq in reversed(recs):
            if st != stream:
                continue
            if sseq > common_stream_seqno:
                target = seqno - 1
            else:
                return target
    return target
