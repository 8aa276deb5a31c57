"""The state of one open instance that every engine operation shares, and the steps they share.

``Core`` holds the commit lock and, under it, the positions (the last seqno, the last stream seqno
per SI stream), the store's open SQLite transaction and the journal writer. The commit paths
(``commit``), the apply of received transactions (``apply``), recovery and rollback are modules of
functions over a ``Core``; ``Database`` is the public facade over it. Nothing outside ``engine/``
touches a ``Core``: other packages use the facade's public operations.

The shared steps, each called under the commit lock:

- ``savepoint`` / ``undo``: a commit or a batch of commits can be undone whole, with the
  in-memory positions, so a failed journal write or an oversized record leaves no trace;
- ``seal``: give applied updates the next seqno and frame their journal record;
- ``write``: journal the frames, then hand them to the commit listeners (the journal pool);
- ``maybe_flush``: commit the store now and then, only behind the hardened journal.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..errors import NotPrimary, RegionNotFound, StorageFull, StoreLost, TransactionError
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from ..journal import records as journal_records
from ..journal.durability import Durability
from ..journal.records import Record, Update, encode_payload, frame
from ..journal.writer import JournalWriter
from ..store.sqlite import RegionInfo, Store
from .streams import StreamMarks, marked

_log = logging.getLogger("multisite")
STORE_FLUSH_INTERVAL_S = 0.5  # the store commits at least this often while commits arrive
STORE_FLUSH_TXNS = 50_000  # ... or after this many transactions
BATCH, REQUEST = "ms_batch", "ms_request"  # store savepoints: a commit or batch, one request in it


class Core:
    """One open instance's shared state; see the module docstring. Attributes are the engine's own."""

    def __init__(self, layout: Layout, info: ifile.InstanceFile, store: Store, journal: JournalWriter,
                 seqno: int, stream_seqnos: dict[int, int]):
        self.layout, self.info, self.name = layout, info, info.name
        self.lock = threading.Lock()  # the commit lock: fixes seqno order
        self.store, self.journal = store, journal
        self.seqno = seqno  # the last committed seqno
        self.stream_seqnos = stream_seqnos  # SI: last stream_seqno per stream (0..15)
        # Received streams (1..15): where writes not known hard moved them (``streams``); a stream's
        # tuple is replaced whole, read without the lock
        self.stream_marks: dict[int, StreamMarks] = {}
        self.closed = False
        self.commit_listeners: list[Callable[[int, list[bytes]], None]] = []  # (first seqno, frames)
        self.rollback_listeners: list[Callable[[int], None]] = []
        self.last_flush = time.monotonic()
        # HA fencing (ha/): the monotonic time after which local commits are refused, None without a
        # lease. Checked under the commit lock, before a seqno is assigned.
        self.lease_until: float | None = None

    def check_open(self) -> None:
        if self.closed:
            raise TransactionError(f"instance {self.layout.root} is closed")

    def lease_ended(self) -> bool:
        """True once the leader lease this primary commits under can have ended (``lease_until``)."""
        until = self.lease_until
        return until is not None and time.monotonic() >= until

    def check_lease(self) -> None:
        """NotPrimary once the lease has ended (``lease_ended``)."""
        if self.lease_ended():
            raise NotPrimary(f"instance {self.name} is fenced: its leader lease was not renewed in time, so "
                             f"another member may be primary now; write to the cluster's primary")

    def region(self, name: str) -> RegionInfo:
        r = self.store.regions.get(name)
        if r is None:
            raise RegionNotFound(f"region {name!r} does not exist in instance {self.name}; create it with "
                                 f"db.create_region({name!r})")
        return r

    # -- undo ------------------------------------------------------------------------------------
    def savepoint(self) -> tuple:
        """Open the savepoint a commit (or a batch of them) can be undone to, with the in-memory
        positions to restore: nothing else unflushed is lost by an undo."""
        self.store.savepoint(BATCH)
        return self.seqno, dict(self.stream_seqnos), self.store.positions()

    def undo(self, snap: tuple) -> None:
        # In-memory positions first: if the store cannot roll back (StoreLost), they still must not
        # count what was undone.
        self.seqno = snap[0]
        self.stream_seqnos.clear()
        self.stream_seqnos.update(snap[1])
        self.store.restore_positions(snap[2])
        self.store.rollback_to(BATCH)

    def release(self) -> None:
        self.store.release(BATCH)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Under the commit lock: what the block applies and journals is undone whole if it raises.
        (For batches; a single commit spells it out: a generator-based context costs about a
        microsecond, which the commit path of ``commit.py`` cannot spare.)"""
        snap = self.savepoint()
        try:
            yield
        except BaseException:
            self.undo(snap)
            raise
        self.release()

    def received(self, journaled: bool) -> int:
        """After a batch of received transactions: harden it in group mode (a secondary has no
        combiner to wait for), flush the store now and then; the instance's seqno."""
        if journaled and self.journal.durability is Durability.GROUP:
            self.journal.sync()
        self.maybe_flush()
        return self.seqno

    # -- seqnos and the journal ------------------------------------------------------------------
    def hardened_seqno(self) -> int:
        """The journal's hardened position (written, with durability none)."""
        j = self.journal
        return j.written_seqno if j.durability is Durability.NONE else j.durable_seqno

    def mark_stream(self, stream: int) -> None:
        """Before a write of received transactions moves ``stream`` (1..15), from the next seqno on
        (see ``streams``)."""
        self.stream_marks[stream] = marked(self.stream_marks.get(stream, ()), self.seqno + 1,
                                           self.stream_seqnos.get(stream, 0), hard=self.hardened_seqno())

    def seal(self, updates: list[Update], touched: set[str], *, origin: str | None = None, stream: int = 0,
             stream_seqno: int | None = None, commit_time: float | None = None,
             keep_empty: bool = False) -> tuple[int, bytes]:
        """Give applied ``updates`` the next seqno and frame their journal record; a record over the
        journal's limit is a TransactionError and takes no seqno. ``(0, b"")`` for no updates, unless
        ``keep_empty`` (a received empty transaction: it takes its seqno)."""
        if not updates and not keep_empty:
            return 0, b""
        seqno = self.seqno + 1
        if stream_seqno is None:  # a local transaction: stream 0
            # A supplementary instance counts its own transactions on stream 0 (GT.M's {102,0,11});
            # elsewhere the stream seqno of a local transaction is its seqno.
            stream_seqno = self.stream_seqnos.get(0, 0) + 1 if self.info.supplementary else seqno
        if commit_time is None:  # a local commit: its time is taken now
            commit_time = time.time()
            if self.lease_until is not None:
                # Checked again after the time is taken: a pause (SIGSTOP, a stalled VM) after
                # ``prepare``'s check would otherwise date the record after another member took over.
                self.check_lease()
        rec = Record(seqno, stream, stream_seqno, origin or self.name, commit_time, updates)
        payload = encode_payload(rec)
        limit = journal_records.MAX_RECORD_BYTES
        if len(payload) > limit:
            raise TransactionError(f"transaction of {len(payload):,} bytes exceeds the journal's record limit of "
                                   f"{limit:,} bytes; split it into smaller transactions")
        self.seqno = seqno
        if stream or self.info.supplementary:
            self.stream_seqnos[stream] = stream_seqno
        self.store.mark_applied(seqno, touched)
        return seqno, frame(seqno, payload)

    def write(self, frames: list[tuple[int, bytes]]) -> None:
        """Journal prepared frames, then hand them to the commit listeners."""
        self.journal.append(frames[0][1] if len(frames) == 1 else b"".join(f for _, f in frames), frames[-1][0])
        if self.commit_listeners:
            datas = [f for _, f in frames]
            for listener in self.commit_listeners:
                listener(frames[0][0], datas)

    # -- the store behind the journal ------------------------------------------------------------
    def maybe_flush(self) -> None:
        """After commits: flush the store now and then. The commits are in the journal already, so a
        store that cannot flush (a full disk) must not make them look failed to their callers, who
        would retry and apply them twice: it is logged, and the next flush tries again (or, the
        store lost, every later operation says so)."""
        st = self.store
        if not st.dirty:
            return
        if (st.applied_seqno - st.flushed_seqno >= STORE_FLUSH_TXNS
                or time.monotonic() - self.last_flush >= STORE_FLUSH_INTERVAL_S):
            try:
                self.flush()
            except (StorageFull, StoreLost) as e:
                _log.warning("instance %s: the store could not be flushed after commits that are in the "
                             "journal: %s", self.name, e)

    def flush(self) -> None:
        """Harden the journal, then commit the store (never ahead of the journal)."""
        self.journal.sync()
        self.store.flush()
        self.last_flush = time.monotonic()

    def save_info(self) -> None:
        """Write the instance file (with the current seqno) crash-safely."""
        self.info.seqno = self.seqno
        ifile.save(self.layout.instance_file, self.info)
