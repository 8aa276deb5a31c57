"""The primary of an HA cluster runs out of disk (a real tmpfs of 24 MiB): its commits are refused
(STORAGE_FULL when the journal cannot grow, STORE_LOST when the store's write failed first) and nothing
acknowledged is lost; it keeps the leader key while its server runs (a full disk is no reason to promote
a member that has less). The operator frees space and restarts the server: the manager gives the key
up meanwhile, another member takes over, the old primary rejoins, and every acknowledged commit is
on the new primary."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from multisite.errors import MultisiteError
from multisite.testing.ha import HACluster

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root"),
              pytest.mark.timeout(240)]


def test_a_primary_with_a_full_disk_refuses_commits_keeps_leading_and_recovers(tmp_path, etcd_cluster):
    a = tmp_path / "A"
    a.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(a)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    c = HACluster(tmp_path, etcd_cluster.endpoints, ["A", "B", "C"], ttl_s=1.0, cluster=f"t-{tmp_path.name}")
    try:
        c.start()
        assert c.wait_primary() == "A"
        c.wait_followers()
        acked, refused = {}, None
        with c.client() as db:
            db.create_region("acct")
            for i in range(400):
                try:
                    acked[i] = db.set("acct", (i,), "x" * 200_000)
                except MultisiteError as e:
                    refused = e
                    break
        assert refused is not None and refused.code in ("STORAGE_FULL", "STORE_LOST"), refused
        time.sleep(2 * c.ttl_s)
        assert c.primary() == "A"  # no failover for a full disk while the server runs
        subprocess.run(["mount", "-o", "remount,size=256m", str(a)], check=True)
        c.cli("server", "stop", str(c.root("A")))  # the operator's restart: the manager gives the key up
        new = c.wait_primary(exclude="A", timeout_s=15)
        c.cli("ha", "stop", str(c.root("A")))
        c.restart_host("A")
        with c.client() as db:
            assert db.set("acct", ("after",), 1) > max(acked.values())
        c.wait_followers()
        c.wait_identical()
        rows = c.rows(new)
        assert all((i,) in rows for i in acked), "an acknowledged commit is missing on the new primary"
    finally:
        c.stop()
        subprocess.run(["umount", "-l", str(a)], check=False)
