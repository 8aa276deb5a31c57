"""A full disk during a pull: the batch that does not fit is not applied and its bookmark does not
move, nothing applied before it is lost, and once there is room the next session completes with
every document once. Real files: the receiving database's journal directory is a 1 MiB tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import multisite.documents as documents
from multisite.errors import MultisiteError
from multisite.multimaster.session import run_local

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
DOCS = 8000


def test_a_full_disk_stops_a_pull_without_loss_and_the_next_session_completes(tmp_path):
    a = documents.create(tmp_path / "A", "T", durability="none")
    a.create_many([("F", {"i": i, "blob": "x" * 100}) for i in range(DOCS)])  # ~2 MB of journal: twice the tmpfs, 2,000 a batch
    documents.create(tmp_path / "B", "T", replica_id=a.replica_id, durability="fsync", segment_bytes=64 * 1024).close()
    jdir = tmp_path / "B" / "journal"
    saved = tmp_path / "B-journal"
    shutil.copytree(jdir, saved)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(jdir)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        for f in saved.iterdir():
            shutil.copy2(f, jdir / f.name)
        b = documents.open(tmp_path / "B")
        with pytest.raises(MultisiteError) as e:
            run_local(b, a, "pull-only")
        assert e.value.code in ("STORAGE_FULL", "STORE_LOST"), e.value
        held = {d.unid: d for d in b.documents()}
        assert 0 < len(held) < DOCS
        for u, d in held.items():  # whole versions, as A has them
            assert d == a.get(u)
        assert b.bookmark(f"{a.db_id}@local-b", "in") <= a.changeno
        b.close()

        subprocess.run(["mount", "-o", "remount,size=64m", str(jdir)], check=True)  # room again
        b = documents.open(tmp_path / "B")
        assert {d.unid for d in b.documents()} == set(held)  # recovery kept exactly what was applied
        rep = run_local(b, a, "pull-only")
        t = rep.totals()
        assert t["new"] == DOCS - len(held) and t["new"] + t["unchanged"] <= DOCS
        assert [d.to_value() for d in b.documents()] == [d.to_value() for d in a.documents()]
        assert b.bookmark(f"{a.db_id}@local-b", "in") == a.changeno
        b.close()
    finally:
        subprocess.run(["umount", "-l", str(jdir)], check=False)
        a.close()
