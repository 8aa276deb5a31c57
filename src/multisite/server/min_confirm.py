"""``--min-confirm N``: a commit's answer is held until N secondaries confirmed they hardened it.

Two halves, as mixins of the classes they belong to: the instance server counts what its sources'
secondaries confirmed (``ServerMinConfirm``, on the server's loop) and tells the client listener the
highest seqno N of them have; the listener (``ListenerMinConfirm``, on its own loop thread) answers
the commits waiting for it, and after ``timeout_s`` those still waiting with MIN_CONFIRM_TIMEOUT.
What waits and what is answered is decided by ``protocol.client.Gathering`` (sans-IO).
"""

from __future__ import annotations

import os
import time
from typing import Callable

from ..errors import ConfigError

MIN_CONFIRM_CHECK_S = 0.05  # how often answers held for --min-confirm are checked against their timeout
MIN_CONFIRM_TIMEOUT_S_DEFAULT = 5.0  # a commit waits this long for --min-confirm secondaries, then is refused


class ServerMinConfirm:
    """The instance server's part (``InstanceServer``): its sources, its client listener, its db."""

    async def ctl_min_confirm(self, n: int, timeout_s: float = MIN_CONFIRM_TIMEOUT_S_DEFAULT) -> dict:
        """Answer a commit only once ``n`` secondaries confirmed they hardened it (0: once hard here);
        a commit not confirmed within ``timeout_s`` is answered MIN_CONFIRM_TIMEOUT."""
        if type(n) is not int or n < 0:
            raise ConfigError(f"min-confirm: a number of secondaries, 0 or more, got {n!r}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < 3600):
            raise ConfigError(f"min-confirm: timeout_s must be a number of seconds above 0, got {timeout_s!r}")
        if self.clients is None:
            raise ConfigError("min-confirm needs the client port (server start --listen)")
        self.min_confirm, self.min_confirm_timeout_s = n, float(timeout_s)
        self.clients.set_min_confirm(n, float(timeout_s), self._confirm_why)
        self.source_confirmed()
        return {"pid": os.getpid(), "min_confirm": n, "timeout_s": timeout_s, "counting": self.confirming()}

    def confirming(self) -> dict[str, int]:
        """The secondaries that count for --min-confirm now (in a session) and what each confirmed."""
        # a copy taken at once (under the GIL): the client listener's thread calls this (_confirm_why)
        # while this server's loop adds and removes sources
        return {n: s.last_confirmed for n, s in list(self.sources.items()) if s.state in ("streaming", "xoff")}

    def source_confirmed(self) -> None:
        """A source's secondary confirmed more: the ``min_confirm``-th highest confirmation is what every
        waiting commit up to it may be answered for."""
        n = self.min_confirm
        if not n or self.clients is None:
            return
        marks = sorted(self.confirming().values(), reverse=True)
        if len(marks) >= n:  # never past what this instance has (a mark not yet lowered after a rollback)
            self.clients.confirmed(min(marks[n - 1], self.db.seqno))

    def _rolled_back(self, seqno: int) -> None:
        """The instance rolled back to ``seqno``: what its secondaries confirmed past it was of the
        history rolled back, and counts for --min-confirm no more (the seqnos are given again)."""
        for s in self.sources.values():
            s.last_confirmed = min(s.last_confirmed, seqno)
        if self.clients is not None:
            self.clients.rolled_back(seqno)

    def _confirm_why(self) -> str:
        c = self.confirming()
        return (f"{len(c)} of the {self.min_confirm} secondaries needed are connected"
                + (f" ({', '.join(f'{k} at {v}' for k, v in sorted(c.items()))})" if c else ""))


class ListenerMinConfirm:
    """The client listener's part (``ClientListener``): its loop, its Gathering, its log."""

    def set_min_confirm(self, n: int, timeout_s: float, why: Callable[[], str]) -> None:
        """Hold each commit's answer until ``n`` secondaries confirmed it (0: answer when hard here); one
        still unconfirmed after ``timeout_s`` is answered MIN_CONFIRM_TIMEOUT naming ``why()``.
        Thread-safe."""
        def apply() -> None:
            first = not self._gathering.min_confirm and n
            self._gathering.min_confirm, self.min_confirm_timeout_s, self._confirm_why = n, timeout_s, why
            if not n:
                self._answered(self._gathering.min_confirm_off(), None)
            elif first:
                self._loop.call_later(MIN_CONFIRM_CHECK_S, self._expire_unconfirmed)
        self._loop.call_soon_threadsafe(apply)

    def confirmed(self, seqno: int) -> None:
        """Enough secondaries have hardened every seqno up to ``seqno`` (from the sources' thread)."""
        if seqno > self._gathering.confirmed_seqno:
            self._loop.call_soon_threadsafe(self._on_confirmed, seqno)

    def _on_confirmed(self, seqno: int) -> None:
        self._answered(self._gathering.confirmed(seqno), None)

    def rolled_back(self, seqno: int) -> None:
        """The instance rolled back to ``seqno`` (a rollback listener: from the thread that rolled
        back): confirmations past it no longer count (``Gathering.rolled_back``)."""
        self._loop.call_soon_threadsafe(self._on_rolled_back, seqno)

    def _on_rolled_back(self, seqno: int) -> None:
        self._answered(self._gathering.rolled_back(seqno), None)

    def _expire_unconfirmed(self) -> None:
        if not self._gathering.min_confirm:
            return
        try:
            if self._gathering.waiting_confirm:
                late = self._gathering.expire(time.monotonic(), self.min_confirm_timeout_s, self._confirm_why())
                if late:
                    self._log.warning("%d commits not confirmed by %d secondaries within %g s: %s", len(late),
                                      self._gathering.min_confirm, self.min_confirm_timeout_s,
                                      self._confirm_why())
                    self._answered(late, None)
        finally:  # always: a failed check must not end the timer, or waiting commits are never answered
            self._loop.call_later(MIN_CONFIRM_CHECK_S, self._expire_unconfirmed)
