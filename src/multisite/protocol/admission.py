"""Which connections the client port takes before they log in, sans-IO: the connection slots.

Why. A connection that has not logged in costs nothing to open and, before this, held one of the
listener's 256 slots for up to 30 s: a few hundred idle sockets from one host kept every client out.
Now each connection asks ``AdmissionGate.admit`` when it is accepted, before its TLS handshake or any
byte of it is read, and is *waiting* until it logs in (a hello accepted, or a TLS certificate naming a
user; at once on a server without users). The limits (``AdmissionPolicy``):

- ``connections_max``: every connection, logged in or waiting;
- ``unauthenticated_total_max``: waiting connections, well below ``connections_max``, so clients that
  logged in always have room;
- ``unauthenticated_per_address_max``: waiting connections from one address (``auth.pacing_key``: an
  IPv6 client by its /64), so that one host cannot take the waiting slots;
- ``login_deadline_s``: a waiting connection is closed this long after it was accepted (the TLS
  handshake and the hello both fit in it; a hello verifies in tens of milliseconds).

When the waiting connections are at ``unauthenticated_total_max``, a newcomer from an address holding
at least two fewer waiting connections than the address holding the most takes the oldest slot of
that address (it is *evicted*, closed): whoever fills the total from a few addresses cannot keep out a
client from another. Only as many addresses as there are waiting slots can (each one
``login_deadline_s`` at a time), which the pacing of failed logins and the deadline then bound.

The caller (``server.clients``, on its event loop) passes the time (``now``, a monotonic clock's
seconds) and opaque, hashable tokens for its connections; it closes what the decisions name and
reports back what happened to each waiting connection: ``logged_in``, ``closed``, ``timed_out``.
Nothing here touches a socket, a clock or a thread; the counts are what ``status`` and ``/metrics``
show.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Hashable

from ..errors import ConfigError, TooManyConnections
from .auth import pacing_key

#: Why a connection was refused at accept: the ``reason`` label of ``multisite_client_logins_refused_total``.
REFUSED_REASONS = ("connections", "unauthenticated_total", "per_address")


@dataclass(frozen=True)
class AdmissionPolicy:
    connections_max: int = 256                # client connections at once, logged in or not
    unauthenticated_total_max: int = 128      # connections at once that have not logged in
    unauthenticated_per_address_max: int = 16  # of those, from one address (an IPv6 /64)
    login_deadline_s: float = 5.0             # from accept to logged in (TLS handshake and hello)

    def __post_init__(self) -> None:
        if not 1 <= self.unauthenticated_per_address_max <= self.unauthenticated_total_max < self.connections_max:
            raise ConfigError(f"client admission limits: need 1 <= unauthenticated_per_address_max "
                              f"({self.unauthenticated_per_address_max}) <= unauthenticated_total_max "
                              f"({self.unauthenticated_total_max}) < connections_max ({self.connections_max})")
        if not self.login_deadline_s > 0:
            raise ConfigError(f"client admission: login_deadline_s must be positive, got {self.login_deadline_s}")

    def to_dict(self) -> dict:
        return {"connections_max": self.connections_max, "unauthenticated_total_max": self.unauthenticated_total_max,
                "unauthenticated_per_address_max": self.unauthenticated_per_address_max,
                "login_deadline_s": self.login_deadline_s}


@dataclass(frozen=True)
class Admission:
    """The decision for one accepted connection. ``error`` set: refused (close it; ``reason`` is one of
    ``REFUSED_REASONS``). Otherwise it waits until ``deadline``; ``evict`` names a waiting connection
    to close to make room for it (or None)."""
    error: TooManyConnections | None = None
    reason: str | None = None
    deadline: float = 0.0
    evict: Hashable | None = None

    @property
    def admitted(self) -> bool:
        return self.error is None


class AdmissionGate:
    """The client port's connection slots (see the module doc). One per listener; not thread-safe."""

    def __init__(self, policy: AdmissionPolicy = AdmissionPolicy()):
        self.policy = policy
        # token -> (address key, deadline); insertion order is deadline order (one deadline, a clock
        # that does not go back), so the due ones are at the front
        self._waiting: dict[Hashable, tuple[str, float]] = {}
        self._by_key: dict[str, dict[Hashable, None]] = {}  # address key -> its waiting tokens, oldest first
        self.refused = dict.fromkeys(REFUSED_REASONS, 0)
        self.evicted = 0
        self.timeouts = 0  # waiting connections closed at their deadline
        self.logins = 0  # waiting connections that logged in

    @property
    def waiting(self) -> int:
        """Connections accepted and not yet logged in."""
        return len(self._waiting)

    def waiting_from(self, address: str) -> int:
        return len(self._by_key.get(pacing_key(address), ()))

    def admit(self, token: Hashable, address: str, now: float, connections: int) -> Admission:
        """A connection from ``address`` (its host) was accepted; ``connections`` are open besides it."""
        p = self.policy
        key = pacing_key(address)
        mine = len(self._by_key.get(key, ()))
        if connections >= p.connections_max:
            return self._refuse("connections", f"the instance server has {connections} client connections "
                                f"open, its limit; retry later")
        if mine >= p.unauthenticated_per_address_max:
            return self._refuse("per_address", f"{address} has {mine} connections that have not logged in, the "
                                f"most one address may hold; log in on those or close them, then retry")
        evict = None
        if len(self._waiting) >= p.unauthenticated_total_max:
            evict = self._victim(mine)
            if evict is None:
                return self._refuse("unauthenticated_total", f"{len(self._waiting)} connections are waiting to "
                                    f"log in, the most the instance server takes at once; retry in "
                                    f"{p.login_deadline_s:g} s")
            self._release(evict)
            self.evicted += 1
        deadline = now + p.login_deadline_s
        self._waiting[token] = (key, deadline)
        self._by_key.setdefault(key, {})[token] = None
        return Admission(deadline=deadline, evict=evict)

    def _refuse(self, reason: str, message: str) -> Admission:
        self.refused[reason] += 1
        return Admission(error=TooManyConnections(message), reason=reason)

    def _victim(self, newcomer_holds: int) -> Hashable | None:
        """The oldest waiting connection of the address holding the most, if that is at least two more
        than the newcomer's address holds (after the swap neither holds more than the other did)."""
        tokens = max(self._by_key.values(), key=len)
        return next(iter(tokens)) if len(tokens) >= newcomer_holds + 2 else None

    def _release(self, token: Hashable) -> bool:
        entry = self._waiting.pop(token, None)
        if entry is None:
            return False
        tokens = self._by_key[entry[0]]
        del tokens[token]
        if not tokens:
            del self._by_key[entry[0]]
        return True

    def logged_in(self, token: Hashable) -> None:
        """``token`` logged in: its waiting slot is free (a token no longer waiting is ignored)."""
        if self._release(token):
            self.logins += 1

    def closed(self, token: Hashable) -> None:
        """``token``'s connection closed (by either side)."""
        self._release(token)

    def due(self, now: float) -> list[Hashable]:
        """Waiting connections past their deadline, oldest first; the caller closes each and reports it
        with ``timed_out`` (or ``logged_in``, if it logged in meanwhile)."""
        out = []
        for token, (_, deadline) in self._waiting.items():
            if deadline > now:
                break
            out.append(token)
        return out

    def timed_out(self, token: Hashable) -> None:
        if self._release(token):
            self.timeouts += 1

    def next_deadline(self) -> float | None:
        """When the oldest waiting connection is due (None: none waits)."""
        return next(iter(self._waiting.values()))[1] if self._waiting else None

    def status(self) -> dict:
        """Counts since the server started (safe to read from another thread: plain numbers)."""
        return {"waiting": len(self._waiting), "logins": self.logins, "refused": dict(self.refused),
                "evicted": self.evicted, "timeouts": self.timeouts, "limits": self.policy.to_dict()}
