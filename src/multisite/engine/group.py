"""Group commit by combining, pipelined (``group`` durability).

One committer at a time (the combiner) takes every queued request, applies them as one batch under
the commit lock and writes one buffer; it then hands the combiner role to the oldest waiting
request *before* its fdatasync, so the next batch is prepared while this one is being hardened.
Each caller is woken exactly once: when its batch is hard, or when it becomes the combiner. Under
the GIL, handing a commit to another thread costs more than doing it (docs/decisions.md).
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import KeyTypeError, TransactionError
from ..journal.records import SET, Update
from ..keys import encode_key
from .commit import Op, prepare_each
from .core import Core

_ABSENT = object()  # a key the store does not hold (None is a value a key can hold)


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
        """The common batch (on a primary, every request only sets keys of existing regions): read
        the batch's before-images with one query per region and write its values with one statement
        per region, instead of a savepoint, a read and a write for each request. Every SQLite call
        lets the GIL go, and with many committing threads the combiner then waits for its turn to
        take it back: the calls per batch, more than their work, bound group commit. Returns False,
        having done nothing, for any other batch."""
        core = self.core
        st = core.store
        regions = st.regions
        if core.info.role != "primary":
            return False
        for r in batch:
            for op in r.ops:
                if op[0] != SET or op[1] not in regions:
                    return False
        keyed: list[tuple[_Request, list[bytes]]] = []
        for r in batch:
            try:
                keyed.append((r, [encode_key(op[2]) for op in r.ops]))
            except KeyTypeError as e:  # a string subscript that is not text: this request only
                r.error, r.seqno = e, 0
        wanted: dict[int, list[bytes]] = {}
        for r, kbs in keyed:
            for op, kb in zip(r.ops, kbs):
                reg = regions[op[1]]
                if reg.replicated:
                    wanted.setdefault(reg.id, []).append(kb)
        current = {rid: st.get_many(rid, kbs) for rid, kbs in wanted.items()}  # before-images, kept current
        written: dict[int, dict[bytes, bytes]] = {}
        for r, kbs in keyed:
            undo: list[tuple[dict, bytes, Any]] = []  # what to put back if the request fails
            updates: list[Update] = []
            touched: set[str] = set()
            for (_, region, key, vb), kb in zip(r.ops, kbs):
                reg = regions[region]
                if reg.replicated:
                    cur = current[reg.id]
                    before = cur.get(kb, _ABSENT)
                    updates.append(Update(SET, region, key, vb, None if before is _ABSENT else before))
                    touched.add(region)
                    undo.append((cur, kb, before))
                    cur[kb] = vb
                w = written.setdefault(reg.id, {})
                undo.append((w, kb, w.get(kb, _ABSENT)))
                w[kb] = vb
            try:
                r.seqno, data = core.seal(updates, touched)
            except Exception as e:  # this request only (a record over the limit): undo its sets
                for d, kb, old in reversed(undo):
                    if old is _ABSENT:
                        del d[kb]
                    else:
                        d[kb] = old
                r.error, r.seqno = e, 0
                continue
            if data:
                frames.append((r.seqno, data))
        for rid, w in written.items():
            if w:
                st.put_values(rid, w)
        return True


def _fail_all(batch: list[_Request], err: BaseException) -> None:
    """Give every request of a batch that was not applied the error (keeping its own, if it had one)."""
    for r in batch:
        if r.error is None:
            r.error = err
        r.seqno = 0
