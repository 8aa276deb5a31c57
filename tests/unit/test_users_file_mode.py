"""The users file (Argon2id hashes) is never readable by others, not even for a moment while written."""

from __future__ import annotations

import os
import stat

from multisite import fsutil
from multisite.instance.users import add_user, remove_user, users_path


def test_the_users_file_is_written_owner_only_from_its_first_byte(inst, monkeypatch):
    """It was created 0644 (atomic_write's mode), renamed into place, then chmod 0600: anyone on the host
    could open it in between and keep reading the hashes."""
    modes = []
    real = fsutil.os.replace

    def replace(src, dst):
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        return real(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", replace)
    old = os.umask(0o022)
    try:
        add_user(inst, "w", "read-write", "w-password")
        remove_user(inst, "w")
    finally:
        os.umask(old)
    assert modes == [0o600, 0o600]
    assert stat.S_IMODE(users_path(inst).stat().st_mode) == 0o600
