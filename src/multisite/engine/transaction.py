"""Transactions: updates collected in a ``with`` block and committed atomically with one seqno.

``TransactionBase`` is the life of a transaction for the embedded engine and for a client of an
instance server alike: ``new`` → ``open`` (inside ``with``) → ``committing`` → ``committed`` or
``failed``; ``aborted`` when the block raised. A commit runs once: a second call, even from
another thread while the first runs, is refused, and so is one after a failure (a new
transaction, not this one, is what a caller retries with). Nested transactions are refused.
Subclasses say where updates go (``_send``) and where a thread's open transaction is kept.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import RegionNotFound, TransactionError
from ..journal.records import KILL, SET, ZKILL
from ..keys import check_key
from ..values import encode_value

_DONE = ("committing", "committed", "failed")  # a commit is refused in these states


class ThreadState(threading.local):
    """Per thread: the open transaction (a class default, so a thread that never set it reads None)."""

    tx: "TransactionBase | None" = None


class TransactionBase:
    def __init__(self, local: ThreadState):
        self.ops: list = []
        self.seqno = 0
        self._state = "new"
        self._local = local

    def __enter__(self):
        if self._local.tx is not None:
            raise TransactionError("nested transactions are not supported: commit the outer transaction first")
        self._opening()
        self._local.tx = self
        self._state = "open"
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._local.tx = None
        if exc_type is not None:
            self._state = "aborted"
            return
        self.commit()

    def commit(self) -> int:
        """Commit the updates once; the seqno (0 if nothing replicated was touched)."""
        if self._state in _DONE:
            raise TransactionError(f"transaction already {self._state}; start a new one with db.transaction()")
        self._state = "committing"
        try:
            if self.ops:
                self.seqno = self._send(self.ops)
        except BaseException:
            self._state = "failed"
            raise
        self._state = "committed"
        return self.seqno

    def _require_open(self) -> None:
        if self._state != "open":
            raise TransactionError(f"transaction is {self._state}; start a new one with db.transaction()")

    def _opening(self) -> None:
        """Checks before the transaction opens (the instance is still open)."""

    def _send(self, ops: list) -> int:
        raise NotImplementedError


class Transaction(TransactionBase):
    """``with db.transaction() as tx:`` on an embedded instance."""

    def __init__(self, db: Any):
        super().__init__(db._local)
        self.db = db
        self._regions = db._core.store.regions  # the store's own dict: current while the instance is open

    def _opening(self) -> None:
        self.db._core.check_open()

    def _send(self, ops: list) -> int:
        return self.db.commit_updates(ops)

    def _check(self, region: Any) -> None:
        self._require_open()
        if not isinstance(region, str):
            raise RegionNotFound(f"region must be a region name, got {region!r}")
        self.db._core.region(region)

    def set(self, region: str, key: tuple, value: Any) -> None:
        # The hot path of large transactions: the checks of _check, inlined for the common case.
        if self._state != "open" or region not in self._regions:
            self._check(region)
        self.ops.append((SET, region, check_key(key), encode_value(value)))

    def kill(self, region: str, key: tuple) -> None:
        self._check(region)
        self.ops.append((KILL, region, check_key(key), None))

    def zkill(self, region: str, key: tuple) -> None:
        self._check(region)
        self.ops.append((ZKILL, region, check_key(key), None))
