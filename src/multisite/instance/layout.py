"""The instance directory and the lock that makes one process its owner.

    <instance>/instance.msi   replication instance file
    <instance>/db/            store (SQLite, WAL)
    <instance>/journal/       journal segments
    <instance>/lost/          Unreplicated Transaction Logs
    <instance>/log/           server logs
    <instance>/run/           pid files and sockets of running servers
    <instance>/lock           held (flock) by the owning process; holds its pid

The directory is 0700 and everything in it 0700 (directories) or 0600 (files), or 0750 and 0640 for an
instance created with ``--group-read``: each is made with the mode ``fsutil`` takes from the directory
it is made in. An instance directory that every user may write is refused at every open.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InstanceLocked, NotAnInstance
from ..fsutil import check_not_world_writable, file_mode

INSTANCE_FILE = "instance.msi"
PID_WAIT_S = 0.5  # how long a second opener waits for the owner's pid to appear in the lock file


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def instance_file(self) -> Path:
        return self.root / INSTANCE_FILE

    @property
    def db(self) -> Path:
        return self.root / "db"

    @property
    def store_file(self) -> Path:
        return self.root / "db" / "store.sqlite"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def lost(self) -> Path:
        return self.root / "lost"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def rollback_marker(self) -> Path:
        """Written while a rollback runs; an open finishes the rollback it names (engine.rollback)."""
        return self.run / "rollback.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "lock"

    def dirs(self) -> list[Path]:
        return [self.db, self.journal, self.lost, self.log, self.run]

    @classmethod
    def existing(cls, root: str | os.PathLike) -> "Layout":
        lay = cls(Path(root).absolute())
        if lay.root.exists() and not lay.root.is_dir():
            raise NotAnInstance(f"{lay.root} is a file, not an instance directory")
        if not lay.root.is_dir():
            raise NotAnInstance(f"{lay.root} does not exist; create it with `multisite instance create`")
        if not lay.instance_file.exists() or not lay.journal.is_dir():
            raise NotAnInstance(f"{lay.root} is not a multisite instance (no {INSTANCE_FILE} or journal/); "
                                f"create one with `multisite instance create {lay.root} --name NAME`")
        for d in [lay.root, *lay.dirs()]:
            check_not_world_writable(d, "instance directory")
        return lay


class InstanceLock:
    """An exclusive flock on ``<instance>/lock``; the file holds the owner's pid."""

    def __init__(self, layout: Layout):
        self.path = layout.lock_file
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, file_mode(self.path.parent))
        deadline = time.monotonic() + PID_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                owner = owner_pid(self.path)
                if owner is None and time.monotonic() < deadline:
                    # The owner is between taking the lock and writing its pid, or between clearing
                    # it and letting go: look again rather than name no one.
                    time.sleep(0.002)
                    continue
                os.close(fd)
                raise InstanceLocked(
                    f"instance {self.path.parent} is owned by process {owner if owner else '(unknown pid)'}; "
                    f"stop that process or connect to its server instead", pid=owner) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "InstanceLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def owner_pid(lock_path: Path) -> int | None:
    try:
        text = lock_path.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def is_locked(layout: Layout) -> bool:
    """Is some process holding the instance now?"""
    try:
        fd = os.open(layout.lock_file, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
