"""The users of an instance server's client port: names, roles and hashed secrets, in ``users.json``.

    <instance>/users.json   {"format": 1, "users": {"alice": {"role": "read-write", "secret": "$argon2id$…"},
                                                   "app":   {"role": "read-only",  "secret": null}}}

A secret (a password or a token) is kept only as an Argon2id hash (argon2-cffi; docs/decisions.md says
why); a user whose secret is null authenticates by TLS client certificate only, the certificate's
common name being the user's name. The file is replaced crash-safely (``fsutil.atomic_write``), mode
0600, under a lock on the instance directory so that two ``multisite user`` commands do not lose one
another's change. The server re-reads it when it changes (``UserFile.current``): ``user add|remove``
takes effect on the next connection, without a restart. No users means no authentication (on the
loopback only: ``protocol.auth.check_listen``).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from ..errors import ConfigError, InstanceFileCorrupt
from ..fsutil import atomic_write
from .layout import Layout

USERS_FILE = "users.json"
FORMAT = 1
#: Lowest first; ``protocol.auth.RIGHTS`` says what each may do (a test checks the two name the same roles).
ROLES = ("read-only", "read-write", "admin")
MIN_SECRET_CHARS = 8
MAX_SECRET_CHARS = 1024
MAX_NAME_CHARS = 128
# OWASP's Argon2id setting (19 MiB, 2 passes, 1 lane): about 20-40 ms a verification here, so a
# server verifying a few at once neither stalls nor runs out of memory (the library's default takes
# 64 MiB each); each hash records its parameters, so these can rise later without breaking old ones.
_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
_dummy_lock = threading.Lock()
_dummy_hash: str | None = None


@dataclass(frozen=True)
class User:
    name: str
    role: str
    secret: str | None  # an Argon2id hash; None: by client certificate only

    @property
    def by(self) -> str:
        return "password" if self.secret else "certificate"


def check_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or name != name.strip() \
            or not name.isprintable():
        raise ConfigError(f"a user name is 1 to {MAX_NAME_CHARS} printable characters without leading or "
                          f"trailing spaces (a certificate's common name), got {name!r:.60}")
    return name


def check_role(role: object) -> str:
    if role not in ROLES:
        raise ConfigError(f"--role takes one of {', '.join(ROLES)}, got {role!r:.40}")
    return role  # type: ignore[return-value]


def hash_secret(secret: str) -> str:
    if not isinstance(secret, str) or not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        raise ConfigError(f"a password or token has {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters, "
                          f"got {len(secret) if isinstance(secret, str) else type(secret).__name__}")
    return _hasher.hash(secret)


def _dummy() -> str:
    global _dummy_hash
    with _dummy_lock:
        if _dummy_hash is None:
            _dummy_hash = _hasher.hash("not a password of anyone")
        return _dummy_hash


class UserTable:
    """The users as read from the file at one moment; immutable, safe to share between threads."""

    def __init__(self, users: dict[str, User]):
        self._users = dict(users)

    def __len__(self) -> int:
        return len(self._users)

    def __iter__(self) -> Iterator[User]:
        return iter(sorted(self._users.values(), key=lambda u: u.name))

    def get(self, name: str) -> User | None:
        return self._users.get(name) if isinstance(name, str) else None

    def verify(self, name: str, secret: str) -> User | None:
        """The user if ``secret`` is theirs; None otherwise. An unknown user or one without a secret
        costs one hash verification as well, so the time taken does not tell which names exist."""
        user = self.get(name)
        stored = user.secret if user is not None and user.secret else None
        if not isinstance(secret, str) or len(secret) > MAX_SECRET_CHARS:
            return None
        try:
            ok = _hasher.verify(stored or _dummy(), secret)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        return user if ok and stored else None


def users_path(root: str | os.PathLike) -> Path:
    return Path(root) / USERS_FILE


def load_users(root: str | os.PathLike) -> UserTable:
    """The users of the instance at ``root``; none if it has no users file."""
    path = users_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return UserTable({})
    except OSError as e:  # EACCES (written by another user), EISDIR, EIO: named, as a damaged file is
        raise InstanceFileCorrupt(f"the users file {path} cannot be read: {e.strerror or e}; the server must be "
                                  f"able to read it (its owner and mode 0600)") from None
    return _parse(raw, path)


def _parse(raw: bytes, path: Path) -> UserTable:
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT or not isinstance(doc.get("users"), dict):
            raise ValueError(f"expected format {FORMAT} with a 'users' object")
        users = {}
        for name, u in doc["users"].items():
            secret = u.get("secret")
            if secret is not None and not (isinstance(secret, str) and secret.startswith("$argon2id$")):
                raise ValueError(f"user {name!r}: the secret is not an Argon2id hash")
            users[name] = User(check_name(name), check_role(u.get("role")), secret)
    except (ValueError, AttributeError, TypeError) as e:  # ConfigError is a ValueError too
        raise InstanceFileCorrupt(f"the users file {path} cannot be read: {e}; fix it, or remove it and add "
                                  f"the users again with `multisite user add`") from None
    return UserTable(users)


class _Locked:
    """An exclusive flock on the instance directory itself, held while the users file is changed."""

    def __init__(self, root: Path):
        self._fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)

    def __enter__(self) -> "_Locked":
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # releases the lock


def _write(root: Path, table: UserTable) -> None:
    doc = {"format": FORMAT, "users": {u.name: {"role": u.role, "secret": u.secret} for u in table}}
    path = users_path(root)
    atomic_write(path, (json.dumps(doc, indent=1) + "\n").encode(), mode=0o600)
    os.chmod(path, 0o600)  # hashes only, but no one else's business (and offline guessing costs nothing to try)


def _home(root: str | os.PathLike, instance: bool) -> Path:
    """Where the users file lives: an instance's directory, or (``instance`` False: a grid's users, issue
    24) any directory, made if missing."""
    if instance:
        return Layout.existing(root).root
    path = Path(root).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path


def add_user(root: str | os.PathLike, name: str, role: str, secret: str | None, *, replace: bool = False,
             instance: bool = True) -> User:
    """Add user ``name`` with ``role``; ``secret`` None: the user authenticates by client certificate only.
    ``replace``: an existing user of that name gets the new role and secret in one step (a password or
    token changed without a moment in which the user does not exist). ``instance`` False: ``root`` is
    any directory (a grid's users), not an instance."""
    lay = Layout(_home(root, instance))
    check_name(name)
    check_role(role)
    hashed = hash_secret(secret) if secret is not None else None
    with _Locked(lay.root):
        table = load_users(lay.root)
        if table.get(name) is not None and not replace:
            raise ConfigError(f"user {name!r} already exists on {lay.root}; give --replace to change its role or "
                              f"secret")
        user = User(name, role, hashed)
        _write(lay.root, UserTable({**{u.name: u for u in table}, name: user}))
    return user


def remove_user(root: str | os.PathLike, name: str, *, instance: bool = True) -> User:
    lay = Layout(_home(root, instance))
    with _Locked(lay.root):
        table = load_users(lay.root)
        user = table.get(name)
        if user is None:
            raise ConfigError(f"no user {name!r} on {lay.root}; `multisite user list {lay.root}` shows them")
        _write(lay.root, UserTable({u.name: u for u in table if u.name != name}))
    return user


def list_users(root: str | os.PathLike, *, instance: bool = True) -> list[User]:
    return list(load_users(_home(root, instance)))


class UserFile:
    """The users file of a running server: ``current()`` re-reads it when it has changed (a stat a call),
    so users added or removed apply to the next connection. A file that turns unreadable keeps the last
    good table in force and raises once per change (the server logs it)."""

    def __init__(self, root: str | os.PathLike):
        self.path = users_path(root)
        self._root = Path(root)
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._table = UserTable({})
        self.current()

    def _stat(self) -> tuple | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> UserTable:
        stamp = self._stat()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp  # first: a bad file raises once, not on every connection
                self._table = load_users(self._root)
            return self._table
