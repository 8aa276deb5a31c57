"""The Update Process: applies received transactions from the receive pool, in order, exactly once.

It runs as a thread of the instance server (it needs the engine, which the server owns) and can be
stopped and started on its own: while it is stopped, the Receiver Server keeps filling the receive
pool until it sends XOFF. Each batch goes through ``Database.apply_frames``: the primary's frames are
journaled byte for byte (keeping the originating seqno and CRCs), applied to the store, and handed to
the secondary's own journal pool, so that it can feed a further secondary (SI re-frames them under
its stream with ``apply_records``). Its restart point is always the instance's own seqno, so restarts of any process
neither skip nor repeat a transaction.

Streaming, most batches are not applied on this thread: the receiver puts a read's few transactions
in the pool without waking it and, while the thread is idle and applies are short
(``session.InlineApply``), has them applied on its own event loop (``apply_here``): the same apply,
journal write and fdatasync before the confirmation, without a wake-up of this thread and one of the
loop back per batch (issue 27). Both take and apply under the pool's ``apply_lock``, so batches are
applied in order whoever applies them; a catch-up's large reads, a slow disk, and any batch that
failed on the loop are this thread's.

A batch that fails is never dropped: a gap hands the stream back to the receiver (restart from
this instance's seqno); a full disk keeps the batch and tries again, with a growing pause, until
there is room; anything else stops the Update Process visibly with the batch back in the pool.
"""

from __future__ import annotations

import logging
import threading
import time

from ...engine import Database
from ...errors import JournalGap, StorageFull
from ...journal.records import FRAME_HEADER_SIZE, FrameRun, decode_payload
from ..session import InlineApply
from .pools import ReceivePool

# Frames (whole received batches) applied with one journal write and one fsync. Larger catches up
# faster (a fsync per 1 MiB batch held catch-up back); smaller holds the commit lock, which the
# secondary's readers wait for, for less time (about 150 ms for 32,768 single-update frames; 16,384
# caught up 10% slower, 65,536 10% faster, bench/catchup.py).
UPDATE_BATCH_FRAMES = 32768
SI_APPLY_RECORDS = 512  # SI re-frames under the commit lock the supplementary's own commits share
UPDATE_IDLE_WAIT_S = 0.2  # the thread's wait for a batch before it looks at its stats again
STORAGE_RETRY_MIN_S = 0.25  # a full disk: first pause before applying again, doubled up to
STORAGE_RETRY_MAX_S = 5.0


