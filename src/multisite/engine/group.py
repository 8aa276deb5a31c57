"""Group commit by combining, pipelined (``group`` durability).

One committer at a time (the combiner) takes every queued request, applies them as one batch under
the commit lock and writes one buffer; it then hands the combiner role to the oldest waiting
request *before* its fdatasync, so the next batch is prepared while this one is being hardened.
Each caller is woken exactly once: when its batch is hard, or when it becomes the combiner. Under
the GIL, handing a commit to another thread costs more than doing it (docs/decisions.md).
"""

from __future__ import annotations

import threading
from ..errors import TransactionError
from .commit import Op, prepare_each, prepare_sets
from .core import Core

class _Request:
    """One transaction waiting in the group-commit queue."""

    __slots__ = ("ops", "wake", "seqno", "error", "done", "promoted")

    def __init__(self, ops: list[Op], wake: threading.Lock):
        self.ops, self.wake = ops, wake
        self.seqno = 0
        self.error: BaseException | None = None
        self.done = False
        self.promoted = False


class _Wake(threading.local):
    """Per thread, the lock the combiner wakes it with, kept acquired between commits. A class
    default, so that a thread that never set it reads None without an AttributeError."""

    lock: threading.Lock | None = None


class GroupCommit:
    def __init__(self, core: Core):
        self.core = core
        self._q_lock = threading.Lock()
        self._queue: list[_Request] = []
        self._combining = False
        self._wake = _Wake()

    def commit(self, ops: list[Op]) -> int:
        """Commit ``ops`` with the other transactions queued meanwhile; the seqno once it is hard."""
        wake = self._wake.lock
        if wake is None:
            wake = self._wake.lock = threading.Lock()
            wake.acquire()
        req = _Request(ops, wake)
        with self._q_lock:
            self._queue.append(req)
            lead = not self._combining
            self._combining = True
        if not lead:
            req.wake.acquire()
            if not req.promoted:
                if req.error is not None:
                    raise req.error
                return req.seqno
        with self._q_lock:
            batch, self._queue = self._queue, []
        try:
            token, err = self._prepare_batch(batch)
        except BaseException as e:  # whatever happens, the batch and the next combiner must be woken
            token, err = None, e
            _fail_all(batch, e)
        finally:
            with self._q_lock:  # the next batch may start now
                if self._queue:
                    nxt = self._queue[0]
                    nxt.promoted = True
                    nxt.wake.release()
                else:
                    self._combining = False
        if token is not None and err is None:
            try:
                self.core.journal.harden(token)
            except BaseException as e:
                err = e
        for r in batch:
            if err is not None and r.error is None and r.seqno:
                r.error = err
            r.done = True
            if r is not req:
                r.wake.release()
        if req.error is not None:
            raise req.error
        return req.seqno

    def _prepare_batch(self, batch: list[_Request]) -> tuple[tuple | None, BaseException | None]:
        """Under the commit lock: apply and journal a batch; returns what ``harden`` needs."""
        core = self.core
        frames: list[tuple[int, bytes]] = []
        with core.lock:
            if core.closed:  # closed while these waited: the store is gone
                e = TransactionError(f"instance {core.layout.root} was closed before this commit")
                _fail_all(batch, e)
                return None, e
            snap = core.savepoint()
            token = None
            try:
                if not self._prepare_sets(batch, frames):
                    self._prepare_each(batch, frames)
                if frames:
                    core.write(frames)
                    token = core.journal.sync_token()
            except BaseException as e:
                # The whole batch is undone, including requests that journal nothing (updates of
                # unreplicated regions only): every one of them must fail, not only those with a seqno.
                core.undo(snap)
                _fail_all(batch, e)
                return None, e
            core.release()
            core.maybe_flush()
        return token, None

    def _prepare_each(self, batch: list[_Request], frames: list[tuple[int, bytes]]) -> None:
        """Prepare a batch request by request, each in a savepoint of its own, so that a request
        that fails leaves nothing behind and the others go on."""
        for r, res in zip(batch, prepare_each(self.core, [r.ops for r in batch], frames)):
            if isinstance(res, Exception):
                r.error, r.seqno = res, 0
            else:
                r.seqno = res

    def _prepare_sets(self, batch: list[_Request], frames: list[tuple[int, bytes]]) -> bool:
        """The common batch, set by set in one pass (``commit.prepare_sets``); False, having done
        nothing, for any other batch."""
        results = prepare_sets(self.core, [r.ops for r in batch], frames)
        if results is None:
            return False
        for r, res in zip(batch, results):
            if isinstance(res, Exception):
                r.error, r.seqno = res, 0
            else:
                r.seqno = res
        return True


def _fail_all(batch: list[_Request], err: BaseException) -> None:
    """Give every request of a batch that was not applied the error (keeping its own, if it had one)."""
    for r in batch:
        if r.error is None:
            r.error = err
        r.seqno = 0
