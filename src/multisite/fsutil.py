"""Crash-safe file writes, used everywhere a file must be either old or new, never half-written.

The recipe (as litestream does it): write a temp file in the same directory, fsync it, ``os.replace``
it over the target, fsync the directory so the rename itself is durable.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import StorageFull


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Create the directory ``path`` if missing, durably: its parent is fsynced so the new entry
    survives a crash (a record written into it next is then reachable)."""
    if not path.exists():
        path.mkdir(exist_ok=True)
        fsync_dir(path.parent)


def truncate_file(path: Path | str, size: int) -> None:
    """Cut a file to ``size`` bytes and harden the cut (a journal's torn tail, a rollback, a repair);
    the caller fsyncs the directory once it is done with it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Harden a file someone else wrote (a crashed process: its writes may be in the page cache only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, what: str, *, offset: int | None = None) -> None:
    """os.write (os.pwrite at ``offset``) until done; a full disk raises StorageFull naming ``what``."""
    view = memoryview(data)
    try:
        while view:
            if offset is None:
                n = os.write(fd, view)
            else:
                n = os.pwrite(fd, view, offset)
                offset += n
            view = view[n:]
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(f"no space left on the device while writing {what}; free space and retry") from e
        raise


def atomic_write(path: Path, data: bytes, *, hook=None, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` crash-safely, the new file created with ``mode`` (0o600: a secret's
    file never readable by others, not even while written). ``hook(step)`` is called between steps (tests)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data, str(path))
        if hook:
            hook("written")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    if hook:
        hook("synced")
    os.replace(tmp, path)
    if hook:
        hook("replaced")
    fsync_dir(path.parent)