class UpdateProcess:
    def __init__(self, db: Database, pool: ReceivePool, log: logging.Logger, *, stats_interval_s: float = 5.0):
        self.db, self.pool, self.log = db, pool, log
        self.stats_interval_s = stats_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied = 0
        self.started_at = 0.0
        self.start_seqno = 0
        self.error: str | None = None
        self.on_gap = None  # called when the stream has a gap: the receiver must restart the connection
        self.on_applied = None  # called after each applied batch: the receiver confirms it to the source
        self.si_stream: int | None = None  # SI: apply under this stream with local seqnos
        self.idle_wait_s = UPDATE_IDLE_WAIT_S
        self.place = InlineApply()  # where a streamed batch is applied: the receiver's loop or this thread
        self.applied_here = 0  # transactions applied on the receiver's loop (apply_here), of ``applied``
        self._handed_back = False  # apply_here failed on the batch now waiting: the thread's to apply
        # (generation, seqno before, error) of that failure: the thread handles it as its own instead of
        # applying again (a failure after the journal write, an fdatasync, left the batch applied)
        self._failed_here: tuple[int, int, Exception] | None = None
        self._full_since: float | None = None  # when the disk was found full (None: applying normally)
        self._pause = STORAGE_RETRY_MIN_S

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self.error = None
        self._failed_here = None  # `update start` after a fix: the batch is applied again, not failed again
        self.started_at, self.start_seqno = time.time(), self.db.seqno
        self._thread = threading.Thread(target=self._run, name="update-process", daemon=True)
        self._thread.start()
        self.log.info("update process started at seqno %d", self.start_seqno)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.running:
            return
        self._stop.set()
        self.pool.wake()
        assert self._thread is not None
        self._thread.join(timeout)
        self.log.info("update process stopped at seqno %d (%d applied since start)", self.db.seqno, self.applied)

    def _run(self) -> None:
        last_log, last_applied = time.monotonic(), 0
        while not self._stop.is_set():
            if self.pool.wait(self.idle_wait_s) and not self._take_and_apply():
                return
            now = time.monotonic()
            if now - last_log >= self.stats_interval_s:
                n = self.applied - last_applied
                self.log.info("stats: applied %d transactions in %.1f s (%.0f/s), seqno %d (started at %d), "
                              "receive pool backlog %d; %d applied on the receiver's loop since start",
                              n, now - last_log, n / (now - last_log), self.db.seqno, self.start_seqno,
                              len(self.pool), self.applied_here)
                last_log, last_applied = now, self.applied

    def _take_and_apply(self) -> bool:
        """The thread's turn: take what waits and apply it; False once the Update Process must stop.
        Taken, applied and (on a failure) put back under ``apply_lock``, so that an apply on the
        receiver's loop (``apply_here``) never overtakes a batch taken here."""
        with self.pool.apply_lock:
            gen, items = self.pool.take(UPDATE_BATCH_FRAMES, timeout=0)
            if not items:
                return True  # applied on the receiver's loop meanwhile
            self._handed_back = False
            at = self.db.seqno
            failed_here, self._failed_here = self._failed_here, None
            try:
                if failed_here is not None and failed_here[0] == gen:
                    at = failed_here[1]
                    raise failed_here[2]
                t0 = time.perf_counter()
                self._apply(items)
                self.place.took(time.perf_counter() - t0)
                self.applied += self.db.seqno - at
            except JournalGap as e:
                self.error = str(e)
                self.log.error("update process: %s; asking the receiver to restart from seqno %d",
                               e, self.db.seqno + 1)
                self.pool.clear(self.db.seqno)
                failed: BaseException | None = e
            except StorageFull as e:
                # Nothing of the batch was applied (the engine undid it). Keep it and try again:
                # restarting the stream would only fetch the same records again, every time.
                # Meanwhile the receive pool fills and the receiver sends XOFF.
                self.pool.put_back(gen, items)
                self.error = str(e)
                if self._full_since is None:
                    self._full_since = time.monotonic()
                    self.log.error("update process: %s; holding the received records from seqno %d and "
                                   "trying again until there is room", e, at + 1)
                failed = e
            except Exception as e:  # a record this instance cannot apply: stop, but visibly
                self.pool.put_back(gen, items)  # `update start` takes them again
                self.error = f"{type(e).__name__}: {e}"
                self.log.exception("update process stopped at seqno %d: cannot apply received records (%s); "
                                   "fix the cause, then `multisite update start`", self.db.seqno, self.error)
                return False
            else:
                failed = None
        if isinstance(failed, JournalGap):
            if self.on_gap:
                self.on_gap()
        elif isinstance(failed, StorageFull):
            self._stop.wait(self._pause)
            self._pause = min(self._pause * 2, STORAGE_RETRY_MAX_S)
        else:
            if self.on_applied:
                self.on_applied()
            if self._full_since is not None:
                self.log.info("update process: room again after %.1f s; applying from seqno %d",
                              time.monotonic() - self._full_since, at + 1)
                self._full_since, self._pause, self.error = None, STORAGE_RETRY_MIN_S, None
        return True

    def apply_here(self) -> int | None:
        """On the receiver's loop, after it put a read's batches in the pool without waking the thread:
        apply what waits here and now when ``InlineApply`` says so and the thread is idle (no thread
        wake-up to it and back, issue 27); the transactions applied (0: the thread had taken them). None:
        wake the thread instead. A failure here puts the batch back for the thread, which handles the
        error as its own (a gap, a full disk, a record it cannot apply, a failed fdatasync) without
        applying the batch first: one that failed after its journal write is applied already, and
        applying it again would find nothing to do and pass for a success."""
        ready = (self.running and not self._stop.is_set() and self._full_since is None
                 and not self._handed_back)
        if not self.place.ok(len(self.pool), ready) or not self.pool.apply_lock.acquire(blocking=False):
            return None
        try:
            gen, items = self.pool.take(UPDATE_BATCH_FRAMES, timeout=0)
            if not items:
                return 0
            at = self.db.seqno
            try:
                t0 = time.perf_counter()
                self._apply(items)
                self.place.took(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - the thread takes the batch and handles this error
                self.pool.put_back(gen, items)
                self._handed_back = True
                self._failed_here = (gen, at, e)
                self.log.warning("applying on the receiver's loop failed at seqno %d (%s: %s); the update "
                                 "process takes the batch", at + 1, type(e).__name__, e)
                return None
            n = self.db.seqno - at
            self.applied += n
            self.applied_here += n
            return n
        finally:
            self.pool.apply_lock.release()

    def _apply(self, runs: list[FrameRun]) -> None:
        """BC keeps the primary's frames; SI re-frames each transaction under its stream."""
        if self.si_stream is None:
            self.db.apply_frames(runs)
        else:  # in slices: the instance's own application commits wait for the lock meanwhile
            recs = [decode_payload(memoryview(fr)[FRAME_HEADER_SIZE:]) for run in runs for _, fr in run.frames()]
            for i in range(0, len(recs), SI_APPLY_RECORDS):  # a failure puts the whole batch back: the
                self.db.apply_records(recs[i:i + SI_APPLY_RECORDS], si_stream=self.si_stream)  # applied skip

    def status(self) -> dict:
        return {"state": "running" if self.running else "stopped", "applied": self.applied,
                "seqno": self.db.seqno, "start_seqno": self.start_seqno, "backlog": len(self.pool),
                "error": self.error, "applied_here": self.applied_here}
