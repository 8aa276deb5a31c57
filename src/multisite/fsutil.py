"""Crash-safe file writes, used everywhere a file must be either old or new, never half-written; and the
modes of what multisite keeps at rest.

The recipe (as litestream does it): write a temp file in the same directory, fsync it, ``os.replace``
it over the target, fsync the directory so the rename itself is durable.

Modes (as PostgreSQL does it): a directory multisite owns (an instance, a document database, a document
server's home, a backup) is made 0700, or 0750 where it is created to let its group read
(``instance create --group-read``). Everything made inside one takes its mode from the directory it is
made in: 0700 directories and 0600 files, or 0750 and 0640 where that directory lets its group read. No
file is created readable by other users, whatever the umask. A directory that other users may write is
refused (``UnsafePermissions``): anyone could replace what it holds.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from .errors import StorageFull, UnsafePermissions

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
GROUP_READ_DIR_MODE = 0o750
GROUP_READ_FILE_MODE = 0o640


def _group_reads(directory: Path | str) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IRGRP)
    except FileNotFoundError:
        return False


def file_mode(directory: Path | str) -> int:
    """The mode of a new file in ``directory``: 0o600, or 0o640 where the directory lets its group read."""
    return GROUP_READ_FILE_MODE if _group_reads(directory) else PRIVATE_FILE_MODE


def dir_mode(parent: Path | str) -> int:
    """The mode of a new directory in ``parent``: 0o700, or 0o750 where ``parent`` lets its group read."""
    return GROUP_READ_DIR_MODE if _group_reads(parent) else PRIVATE_DIR_MODE


def make_dir(path: Path | str) -> Path:
    """Create ``path`` (and missing parents) if missing, each with the mode its parent gives it."""
    path = Path(path)
    if not path.is_dir():
        make_dir(path.parent)
        try:
            path.mkdir(mode=dir_mode(path.parent))  # a stricter umask makes it stricter still
        except FileExistsError:
            pass
    return path


def make_root(path: Path | str, *, group_read: bool = False) -> Path:
    """Create the directory multisite owns at ``path`` (an instance, a document database, a server's
    home), or take an existing empty one: 0o700, or 0o750 with ``group_read``."""
    path = Path(path)
    make_dir(path.parent)
    path.mkdir(exist_ok=True)
    os.chmod(path, GROUP_READ_DIR_MODE if group_read else PRIVATE_DIR_MODE)
    return path


def check_not_world_writable(path: Path | str, what: str = "directory") -> None:
    """Refuse a ``what`` that every user may write: they could change or replace the data it holds."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & stat.S_IWOTH:
        raise UnsafePermissions(
            f"the {what} {path} can be written by every user on this host (mode {stat.S_IMODE(mode):o}): any "
            f"of them could change or replace its data; run `chmod o-w {path}` (multisite creates it 0700) and "
            f"retry", path=str(path))


def create_file(path: Path | str) -> Path:
    """Create ``path`` empty, with the mode its directory gives it, if missing (for a file another
    library then opens: a log handler, SQLite, Parquet keep an existing file's mode)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode(path.parent))
    except FileExistsError:
        return path
    os.close(fd)
    return path


def copy_file(src: Path | str, dst: Path | str) -> None:
    """Copy ``src`` to a new ``dst`` created with the mode its directory gives it (shutil.copyfile
    would make it 0644 under the usual umask, readable by everyone for as long as it exists)."""
    with open(src, "rb") as f:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(Path(dst).parent))
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Create the directory ``path`` if missing, durably: its parent is fsynced so the new entry
    survives a crash (a record written into it next is then reachable). Its mode: ``dir_mode``."""
    if not path.exists():
        make_dir(path)
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


def atomic_write(path: Path, data: bytes, *, hook=None, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` crash-safely, the new file created with ``mode`` (by default the
    one its directory gives it, ``file_mode``; 0o600: a secret's file never readable by others, not even
    while written). ``hook(step)`` is called between steps (tests)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(path.parent) if mode is None else mode)
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
