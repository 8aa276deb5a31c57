"""Seeded SIGKILL rounds under a live writer through the grid client: a random container (sometimes the
catalog) dies and comes back, 20 times. The checker (``testing.grid_checks.check_grid``): every
acknowledged commit is present after recovery (its value, or a later one whose outcome was unknown) and
in every shard's journal at its seqno, no commit that raised ``ReplicationVotedToRollback`` is in any
shard's journal, every partition's shards are identical, and the writer's history (its puts and gets)
shows no lost write, phantom, duplicate or stale read after its own write (``testing/history``)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from contextlib import contextmanager

import pytest

from multisite.errors import CommitOutcomeUnknown, GridUnavailable, ReplicationVotedToRollback, TransactionError
from multisite.testing.grid import GridCluster
from multisite.testing.grid_checks import GridWriter, check_grid

ROUNDS = 20


@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("GRID_KILL_SEEDS", "11").split(",")])
def test_seeded_sigkills_under_a_writer_lose_no_acknowledged_commit(tmp_path, seed):
    rng = random.Random(seed)
    g = GridCluster(tmp_path, partitions=4, min_sync=1, max_sync=1, max_async=1, heartbeat_timeout_s=1.0)
    names = ["c1", "c2", "c3"]
    w = None
    try:
        g.start_catalog()
        for n in names:
            g.start_container(n)
        g.wait_settled()
        w = GridWriter(g, seed=7, timeout_s=2.0)
        w.start()
        for rnd in range(ROUNDS):
            time.sleep(rng.uniform(0.1, 0.4))
            victim = "catalog" if rng.random() < 0.2 else rng.choice(names)
            g.kill(victim)
            time.sleep(rng.uniform(0.2, 1.2))
            if victim == "catalog":
                g.start_catalog()
            else:
                g.start_container(victim)
            g.wait(f"round {rnd} ({victim} killed) settled", g.settled, timeout_s=30)
        time.sleep(0.3)
        w.stop()
        st = g.wait("every replica caught up", g.caught_up, timeout_s=30)
    finally:
        if w is not None:
            w.stop()
        g.stop_all()
    summary = check_grid(g, w, st)
    assert summary["acked"] > 200, summary
    print(f"seed {seed}: {ROUNDS} SIGKILLs; {summary}")


@contextmanager
def small_disk(path):
    """``path`` on a tmpfs of 24 MiB (needs root), unmounted after."""
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextmanager
def stopping(g: GridCluster):
    try:
        yield g
    finally:
        g.stop_all()


def fill_disk(path):
    """Take every free byte of ``path``'s disk with a file; its path (unlink it to make room)."""
    filler = path / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
def test_a_sync_replica_whose_disk_is_full_votes_no_and_counts_again_once_there_is_room(tmp_path):
    g = GridCluster(tmp_path, partitions=1, min_sync=1, max_sync=1, max_async=0)
    with small_disk(tmp_path / "b"), stopping(g):
        g.start_catalog()
        g.start_container("a")
        g.wait_settled()
        g.start_container("b")
        st = g.wait("b a current sync replica", lambda: (s := g.settled()) and s["partitions"][0]["sync"] == ["b"] and s)
        assert st["partitions"][0]["primary"] == "a"
        with g.client(timeout_s=5) as cl:
            cl.put("m", 0, "before")
            filler = fill_disk(tmp_path / "b")
            refused = None
            for i in range(1, 2000):
                try:
                    cl.put("m", i, "x" * 2000)
                except ReplicationVotedToRollback as e:
                    refused = (i, e)
                    break
            assert refused is not None, "the replica never voted no on a full disk"
            i, e = refused
            assert e.min_sync == 1 and e.commit_votes == 0
            assert cl.get("m", i) is None
            log = (tmp_path / "b" / "log" / "container.log").read_text()
            assert "STORAGE_FULL" in log or "STORE_LOST" in log, log[-2000:]
            filler.unlink()
            g.wait("b current again", lambda: (s := g.settled()) and s["partitions"][0]["current"] == ["b"])
            cl.put("m", i, "after")
            assert cl.get("m", i) == "after"
        g.wait("caught up", g.caught_up)
        g.stop_all()
        states = g.shard_states()
        assert states[0]["a"]["rows"] == states[0]["b"]["rows"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
def test_a_primary_whose_disk_is_full_refuses_commits_and_takes_them_again_once_there_is_room(tmp_path):
    g = GridCluster(tmp_path, partitions=1, min_sync=0, max_sync=0, max_async=1)
    with small_disk(tmp_path / "a"), stopping(g):
        g.start_catalog()
        g.start_container("a")
        g.wait_settled()
        g.start_container("b")
        g.wait("b placed", lambda: (s := g.settled()) and s["partitions"][0]["async"] == ["b"] and s)
        acked = {}
        with g.client(timeout_s=2) as cl:
            filler = fill_disk(tmp_path / "a")
            failed = None
            for i in range(3000):
                try:
                    cl.put("m", i, "x" * 2000)
                    acked[i] = "x" * 2000
                except (TransactionError, GridUnavailable) as e:
                    failed = (i, e)
                    break
                except CommitOutcomeUnknown:
                    raise AssertionError((tmp_path / "a" / "log" / "container.log").read_text()[-4000:]) from None
            assert failed is not None, "the primary never refused a commit on a full disk"
            assert "STORAGE_FULL" in str(failed[1]) or "STORE_LOST" in str(failed[1]), failed
            filler.unlink()
            g.wait("commits taken again", lambda: _put_ok(cl, failed[0]), timeout_s=20)
            acked[failed[0]] = "again"
        g.wait("caught up", g.caught_up)
        g.stop_all()
        states = g.shard_states()
        assert states[0]["a"]["rows"] == states[0]["b"]["rows"]
        assert all(states[0]["a"]["rows"][(k,)] == v for k, v in acked.items())


def _put_ok(cl, key) -> bool:
    try:
        cl.put("m", key, "again")
        return True
    except (TransactionError, GridUnavailable):
        return False
