"""Recovery on open: check the journal, then roll the store forward over what it does not hold yet.

The store is committed only behind the hardened journal, so after any crash it is at or behind the
journal's last seqno, never ahead: the records after the store's seqno are replayed into it (sets
in bulk, a kill or zkill after the sets before it), then the journal is hardened before the store
is committed, since the replayed records may have been in the page cache only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import JournalError
from ..fsutil import fsync_file
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from ..instance.maintenance import recover_journal_hinted
from ..journal.durability import Durability
from ..journal.reader import iter_records
from ..journal.records import KILL, SET
from ..journal.writer import JournalWriter
from ..keys import encode_key
from ..store.sqlite import Store
from .core import Core


@dataclass
class RecoveryReport:
    journal_last_seqno: int = 0
    store_seqno: int = 0  # what the store held before roll-forward
    replayed: int = 0
    replay_seconds: float = 0.0
    torn_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"journal ends at seqno {self.journal_last_seqno}",
                 f"store was at {self.store_seqno}, rolled forward {self.replayed} transactions"]
        if self.replay_seconds > 0 and self.replayed:
            parts.append(f"at {self.replayed / self.replay_seconds:,.0f} records/s")
        return "; ".join(parts) + ("" if not self.notes else "; " + "; ".join(self.notes))


def recover(lay: Layout, durability: str | Durability | None, segment_bytes: int | None
            ) -> tuple[Core, RecoveryReport]:
    """Open the journal and store of ``lay`` (its lock held) and roll the store forward."""
    info = ifile.load(lay.instance_file)
    js = recover_journal_hinted(lay.journal)  # damage in the newest segment: says how to repair it
    store = Store(lay.store_file)
    rep = RecoveryReport(journal_last_seqno=js.last_seqno, store_seqno=store.applied_seqno,
                         torn_bytes=js.torn_bytes, notes=list(js.notes))
    if store.applied_seqno > js.last_seqno:
        store.close()
        raise JournalError(f"the store of {lay.root} is at seqno {store.applied_seqno} but its journal "
                           f"ends at {js.last_seqno}: journal files are missing; restore from a backup")
    tail = js.segments[-1]
    try:
        journal = JournalWriter(lay.journal, index=tail.index, path=tail.path, last_seqno=js.last_seqno,
                                durability=durability or info.durability,
                                segment_bytes=segment_bytes or info.segment_bytes, size=js.tail_size)
    except BaseException:
        store.abandon()
        raise
    core = Core(lay, info, store, journal, js.last_seqno, store.stream_seqnos)
    try:
        _roll_forward_on_open(core, js, rep)
    except BaseException:
        abandon(core)
        raise
    return core, rep


def abandon(core: Core) -> None:
    """An open that failed after the journal and store were opened: close both, committing nothing
    to the store (the journal holds it all; the next open replays it)."""
    try:
        core.journal.close()
    except OSError:
        pass
    core.store.abandon()


def _roll_forward_on_open(core: Core, js, rep: RecoveryReport) -> None:
    store = core.store
    if store.applied_seqno < js.last_seqno:
        t1 = time.perf_counter()
        replay_from = store.applied_seqno + 1
        rep.replayed = roll_forward(core, replay_from, js.last_seqno)
        # Journal first, then database: the records just replayed may be in the page cache only
        # (the writer crashed before hardening them); a power loss must not leave the store ahead.
        for i, seg in enumerate(js.segments):
            if i + 1 == len(js.segments) or js.segments[i + 1].first_seqno > replay_from:
                fsync_file(seg.path)
        store.flush()
        rep.replay_seconds = time.perf_counter() - t1


def roll_forward(core: Core, first: int, last: int) -> int:
    """Replay journal records ``first..last`` into the store. Sets are written in bulk; a kill or
    zkill first writes the sets before it, so the order of updates holds."""
    st = core.store
    regions = st.regions
    puts: list[tuple[int, bytes, bytes]] = []
    n = 0
    track_streams = core.info.supplementary
    last_in: dict[str, int] = {}  # region -> last seqno that touched it
    name, rid = None, 0
    # recover_journal has just checked every CRC of the newest segment, where a replay mostly is
    for rec in iter_records(core.layout.journal, first, last, tail_checked=True):
        for u in rec.updates:
            if u.region != name:
                name = u.region
                rid = (regions.get(name) or st.create_region(name, True)).id
            if u.op == SET:
                puts.append((rid, encode_key(u.key), u.value))
            else:
                if puts:
                    st.put_rows(puts)
                    puts = []
                (st.delete_subtree if u.op == KILL else st.delete)(rid, encode_key(u.key))
            last_in[name] = rec.seqno
        if rec.stream or track_streams:
            core.stream_seqnos[rec.stream] = rec.stream_seqno
        n += 1
    if puts:
        st.put_rows(puts)
    for region, seqno in last_in.items():
        st.mark_applied(seqno, (region,))
    if n:
        st.mark_applied(last, ())
    if n != last - first + 1:
        raise JournalError(f"journal of {core.layout.root} is missing records {first}..{last} needed to "
                           f"roll the store forward")
    return n
