"""Client authentication on the client protocol, sans-IO: who a connection is and what it may do.

How it works. A server with users (``instance.users``) requires every connection to authenticate,
one without users on the loopback does not (as before); one without users listening elsewhere is
refused at start unless ``--insecure`` (``check_listen``). A connection authenticates in one of two
ways:

- its TLS client certificate, verified by the server's CA, has a common name that is a user's name:
  the connection is that user from its first byte;
- its first request is ``[id, "hello", {"user": U, "password": P}]`` (a token is a password): the
  answer is ``{"user": U, "role": R, "by": "password"}``. Without ``password``, hello asks to be the
  user the certificate names (a user without a password can only authenticate that way); without
  ``user`` either, to be whoever it names (a client with a certificate says hello to learn who it is
  and to meet a refusal of its certificate at connect time, not at its first request).

A refused hello answers AUTHENTICATION_FAILED and the server closes the connection (state REFUSED is
sticky). Every other request passes ``ConnectionAuth.admit``: before authentication it answers
AUTHENTICATION_REQUIRED (except ``PUBLIC_OPS``), after it the user's role must allow the op
(``RIGHTS``; an op not in the table needs admin, so an op added later is closed until it is listed).

Failed attempts are paced per client address (``Pacer``; an IPv6 client by its /64, ``pacing_key``):
a few are answered at once, then each further one waits twice as long as the last, up to
``max_delay_s``; an attempt inside the wait is
refused (AUTHENTICATION_PACED, naming the wait) without its password being looked at, so guessing
costs time however fast the guesser reconnects. A success does not clear the count (one account
someone holds would otherwise reset it between guesses at another); ``forget_after_s`` of quiet does.

Sans-IO: the caller passes the time (``now``, seconds of a monotonic clock) and the user table, whose
``verify`` does the hashing; nothing here touches a socket, a clock or a thread. The ``Pacer`` is
shared by all connections: the caller serialises calls into it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import (AuthenticationFailed, AuthenticationPaced, AuthenticationRequired, ConfigError,
                      PermissionDenied)

# Role -> rank; a role may do what its rank and every lower one may (instance.users.ROLES names the same).
ROLE_RANK = {"read-only": 0, "read-write": 1, "admin": 2}
#: The role an op needs. ``hello`` is handled here; ops missing from the table need ``admin``.
RIGHTS = {
    "hello": "read-only",
    "get": "read-only", "items": "read-only", "info": "read-only", "history": "read-only",
    "regions": "read-only",
    "commit": "read-write", "create_region": "read-write",
    "stop": "admin", "rollback": "admin",
}
#: Answered before authentication: ``rollback --fetchresync HOST:PORT`` asks a primary for its history
#: through the client port. It shows the instance's name, group, role, seqno and history records, no data.
PUBLIC_OPS = frozenset({"history"})
MAX_HELLO_FIELD_CHARS = 1024


def required_role(op: str) -> str:
    return RIGHTS.get(op, "admin")


def allows(role: str, op: str) -> bool:
    return ROLE_RANK.get(role, -1) >= ROLE_RANK[required_role(op)]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; any other name counts as not (it may resolve
    elsewhere, or later), as do the wildcard addresses ("", 0.0.0.0, ::)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def pacing_key(host: str) -> str:
    """What failed attempts are counted by: an IPv4 address; for IPv6 its /64 network, since one
    host commonly holds a whole /64 and would otherwise get fresh free attempts from each address."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host  # a name (a Unix socket's path, say): as given
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


def check_listen(host: str, users: int, insecure: bool) -> None:
    """A client port reachable from other hosts must authenticate its clients: ConfigError if ``host``
    is not a loopback address, the instance has no users and ``--insecure`` was not given."""
    if users or insecure or is_loopback(host):
        return
    raise ConfigError(f"--listen {host or '*'} accepts clients from other hosts, and the instance has no users "
                      f"to authenticate them: add one (multisite user add DIR NAME --role ROLE), listen on "
                      f"127.0.0.1, or pass --insecure to let anyone who reaches the port read, write and stop it")


@dataclass(frozen=True)
class PacingPolicy:
    free_failures: int = 3          # failures from one address answered at once
    first_delay_s: float = 1.0      # the wait after the first failure past those; doubles each failure
    max_delay_s: float = 300.0      # the longest wait (a lockout of 5 minutes per further failure)
    forget_after_s: float = 3600.0  # an address without a failure this long starts again from zero
    max_addresses: int = 65_536     # addresses remembered at once; the longest quiet are forgotten first

    def delay_s(self, failures: int) -> float:
        past = failures - self.free_failures
        return 0.0 if past <= 0 else min(self.max_delay_s, self.first_delay_s * 2.0 ** min(past - 1, 64))


