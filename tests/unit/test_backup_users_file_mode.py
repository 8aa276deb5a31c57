"""A backup's copy of the users file (Argon2id hashes) is never readable by others, not even for a moment."""

from __future__ import annotations

import os
import stat
import sys

from multisite.instance.maintenance import backup
from multisite.instance.users import add_user, users_path

_watch: list = []  # [path, modes seen]; empty: the audit hook (which cannot be removed) does nothing


def _audit(event: str, args: tuple) -> None:
    if _watch:
        try:
            _watch[1].append(stat.S_IMODE(os.lstat(_watch[0]).st_mode))
        except FileNotFoundError:
            pass


sys.addaudithook(_audit)


def test_backup_writes_the_users_file_owner_only_from_its_first_byte(inst, tmp_path):
    """It was copied with shutil.copyfile (mode 0644 under umask 022) and only then chmod 0600: anyone on
    the host could open the copy in between and keep reading the hashes. Every file operation the backup
    does after the copy exists sees its mode (a Python audit hook)."""
    add_user(inst, "w", "read-write", "w-password")
    dest = tmp_path / "copy"
    old = os.umask(0o022)
    _watch[:] = [users_path(dest), []]
    try:
        backup(inst, dest)
        modes = _watch[1]
    finally:
        _watch.clear()
        os.umask(old)
    assert modes and set(modes) == {0o600}, modes
    assert users_path(dest).read_bytes() == users_path(inst).read_bytes()
