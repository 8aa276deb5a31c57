"""Transports: how a message gets from one Message Agent to another, store-and-forward.

Every agent reads its messages from one **inbox folder** (``Inbox``): the file transport's senders
write into it directly (a shared folder, a USB stick, an rsync target); the http and broker transports
(``net/delivery_*.py``) have a process that takes messages off the wire and writes them into it. So
the receiving side is one code path, and a message waits there, on disk, for as long as it must.

Sending goes through an ``Outbox`` chosen by the recipient's address: a plain path (or ``file:PATH``)
is that recipient's inbox folder; other schemes are registered by the layers that own sockets
(``register_scheme``). An outbox's ``send`` returns once the message is durable at the recipient or in
a local queue that retries it; failing that it raises, and the sender's ``log_sent`` does not move.

File names (the seed's form): ``SENDER(gen-prev-last-seq).msg``; control messages (confirmations,
resend requests, probes) add a unique tail so that a later one never overwrites an earlier one.
Files are written atomically (temp file, fsync, rename, fsync of the folder); readers skip dot-files
(a write in progress). A message that cannot be read is moved to ``rejected/`` with the reason beside
it, never deleted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Protocol

from ...errors import DeliveryConfigError
from ...fsutil import atomic_write, fsync_dir, make_dir
from ..message import Message

SUFFIX = ".msg"
REJECTED = "rejected"


def file_name(msg: Message) -> str:
    tail = "" if msg.is_data else f"-c{time.time_ns()}"
    return f"{msg.sender}{msg.name}{tail}{SUFFIX}"


class Outbox(Protocol):
    def send(self, name: str, data: bytes) -> None: ...

    # optional: ``retry() -> int`` delivers what waits in the outbox's spool (the agent calls it each poll)

    def close(self) -> None: ...


class FileOutbox:
    """Writes messages into the recipient's inbox folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def send(self, name: str, data: bytes) -> None:
        make_dir(self.folder)
        atomic_write(self.folder / name, data)

    def close(self) -> None:
        pass


class Inbox:
    """This agent's inbox folder: what arrived, oldest name first."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def list(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir()
                      if p.is_file() and p.suffix == SUFFIX and not p.name.startswith("."))

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def reject(self, path: Path, reason: str) -> Path:
        """Move an unreadable message aside (``rejected/``), with a ``.why`` file saying why."""
        dest = self.folder / REJECTED
        make_dir(dest)
        target = dest / path.name
        try:
            atomic_write(dest / (path.name + ".why"), (reason + "\n").encode())
        except OSError:
            pass  # a full disk: the move below still keeps the message out of the way
        os.replace(path, target)
        fsync_dir(self.folder)
        return target


_SCHEMES: dict[str, Callable[[str, Path], Outbox]] = {}


def register_scheme(scheme: str, factory: Callable[[str, Path], Outbox]) -> None:
    """Make addresses ``scheme://...`` go through ``factory(address, spool)`` (called by ``net``);
    ``spool`` is a local folder the outbox may keep undeliverable messages in, to retry them."""
    _SCHEMES[scheme] = factory


def open_outbox(address: str, spool: Path | None = None) -> Outbox:
    """The outbox for a recipient's address (``spool``: see ``register_scheme``)."""
    if "://" in address:
        scheme = address.split("://", 1)[0]
        if scheme == "file":
            return FileOutbox(Path(address.split("://", 1)[1]))
        if scheme not in _SCHEMES:
            raise DeliveryConfigError(f"address {address!r}: no transport for {scheme}:// here (file paths, "
                                      f"{', '.join(s + '://' for s in sorted(_SCHEMES)) or 'no other scheme'})")
        return _SCHEMES[scheme](address, spool)
    if address.startswith("file:"):
        address = address[5:]
    if not address:
        raise DeliveryConfigError("an empty address: give the recipient's inbox folder or URL")
    return FileOutbox(Path(address))


def inbox_folder(address: str) -> Path | None:
    """The folder of a file address (None for other schemes)."""
    if "://" in address:
        return Path(address.split("://", 1)[1]) if address.startswith("file://") else None
    return Path(address[5:] if address.startswith("file:") else address)
