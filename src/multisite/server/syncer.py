"""Hardening the client listener's gathered commits: the sync thread and the timed fdatasync.

The listener's loop (``server.clients``) writes each batch of gathered commits to the journal and
hands its hardening here. The sync thread (``clients-sync``) runs one fdatasync after another while
batches are written, each covering every batch written when it starts (``Gathering.to_harden``
gives the token then), without going back to the loop in between; each group's end is answered on
the loop (``on_synced``). When the loop hardens a group itself (see ``clients.INLINE_SYNC_MAX_S``) it
runs the same timed ``harden``, so ``ewma_s``, the running estimate the loop's choice reads, counts
every fdatasync. The store's periodic commit fsyncs too: it runs here when due, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import MultisiteError
from ..protocol.client import Gathering
from .sockets import pin_thread

FLUSH_CHECK_S = 0.05  # how often the sync thread asks whether the store's periodic commit is due
SYNC_EWMA_WEIGHT = 0.2  # weight of the newest fdatasync in the running estimate of their duration


class Syncer:
    """The sync thread of a listener serving ``db`` (the instance server's Database); ``on_synced(upto,
    err)`` runs on ``loop`` when the fdatasync covering the first ``upto`` written commits returned
    (``err``: what it raised, or None). ``start`` it once the loop runs; ``kick`` it after a batch is
    written; ``stop`` it after the loop stopped."""

    def __init__(self, db: Any, gathering: Gathering, loop: asyncio.AbstractEventLoop,
                 on_synced: Callable[[int, BaseException | None], None], log: logging.Logger,
                 cpus: set[int] | None = None):
        self._db = db
        self._cpus = cpus  # the loop thread's CPU (sockets.listener_cpu): the hand-offs stay on one CPU
        self._gathering = gathering
        self._loop = loop
        self._on_synced = on_synced
        self._log = log
        self.sync_s = 0.0  # seconds spent hardening (this thread, and the loop's inline fdatasyncs)
        self.ewma_s: float | None = None  # recent fdatasync duration; None until one was measured
        self._flush_checked = 0.0  # perf_counter of the last flush_if_due
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="clients-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        """A batch was written: wake the thread if it waits."""
        with self._cond:
            self._cond.notify()

    def stop(self) -> None:
        """End the thread once nothing is left to harden, and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def harden(self, token: object) -> BaseException | None:
        """One timed fdatasync (either thread); the error the commits it covers are answered with, or
        None. The running estimate of their duration is updated without a lock: a float store is
        atomic, and an update lost to the other thread only delays the choice by one group."""
        t0 = time.perf_counter()
        err: BaseException | None = None
        try:
            self._db.harden(token)
        except BaseException as e:  # noqa: BLE001 - the commits it covers are answered with it
            err = e
        took_s = time.perf_counter() - t0
        self.sync_s += took_s
        ewma = self.ewma_s
        self.ewma_s = took_s if ewma is None else ewma + SYNC_EWMA_WEIGHT * (took_s - ewma)
        return err

    def _run(self) -> None:
        """The sync thread: one fdatasync after another while commits are written, each for every
        batch written until it starts (the token is read then: what the loop wrote meanwhile joins the
        group), without going back to the loop in between; the loop answers each group. And the
        store's periodic commit when due, also for commits with nothing to harden (durability none,
        unreplicated regions): it fsyncs too, so not on the loop; a failure there is the store's,
        logged by the engine, never the commits'."""
        pin_thread(self._cpus)
        hard = 0
        while True:
            with self._cond:
                while (nxt := self._gathering.to_harden(hard)) is None and not self._stop:
                    # a read without the lock: a stale answer only delays the check by one wait
                    if self._db.store.dirty and time.perf_counter() - self._flush_checked >= FLUSH_CHECK_S:
                        break
                    self._cond.wait(FLUSH_CHECK_S)
            if nxt is not None:
                token, upto = nxt
                err = self.harden(token)
                hard = upto
                try:
                    self._loop.call_soon_threadsafe(self._on_synced, upto, err)
                except RuntimeError:  # the loop is closed: nobody left to answer
                    return
            elif self._stop:
                return  # stopping, nothing left to harden
            if time.perf_counter() - self._flush_checked >= FLUSH_CHECK_S:
                self._flush_checked = time.perf_counter()
                try:
                    self._db.flush_if_due()
                except MultisiteError as e:
                    self._log.warning("the store could not be flushed after client commits: %s", e)
