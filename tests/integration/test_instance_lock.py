"""The instance lock between owners: a second opener is refused with the owner's pid, named even while
the owner (another process, or a lock file held here) is taking or letting go of the lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

import multisite
from multisite.errors import InstanceLocked
from multisite.instance.layout import InstanceLock, Layout


@pytest.fixture
def inst(tmp_path):
    """A new, empty instance directory."""
    return multisite.create(tmp_path / "A", name="A")


HOLDER = """
import sys, multisite
db = multisite.open(sys.argv[1])
print("HOLDING", flush=True)
sys.stdin.read()
db.close()
"""


def test_a_second_owner_gets_an_error_naming_the_owner_pid(inst):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(inst)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "HOLDING"
        before = {p.name: p.read_bytes() for p in (inst / "journal").glob("*.msj")}
        with pytest.raises(InstanceLocked) as ei:
            multisite.open(inst)
        assert str(holder.pid) in str(ei.value)
        assert ei.value.details["pid"] == holder.pid
        assert {p.name: p.read_bytes() for p in (inst / "journal").glob("*.msj")} == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert holder.returncode == 0
    with multisite.open(inst) as db:  # the owner is gone: the lock is free again
        assert db.seqno == 0


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
