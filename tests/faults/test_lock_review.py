"""The instance lock names its owner even while the owner is taking or letting go of it."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

import multisite

from multisite.errors import InstanceLocked
from multisite.instance.layout import InstanceLock, Layout


def _owner_without_pid(tmp_path) -> tuple[Layout, int]:
    """An instance whose lock is held (this fd) with no pid in the file: an owner between taking the
    flock and writing its pid, or between clearing it and letting go."""
    lay = Layout.existing(multisite.create(tmp_path / "A", name="A"))
    fd = os.open(lay.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    return lay, fd


def test_a_second_opener_names_an_owner_still_writing_its_pid(tmp_path):
    # The owner takes the flock, then truncates the lock file and writes its pid: a second opener
    # in between read an empty file and said "owned by process (unknown pid)" (about 6% of the
    # refusals in an open/close loop). It now looks again for a moment.
    lay, fd = _owner_without_pid(tmp_path)
    try:
        t = threading.Timer(0.05, lambda: os.pwrite(fd, b"4242\n", 0))
        t.start()
        with pytest.raises(InstanceLocked) as e:
            InstanceLock(lay).acquire()
        t.join()
        assert "4242" in str(e.value) and e.value.details.get("pid") == 4242
    finally:
        os.close(fd)


def test_an_owner_letting_go_is_waited_for_not_reported(tmp_path):
    lay, fd = _owner_without_pid(tmp_path)  # the owner's release: pid cleared, lock not yet let go

    def let_go():
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    t = threading.Timer(0.05, let_go)
    t.start()
    lock = InstanceLock(lay)
    lock.acquire()  # it was free a moment later
    t.join()
    assert lay.lock_file.read_text().strip() == str(os.getpid())
    lock.release()


def test_a_live_owner_without_a_pid_is_still_refused_in_time(tmp_path):
    lay, fd = _owner_without_pid(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(InstanceLocked, match="unknown pid"):
            InstanceLock(lay).acquire()
        assert time.monotonic() - t0 < 2
    finally:
        os.close(fd)
