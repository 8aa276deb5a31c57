"""Recording a history from real clients: each call's invocation and outcome, from any thread.

    rec = Recorder()
    op = rec.invoke("w1", WRITE, key, value)
    try:
        client.put(key, value)
    except Refused:
        rec.fail(op)
    except OutcomeUnknown:
        rec.unknown(op)
    else:
        rec.ok(op)
    ...
    check(rec.history(), final)

The clock is a parameter (the machine's monotonic clock by default) so that a test can hand-make one.
An operation still pending when ``history()`` is taken (its thread died or still runs) is ``unknown``
and never completed: it may take effect at any time after its invocation.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable

from .model import FAIL, OK, UNKNOWN, Op

PENDING = "pending"


class Recorder:
    """Operations in the order they were invoked; safe to share between client threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[list] = []  # [client, kind, key, value, outcome, invoke_t, complete_t]

    def invoke(self, client: str, kind: str, key: Hashable, value: Hashable = None) -> int:
        """Record a call about to be made; its handle for the outcome."""
        t = self._clock()
        with self._lock:
            self._ops.append([client, kind, key, value, PENDING, t, None])
            return len(self._ops) - 1

    def _complete(self, handle: int, outcome: str, value: Hashable = None, *, read: bool = False) -> None:
        t = self._clock()
        with self._lock:
            op = self._ops[handle]
            if op[4] != PENDING:
                raise ValueError(f"operation {handle} already completed as {op[4]}")
            op[4], op[6] = outcome, t
            if read:
                op[3] = value

    def ok(self, handle: int, read_value: Hashable = None, *, read: bool = False) -> None:
        """Acknowledged; for a read (``read=True``), what it returned (None: absent)."""
        self._complete(handle, OK, read_value, read=read)

    def fail(self, handle: int) -> None:
        """Definitely not done: refused, or never sent."""
        self._complete(handle, FAIL)

    def unknown(self, handle: int) -> None:
        """Sent, no answer: it may have taken effect."""
        self._complete(handle, UNKNOWN)

    def history(self) -> list[Op]:
        """Every operation so far (pending ones as unknown, never completed)."""
        with self._lock:
            rows = [list(r) for r in self._ops]
        out = []
        for client, kind, key, value, outcome, t0, t1 in rows:
            if outcome == PENDING:
                out.append(Op(client, kind, key, value, UNKNOWN, t0))
            else:
                out.append(Op(client, kind, key, value, outcome, t0, t1))
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)
