"""The Update Process: applies received transactions from the receive pool, in order, exactly once.

It runs as a thread of the instance server (it needs the engine, which the server owns) and can be
stopped and started on its own: while it is stopped, the Receiver Server keeps filling the receive
pool until it sends XOFF. Each batch goes through ``Database.apply_frames``: the primary's frames are
journaled byte for byte (keeping the originating seqno and CRCs), applied to the store, and handed to
the secondary's own journal pool, so that it can feed a further secondary (SI re-frames them under
its stream with ``apply_records``). Its restart point is always the instance's own seqno, so restarts of any process
neither skip nor repeat a transaction.

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
from .pools import ReceivePool

# Frames (whole received batches) applied with one journal write and one fsync. Larger catches up
# faster (a fsync per 1 MiB batch held catch-up back); smaller holds the commit lock, which the
# secondary's readers wait for, for less time (about 150 ms for 32,768 single-update frames; 16,384
# caught up 10% slower, 65,536 10% faster, bench/catchup.py).
UPDATE_BATCH_FRAMES = 32768
SI_APPLY_RECORDS = 512  # SI re-frames under the commit lock the supplementary's own commits share
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

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self.error = None
        self.started_at, self.start_seqno = time.time(), self.db.seqno
        self._thread = threading.Thread(target=self._run, name="update-process", daemon=True)
        self._thread.start()
        self.log.info("update process started at seqno %d", self.start_seqno)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.running:
            return
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        self.log.info("update process stopped at seqno %d (%d applied since start)", self.db.seqno, self.applied)

    def _run(self) -> None:
        last_log, last_applied = time.monotonic(), 0
        full_since: float | None = None  # when the disk was found full (None: applying normally)
        pause = STORAGE_RETRY_MIN_S
        while not self._stop.is_set():
            gen, items = self.pool.take(UPDATE_BATCH_FRAMES, timeout=0.2)
            if items:
                at = self.db.seqno
                try:
                    with self.pool.apply_lock:
                        if gen != self.pool.generation:
                            continue  # the receiver restarted the stream; these will come again
                        self._apply(items)
                        self.applied += self.db.seqno - at
                    if self.on_applied:
                        self.on_applied()
                    if full_since is not None:
                        self.log.info("update process: room again after %.1f s; applying from seqno %d",
                                      time.monotonic() - full_since, at + 1)
                        full_since, pause, self.error = None, STORAGE_RETRY_MIN_S, None
                except JournalGap as e:
                    self.error = str(e)
                    self.log.error("update process: %s; asking the receiver to restart from seqno %d",
                                   e, self.db.seqno + 1)
                    self.pool.clear(self.db.seqno)
                    if self.on_gap:
                        self.on_gap()
                except StorageFull as e:
                    # Nothing of the batch was applied (the engine undid it). Keep it and try again:
                    # restarting the stream would only fetch the same records again, every time.
                    # Meanwhile the receive pool fills and the receiver sends XOFF.
                    self.pool.put_back(gen, items)
                    self.error = str(e)
                    if full_since is None:
                        full_since = time.monotonic()
                        self.log.error("update process: %s; holding the received records from seqno %d and "
                                       "trying again until there is room", e, at + 1)
                    self._stop.wait(pause)
                    pause = min(pause * 2, STORAGE_RETRY_MAX_S)
                except Exception as e:  # a record this instance cannot apply: stop, but visibly
                    self.pool.put_back(gen, items)  # `update start` takes them again
                    self.error = f"{type(e).__name__}: {e}"
                    self.log.exception("update process stopped at seqno %d: cannot apply received records (%s); "
                                       "fix the cause, then `multisite update start`", self.db.seqno, self.error)
                    return
            now = time.monotonic()
            if now - last_log >= self.stats_interval_s:
                n = self.applied - last_applied
                self.log.info("stats: applied %d transactions in %.1f s (%.0f/s), seqno %d (started at %d), "
                              "receive pool backlog %d", n, now - last_log, n / (now - last_log), self.db.seqno,
                              self.start_seqno, len(self.pool))
                last_log, last_applied = now, self.applied

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
                "error": self.error}
