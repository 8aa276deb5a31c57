"""Applying transactions received from upstream (the Update Process), in order, exactly once.

BC (``apply_frames``): the secondary keeps the primary's frames. Each frame arrives checked (its
CRCs and seqno, by the protocol), is decoded once to apply its updates to the store, and the very
same bytes are journaled: the originating seqno, stream tag, before-images and CRCs are the
primary's, end to end, and a secondary's journal is byte-identical to its primary's. The store
is written as recovery writes it (sets in bulk, a kill or zkill after the sets before it): the
before-images are already in the record.

SI (``apply_records``): a supplementary instance gives each received transaction its own next
seqno and tags it with the stream number and the originating seqno as ``stream_seqno``, so it
frames a record of its own, with before-images read from its own store.

Either way a transaction already applied is skipped, so a replay after any restart applies exactly
once, and one that would leave a gap is refused (JournalGap) with nothing applied. Each received
stream (1..15) a write moves is marked first (``Core.mark_stream``), so that what a supplementary
instance confirms on it is never past its hardened journal (``streams``).
"""

from __future__ import annotations

from ..errors import JournalGap, TransactionError
from ..journal.records import FRAME_HEADER_SIZE, KILL, SET, ZKILL, FrameRun, Record, record_decoder
from ..keys import encode_key
from .commit import prepare
from .core import Core


def apply_frames(core: Core, runs: list[FrameRun]) -> int:
    """BC: apply and journal received frames with one journal write (and, in ``fsync`` or
    ``group`` mode, one fdatasync); returns the instance's seqno."""
    with core.lock:
        core.check_open()
        with core.atomic():
            chunks = _apply_runs(core, runs)
            if chunks:
                data = chunks[0][1] if len(chunks) == 1 else b"".join(c for _, c, _ in chunks)
                core.journal.append(data, core.seqno)
                for first, _, run in chunks:
                    if core.commit_listeners:
                        frames = [fr for seqno, fr in run.frames() if seqno >= first]
                        for listener in core.commit_listeners:
                            listener(first, frames)
        return core.received(bool(chunks))


def _apply_runs(core: Core, runs: list[FrameRun]) -> list[tuple[int, bytes, FrameRun]]:
    """Apply the frames after the instance's seqno to the store; what to journal, per run:
    ``(first seqno applied, its bytes, the run)``. (The hot loop of catch-up: one decode per
    record, sets gathered for one bulk write, a region looked up when it changes.)"""
    decode = record_decoder.decode
    st = core.store
    regions = st.regions
    streams = core.stream_seqnos
    track_streams = core.info.supplementary
    puts: list[tuple[int, bytes, bytes]] = []
    add = puts.append
    last_in: dict[str, int] = {}  # region -> last seqno that touched it (replicated regions)
    moved: set[int] = set()  # received streams (1..15) this write moves
    name, rid, replicated = None, 0, False
    out = []
    for run in runs:
        skip = _frames_applied(core, run)
        if skip is None:
            continue  # applied before a restart: exactly once
        data, ends = run.data, run.ends
        start = ends[skip - 1] if skip else 0
        seqno = run.first_seqno + skip
        view = memoryview(data)
        for i in range(skip, len(ends)):
            end = ends[i]
            rec = decode(view[start + FRAME_HEADER_SIZE:end])
            if rec.seqno != seqno:
                raise TransactionError(f"received frame for seqno {seqno} holds the record of seqno {rec.seqno}")
            for u in rec.updates:
                op = u.op
                if u.region != name:  # most records touch the region the previous one touched
                    name = u.region
                    r = regions.get(name) or st.create_region(name, True)
                    rid, replicated = r.id, r.replicated
                if op == SET:
                    add((rid, encode_key(u.key), u.value))
                elif op == KILL or op == ZKILL:
                    if puts:
                        st.put_rows(puts)
                        puts.clear()
                    (st.delete_subtree if op == KILL else st.delete)(rid, encode_key(u.key))
                else:
                    raise TransactionError(f"received seqno {seqno}: update {op!r} to region {name!r} is not one "
                                           f"of set ({SET}), kill ({KILL}) or zkill ({ZKILL})")
                if replicated:
                    last_in[name] = seqno
            if rec.stream or track_streams:
                if rec.stream and rec.stream not in moved:  # marked before it moves (``streams``)
                    moved.add(rec.stream)
                    core.mark_stream(rec.stream)
                streams[rec.stream] = rec.stream_seqno
            core.seqno = seqno
            start, seqno = end, seqno + 1
        out.append((run.first_seqno + skip, data if not skip else data[ends[skip - 1]:], run))
    _finish_store(core, puts, last_in, bool(out))
    return out


def _frames_applied(core: Core, run: FrameRun) -> int | None:
    """How many of ``run``'s frames the instance already holds (a replay after a restart starts
    inside a run), None if it holds them all: what makes the apply exactly once. JournalGap if
    the run starts past the instance's next seqno, before anything of it is applied."""
    pos = core.seqno
    if run.last_seqno <= pos:
        return None
    skip = max(0, pos + 1 - run.first_seqno)
    if run.first_seqno + skip != pos + 1:
        raise JournalGap(f"instance {core.name} is at seqno {pos}; received seqno {run.first_seqno} leaves "
                         f"a gap")
    return skip


def _finish_store(core: Core, puts: list[tuple[int, bytes, bytes]], last_in: dict[str, int],
                  applied: bool) -> None:
    """After the runs: the sets still gathered in one bulk write, and the applied seqno of each
    replicated region they touched and of the instance, so that recovery rolls forward from there."""
    st = core.store
    if puts:
        st.put_rows(puts)
    for name, seqno in last_in.items():
        st.mark_applied(seqno, (name,))
    if applied:
        st.mark_applied(core.seqno, ())


def apply_records(core: Core, recs: list[Record], si_stream: int | None) -> int:
    """Apply received transactions, re-framed by this instance (SI, or records given decoded);
    BC keeps each one's seqno, stream tag and origin. Returns the instance's seqno."""
    with core.lock:
        core.check_open()
        frames: list[tuple[int, bytes]] = []
        moved: set[int] = set()  # received streams (1..15) this write moves
        with core.atomic():
            for rec in recs:
                if si_stream is None:
                    pos, kw = core.seqno, {"stream": rec.stream, "stream_seqno": rec.stream_seqno}
                else:
                    pos = core.stream_seqnos.get(si_stream, 0)
                    kw = {"stream": si_stream, "stream_seqno": rec.seqno}
                if rec.seqno <= pos:
                    continue
                if rec.seqno != pos + 1:
                    raise JournalGap(f"instance {core.name} is at "
                                     f"{'seqno' if si_stream is None else 'stream seqno'} {pos}; received seqno "
                                     f"{rec.seqno} leaves a gap")
                if kw["stream"] and kw["stream"] not in moved:  # marked before it moves (``streams``)
                    moved.add(kw["stream"])
                    core.mark_stream(kw["stream"])
                ops = [(u.op, u.region, tuple(u.key), u.value) for u in rec.updates]
                seqno, data = prepare(core, ops, origin=rec.origin, replicated_apply=True, commit_time=rec.time,
                                      **kw)
                frames.append((seqno, data))
            if frames:
                core.write(frames)
        return core.received(bool(frames))
