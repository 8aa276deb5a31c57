"""Two-phase local commits: prepare a batch, let others vote, then commit or undo it (the grid's primary).

A grid primary must not commit a transaction before its synchronous replicas voted on it
(grid/DESIGN.md, "The vote"), yet the replicas must receive the very frames the primary will
journal, so that every shard of a partition keeps a byte-identical journal. ``prepare`` therefore
does the first half of a commit under the commit lock (apply to the store inside a savepoint,
assign seqnos, frame the records) and **keeps the lock**; the caller ships the frames, collects the
votes, and calls ``commit`` (journal, harden, release) or ``abort`` (undo the store and the
positions, release): an aborted batch leaves no trace anywhere on the primary.

While a batch is prepared nothing else commits on the instance, and reads through the store see
the prepared state, so the caller (one task per partition) serializes reads behind the batch. The
lock is a plain ``threading.Lock``: the thread that commits may differ from the one that prepared.
"""

from __future__ import annotations

from ..errors import NotPrimary, TransactionError
from ..journal.durability import Durability
from .commit import Op, prepare_each, prepare_sets
from .core import Core


class Prepared:
    """A batch applied to the store and framed, not yet journaled; the commit lock is held.

    ``results[i]`` is transaction i's seqno (0 if it touched nothing replicated) or the exception
    that refused it alone (it left nothing behind); ``frames`` are ``(seqno, frame)`` in order."""

    def __init__(self, core: Core, snap: tuple, results: list[int | BaseException],
                 frames: list[tuple[int, bytes]]) -> None:
        self._core, self._snap = core, snap
        self.results, self.frames = results, frames
        self.done = False

    @property
    def first_seqno(self) -> int:
        return self.frames[0][0] if self.frames else 0

    @property
    def last_seqno(self) -> int:
        return self.frames[-1][0] if self.frames else 0

    def commit(self) -> None:
        """Journal the frames and harden them (whatever the instance's durability: a voted commit is
        acknowledged only hard), hand them to the commit listeners, release the lock. A failed write
        (a full disk) undoes the batch, releases the lock and raises."""
        token = self.write()
        if token is not None:
            self._core.journal.harden(token)

    def write(self, *, flush_store: bool = True) -> tuple | None:
        """The first half of ``commit``: journal the frames (written, not yet hard), release the batch
        and the commit lock; returns the token ``Database.harden`` takes (None: nothing to harden). The
        next batch is prepared while this one's fdatasync runs in another thread (group commit's
        pipeline); its callers are answered once ``harden`` returned. ``flush_store=False`` leaves the
        store's periodic commit (which hardens the journal first) to ``Database.flush_if_due``."""
        self._finish()
        core = self._core
        token = None
        try:
            if self.frames:
                core.write(self.frames)
                if core.journal.durability is not Durability.NONE:
                    token = core.journal.sync_token()
        except BaseException:
            core.undo(self._snap)
            core.lock.release()
            raise
        core.release()
        try:
            if flush_store:  # else the caller runs Database.flush_if_due where a fsync may block
                core.maybe_flush()
        finally:
            core.lock.release()
        return token

    def abort(self) -> None:
        """Undo the batch (store and positions), release the lock."""
        self._finish()
        try:
            self._core.undo(self._snap)
        finally:
            self._core.lock.release()

    def _finish(self) -> None:
        if self.done:
            raise TransactionError("this prepared batch was already committed or aborted")
        self.done = True


def prepare_batch(core: Core, txns: list[list[Op]]) -> Prepared:
    """Apply ``txns`` to the store in order (a batch of sets in one pass, ``commit.prepare_sets``;
    any other each in a savepoint of its own), one that fails undone alone and reported in
    ``results``; frame them, and return holding the commit lock."""
    core.lock.acquire()
    try:
        core.check_open()
        if core.info.role != "primary":
            raise NotPrimary(f"instance {core.name} is not a primary: it cannot prepare commits")
        snap = core.savepoint()
    except BaseException:
        core.lock.release()
        raise
    frames: list[tuple[int, bytes]] = []
    try:
        results = prepare_sets(core, txns, frames)
        if results is None:
            results = prepare_each(core, txns, frames)
    except BaseException:
        core.undo(snap)
        core.lock.release()
        raise
    return Prepared(core, snap, results, frames)
