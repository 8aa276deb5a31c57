"""Cookie sessions of the CouchDB endpoints (``POST /_session`` -> ``AuthSession``): signing and
checking the cookie. Pure: the server passes in its secret and the time.

A document server's users are per database (each database directory's ``users.json``), while a
CouchDB session is the server's. So a session names the user and, for each served database whose
users accepted the password at login, a **tag** of that user's stored record (``user_tag``: a hash of
the name, role and Argon2 hash): a request with the cookie acts as that user in a database only where
the user's record still has that tag. A password changed, a role changed or the user removed there
ends the session in that database, and a database where another user of the same name has another
password never takes it. Argon2 runs once, at login; each request costs one HMAC.

The cookie's value is ``base64url(name ":" expiry in hex ":" tags joined by "," ":" mac)`` with
``mac = HMAC-SHA256(secret, name:expiry:tags)`` (CouchDB signs ``name:time`` with HMAC-SHA1 and the
user's salt; the shape differs, the use is the same). It expires ``timeout_s`` after it was made
(CouchDB's default, 600 s); the server gives a fresh one when a request comes in past half its life.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from .couch_errors import CouchError

COOKIE_NAME = "AuthSession"
DEFAULT_TIMEOUT_S = 600
MAX_TAGS = 64  # databases a session names (a cookie stays well under browsers' 4 KB)
MAX_COOKIE_CHARS = 4000
TAG_CHARS = 16
MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class Session:
    """A verified cookie: who, until when (s since the epoch), and the user records it holds for."""

    name: str
    expires_s: int
    tags: frozenset[str]

    def refresh_due(self, now_s: float, timeout_s: int) -> bool:
        """True once half the session's life has passed: the server then sends a fresh cookie."""
        return self.expires_s - now_s < timeout_s / 2


def user_tag(name: str, role: str, secret_hash: str | None) -> str:
    """The tag of a user's stored record: changes when its password or role does."""
    return hashlib.sha256(f"couch-session|{name}|{role}|{secret_hash}".encode()).hexdigest()[:TAG_CHARS]


def _mac(secret: bytes, msg: str) -> str:
    return hmac.new(secret, msg.encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, name: str, tags: list[str] | frozenset[str], now_s: float,
         timeout_s: int = DEFAULT_TIMEOUT_S) -> str:
    """The cookie value of a session of ``name`` made at ``now_s``."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"a session secret has at least {MIN_SECRET_BYTES} bytes")
    if ":" in name:
        raise CouchError(400, "bad_request", "a user name with ':' cannot hold a cookie session; use basic auth")
    tags = sorted(set(tags))[:MAX_TAGS]
    msg = f"{name}:{int(now_s) + int(timeout_s):x}:{','.join(tags)}"
    return base64.urlsafe_b64encode(f"{msg}:{_mac(secret, msg)}".encode()).decode().rstrip("=")


def verify(secret: bytes, cookie: str, now_s: float) -> Session | None:
    """The session ``cookie`` holds, or None when its signature is wrong or it has expired (the request
    then goes on as anonymous, as CouchDB's does); CouchError 400 when it is not a cookie of this shape."""
    if not isinstance(cookie, str) or len(cookie) > MAX_COOKIE_CHARS:
        raise _malformed()
    try:
        raw = base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _malformed() from None
    parts = raw.split(":")
    if len(parts) != 4 or not parts[0]:
        raise _malformed()
    name, exp, tags, mac = parts
    try:
        expires = int(exp, 16)
    except ValueError:
        raise _malformed() from None
    if not hmac.compare_digest(mac.encode(), _mac(secret, f"{name}:{exp}:{tags}").encode()):
        return None
    if expires <= now_s:
        return None
    return Session(name, expires, frozenset(t for t in tags.split(",") if t))


def _malformed() -> CouchError:
    return CouchError(400, "bad_request", "Malformed AuthSession cookie. Please clear your cookies.")


def set_cookie(value: str, timeout_s: int = DEFAULT_TIMEOUT_S, *, secure: bool = False) -> str:
    """The ``Set-Cookie`` header that gives a client the session ``value`` (or ends it: ``""``)."""
    age = timeout_s if value else 0
    return (f"{COOKIE_NAME}={value}; Version=1; Path=/; Max-Age={age}; HttpOnly; SameSite=Lax"
            + ("; Secure" if secure else ""))
