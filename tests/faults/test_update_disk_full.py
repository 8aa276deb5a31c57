"""A secondary whose disk fills while it applies: the Update Process holds on and resumes once there is room.

Real processes, a real full disk: the secondary's journal directory is a small tmpfs (mounting needs
root; the test is skipped otherwise). Its journal fills part-way through the stream, and the Update
Process gets StorageFull. It used to take that for a gap: it emptied the receive pool and restarted
the connection, again and again (the receiver logging "the update process found a gap"), and the
source sent the whole backlog again each time. Now it keeps the batch and tries again, the pool fills
until XOFF, and once the tmpfs is made larger everything is applied once, over the same connection.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from multisite.testing.checks import assert_contiguous_journal, assert_same_data, log_text, wait_until
from multisite.testing.cluster import Cluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")


@pytest.fixture
def small_journal(tmp_path):
    """A cluster with A on disk and B (not started) whose journal directory is a 512 KiB tmpfs."""
    c = Cluster(tmp_path, durability="group", segment_bytes=64 * 1024)
    a = c.instance("A")
    b = c.instance("B", start=False)
    jdir = b.root / "journal"
    saved = tmp_path / "B-journal"
    shutil.copytree(jdir, saved)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(jdir)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        for f in saved.iterdir():
            shutil.copy2(f, jdir / f.name)
        yield c, a, b, jdir
    finally:
        c.stop_all()
        subprocess.run(["umount", "-l", str(jdir)], check=False)


def test_a_full_disk_holds_the_stream_and_it_resumes_once_there_is_room(small_journal):
    c, a, b, jdir = small_journal
    b.start()
    b.start_receiver(receive_pool_bytes=256 * 1024)
    a.start_source(b)
    with a.client() as db:
        db.create_region("r")
        for i in range(1500):  # ~1.5 MB of journal: three times what B's journal directory holds
            db.set("r", (i,), "x" * 1000)
    last = a.seqno()

    up = wait_until(lambda: (u := b.call("receiver.status")["update_process"])["error"] and u,
                    what="the update process to find the disk full", timeout_s=60)
    assert "STORAGE_FULL" in up["error"] and up["state"] == "running"
    held = up["seqno"]
    assert held < last
    # The receive pool fills and the source is told to stop: memory stays bounded meanwhile.
    wait_until(lambda: b.call("receiver.status")["xoffs"] >= 1, what="XOFF", timeout_s=60)
    assert b.seqno() == held

    subprocess.run(["mount", "-o", "remount,size=64m", str(jdir)], check=True)  # room again
    c.wait_caught_up(a, b, timeout=60)
    rs = b.call("receiver.status")
    assert rs["update_process"]["error"] is None
    assert rs["connections"] == 1, "the full disk restarted the connection"
    assert a.call("source.status", secondary="B")["connects"] == 1
    c.stop_all()

    rlog, ulog = log_text(b.root, "receiver.log"), log_text(b.root, "update.log")
    assert "gap" not in rlog and "restarting the connection" not in rlog
    assert "trying again until there is room" in ulog and "room again" in ulog
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)  # every transaction once: none lost, none applied twice