class Pacer:
    """Failed authentications per client address (the host, not the port), and how long it must wait."""

    def __init__(self, policy: PacingPolicy = PacingPolicy()):
        self.policy = policy
        self._seen: dict[str, tuple[int, float]] = {}  # address -> (failures, time of the last); oldest first

    def _entry(self, address: str, now: float) -> tuple[int, float]:
        count, last = self._seen.get(address, (0, now))
        if count and now - last >= self.policy.forget_after_s:
            del self._seen[address]
            return 0, now
        return count, last

    def failures(self, address: str, now: float) -> int:
        return self._entry(address, now)[0]

    def wait_s(self, address: str, now: float) -> float:
        """Seconds before ``address`` may try again (0: now)."""
        count, last = self._entry(address, now)
        delay = self.policy.delay_s(count)
        return max(0.0, min(delay, last + delay - now))  # min: a clock that went back, float rounding

    def failed(self, address: str, now: float) -> float:
        """Count a failure of ``address``; the wait it now has."""
        count, _ = self._entry(address, now)
        self._seen.pop(address, None)  # re-inserted last: the dict's order is by last failure
        self._seen[address] = (count + 1, now)
        while len(self._seen) > self.policy.max_addresses:
            del self._seen[next(iter(self._seen))]
        return self.policy.delay_s(count + 1)

    def __len__(self) -> int:
        return len(self._seen)


class UserLike(Protocol):
    name: str
    role: str
    secret: str | None


class Users(Protocol):
    """What ``instance.users.UserTable`` offers (protocol may not import it)."""

    def __len__(self) -> int: ...
    def get(self, name: str) -> UserLike | None: ...
    def verify(self, name: str, secret: str) -> UserLike | None: ...


AWAIT_HELLO, AUTHENTICATED, REFUSED = "await-hello", "authenticated", "refused"
_TRANSITIONS = {AWAIT_HELLO: {AUTHENTICATED, REFUSED}, AUTHENTICATED: {AUTHENTICATED, REFUSED}, REFUSED: set()}


class ConnectionAuth:
    """One connection's authentication. Create it when the connection opens (after a TLS handshake,
    with the certificate's common name), then pass every request through ``admit``.

    ``events`` collects what the server should log (a success, a refusal and why, with the address);
    the caller takes them with ``take_events``."""

    def __init__(self, users: Users, pacer: Pacer, address: str, *, required: bool,
                 cert_name: str | None = None, peer: str | None = None):
        self.users = users
        self.pacer = pacer
        self.address = address  # the client's host
        self.pacing_key = pacing_key(address)
        self.peer = peer or address  # host:port, for the log
        self.required = required
        self.cert_name = cert_name
        self.state = AWAIT_HELLO
        self.user: str | None = None
        self.role: str | None = None
        self.by: str | None = None
        self._events: list[str] = []
        self._who: UserLike | None = None  # the user as authenticated (its secret's hash: a change revokes)
        self._refused_because = f"the connection from {address} was refused; connect again"
        if not required:
            self._enter(AUTHENTICATED, None, "admin", "open")
        elif cert_name is not None and (u := users.get(cert_name)) is not None:
            self._enter(AUTHENTICATED, u.name, u.role, "certificate")
            self._who = u
            self._events.append(f"client {self.peer} authenticated as {u.name!r} (role {u.role}) by certificate")

    def _enter(self, state: str, user: str | None, role: str | None, by: str | None) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise AuthenticationFailed(f"connection from {self.address} was refused; connect again")
        self.state, self.user, self.role, self.by = state, user, role, by

    @property
    def must_close(self) -> bool:
        """True once refused: the server answers the request and then closes the connection."""
        return self.state == REFUSED

    def take_events(self) -> list[str]:
        ev, self._events = self._events, []
        return ev

    def admit(self, op: str, args: Any, now: float) -> dict | None:
        """None: the request goes on to the server's op. A dict: the answer to ``hello``. Raises
        AuthenticationFailed (and its kinds) or PermissionDenied, which the server sends as the answer."""
        if op == "hello":
            return self._hello(args, now)
        if self.state == REFUSED:
            raise AuthenticationFailed(self._refused_because)
        if self.state == AWAIT_HELLO:
            if op in PUBLIC_OPS:
                return None
            raise AuthenticationRequired(
                f"this instance server requires authentication: connect with user= and password= (or a "
                f"TLS client certificate whose common name is a user) before {op!r:.40}")
        if not allows(self.role or "", op):
            self._events.append(f"client {self.peer} as {self.user!r} (role {self.role}) denied {op!r:.40}")
            raise PermissionDenied(f"user {self.user!r} has the {self.role} role; {op!r:.40} needs "
                                   f"{required_role(op)} (multisite user add sets a user's role)")
        return None

    def _hello(self, args: Any, now: float) -> dict:
        if self.state == REFUSED:
            raise AuthenticationFailed(f"the connection from {self.address} was refused; connect again")
        if not self.required:
            return {"user": self.user, "role": self.role, "by": self.by}
        user, secret = _hello_fields(args)
        found = self._by_certificate(user) if secret is None else self._by_password(user, secret, now)
        self._enter(AUTHENTICATED, found.name, found.role, "password" if secret is not None else "certificate")
        self._who = found
        self._events.append(f"client {self.peer} authenticated as {found.name!r} (role {found.role}) by {self.by}")
        return {"user": self.user, "role": self.role, "by": self.by}

    def refresh(self, users: Users) -> None:
        """The users changed (``multisite user add --replace|remove``): an authenticated session whose user
        is gone, or whose password or token changed, is refused at its next request (and closed); one
        whose role changed goes on with the new role."""
        self.users = users
        if self.state == AUTHENTICATED and self.by == "open" and len(users):  # authentication is on now
            self._refused_because = "this instance server now has users: connect again and authenticate"
            self._refuse("users were added, open session ended", AuthenticationFailed(""))
            return
        if self.state != AUTHENTICATED or self._who is None:
            return
        now = users.get(self._who.name)
        if now is None or (self.by == "password" and now.secret != self._who.secret):
            what = "was removed" if now is None else "has a new password or token"
            self._refused_because = f"user {self._who.name!r} {what}: authenticate again"
            self._refuse(f"user {self._who.name!r} {what}, session ended", AuthenticationFailed(""))
        elif now.role != self.role:
            self._events.append(f"client {self.peer} as {now.name!r}: role now {now.role} (was {self.role})")
            self.role, self._who = now.role, now

    def _refuse(self, why: str, error: AuthenticationFailed) -> AuthenticationFailed:
        self._enter(REFUSED, None, None, None)
        self._events.append(f"client {self.peer} refused: {why}")
        return error

    def _by_certificate(self, user: str | None) -> UserLike:
        """hello without a password: be the user the TLS client certificate names. Nothing is guessed
        here (the certificate was verified in the handshake), so nothing is paced."""
        name = self.cert_name
        found = self.users.get(name) if name is not None and user in (None, name) else None
        if found is not None:
            return found
        if name is None:
            raise self._refuse(f"hello as {user!r:.60} without a password and without a client certificate",
                               AuthenticationFailed(
                                   f"no client certificate on this connection: a user without a password "
                                   f"authenticates with a TLS client certificate whose common name is its name "
                                   f"(connect with tls_ca=, tls_cert= and tls_key=)"))
        if user not in (None, name):
            raise self._refuse(f"hello as {user!r:.60} with a certificate naming {name!r:.60}",
                               AuthenticationFailed(f"this connection's client certificate names {name!r:.60}, "
                                                    f"not {user!r:.60}; give that user's password"))
        raise self._refuse(f"the certificate's name {name!r:.60} is no user",
                           AuthenticationFailed(f"the client certificate's common name {name!r:.60} is not a user "
                                                f"of this instance server (multisite user add DIR NAME --cert-only)"))

    def _by_password(self, user: str | None, secret: str, now: float) -> UserLike:
        wait = self.pacer.wait_s(self.pacing_key, now)
        if wait > 0:  # refused unseen: a guess inside the wait costs the guesser, not the server
            raise self._refuse(f"authentication as {user!r:.60} paced ({self.pacer.failures(self.pacing_key, now)} "
                               f"failures from this address, {wait:.1f} s to wait)",
                               AuthenticationPaced(f"too many failed authentications from {self.address}: try "
                                                   f"again in {wait:.1f} s", retry_after_s=wait))
        found = self.users.verify(user or "", secret)
        if found is not None:
            return found
        known = self.users.get(user or "")
        why = "unknown user" if known is None else "user with a certificate only" if not known.secret else \
            "wrong password"
        delay = self.pacer.failed(self.pacing_key, now)
        raise self._refuse(f"{why} for {user!r:.60} ({self.pacer.failures(self.pacing_key, now)} failures from this "
                           f"address" + (f", next attempt in {delay:.1f} s)" if delay else ")"),
                           AuthenticationFailed(f"authentication as {user!r:.60} failed: wrong user or password"))


def _hello_fields(args: Any) -> tuple[str | None, str | None]:
    if not isinstance(args, dict):
        raise ConfigError(f"hello takes {{'user': NAME, 'password': SECRET}}, got {args!r:.60}")
    user, secret = args.get("user"), args.get("password")
    if user is None and secret is None:
        return None, None  # the user the client certificate names
    if not isinstance(user, str) or not 0 < len(user) <= MAX_HELLO_FIELD_CHARS:
        raise ConfigError(f"hello: user must be a non-empty string, got {user!r:.60}")
    if secret is not None and (not isinstance(secret, str) or len(secret) > MAX_HELLO_FIELD_CHARS):
        raise ConfigError(f"hello: password must be a string of at most {MAX_HELLO_FIELD_CHARS} characters")
    return user, secret
