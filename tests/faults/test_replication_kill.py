"""SIGKILL the instance servers of a replicating pair at random moments while a writer commits.

A writer thread commits on A through ``multisite.connect`` the whole time (reconnecting whenever A
is down). Each round waits a random moment, then SIGKILLs A's or B's instance server (every
component inside dies with it: source, receiver, Update Process), or both, or stops and restarts
B's Update Process alone; the dead servers are restarted and re-linked. At the end B must hold
exactly A's data, B's journal must hold seqnos 1..N once each (no gap, no duplicate: exactly once
across restarts), and every commit A acknowledged must be in A.

The seed comes from ``MULTISITE_FAULT_SEED`` (default below), so a failing run replays.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from multisite.errors import ConnectionLost, MultisiteError
from multisite.server.client import RemoteDatabase
from multisite.testing.checks import assert_contiguous_journal, assert_same_data, replicated_data, wait_until
from multisite.testing.cluster import Cluster, Node

SEED = int(os.environ.get("MULTISITE_FAULT_SEED", "20261121"))
ROUNDS = int(os.environ.get("MULTISITE_FAULT_ROUNDS", "24"))
TEST_BUDGET_S = 150


class Writer(threading.Thread):
    """Commits unique keys on ``node`` until stopped; remembers what was acknowledged."""

    def __init__(self, node: Node, seed: int):
        super().__init__(name="writer", daemon=True)
        self.node, self.rng = node, random.Random(seed)
        self.acked: dict[tuple, object] = {}
        self.unexpected: list[BaseException] = []
        self.reconnects = 0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"

    def run(self) -> None:
        i, db = 0, None
        while not self._halt.is_set():
            try:
                if db is None:
                    db = RemoteDatabase(f"127.0.0.1:{self.node.client_port}", timeout=5)
                    db.create_region("acct")
                    self.reconnects += 1
                if i % 4 == 0:
                    with db.transaction() as tx:
                        batch = {("t", i, j): {"i": i, "j": j} for j in range(3)}
                        for k, v in batch.items():
                            tx.set("acct", k, v)
                    self.acked.update(batch)
                else:
                    v = "x" * self.rng.randrange(1, 400)
                    db.set("acct", ("s", i), v)
                    self.acked[("s", i)] = v
                i += 1
            except (ConnectionLost, OSError):
                if db is not None:
                    db.close()
                db = None
                time.sleep(0.01)  # A is down or restarting: try again
            except MultisiteError as e:  # anything else is a bug
                self.unexpected.append(e)
                return
        if db is not None:
            db.close()


def restart_primary(a: Node, b: Node) -> None:
    a.start()
    a.start_source(b)  # sources do not survive their server; re-link


def restart_secondary(b: Node) -> None:
    b.start()
    b.start_receiver(b.receiver_port)  # same port: A's source reconnects by itself


@pytest.mark.timeout(TEST_BUDGET_S + 60)
def test_random_sigkills_leave_the_secondary_identical_with_no_gap_or_duplicate(tmp_path):
    rng = random.Random(SEED)
    cluster = Cluster(tmp_path, durability="group")
    t0 = time.monotonic()
    a = cluster.instance("A", journal_pool_bytes=128 * 1024)  # small: catch-up also reads journal files
    b = cluster.instance("B")
    cluster.link(a, b)
    writer = Writer(a, SEED)
    writer.start()
    actions: list[str] = []
    try:
        for r in range(ROUNDS):
            time.sleep(rng.uniform(0.05, 0.6))  # a random moment in whatever A, B and the link are doing
            what = rng.choices(["kill A", "kill B", "kill both", "update stop/start"], [4, 4, 1, 2])[0]
            actions.append(what)
            if what in ("kill A", "kill both"):
                a.kill()
            if what in ("kill B", "kill both"):
                b.kill()
            if what == "update stop/start":
                b.call("update.stop")
                time.sleep(rng.uniform(0.0, 0.3))
                b.call("update.start")
            if what in ("kill B", "kill both"):
                time.sleep(rng.uniform(0.0, 0.2))
                restart_secondary(b)
            if what in ("kill A", "kill both"):
                time.sleep(rng.uniform(0.0, 0.2))
                restart_primary(a, b)
            assert not writer.unexpected, writer.unexpected
            if rng.random() < 0.2:  # now and then let B catch up completely before the next fault
                cluster.wait_caught_up(a, b, timeout=60)
        writer.stop()
        assert not writer.unexpected, writer.unexpected
        last = cluster.wait_caught_up(a, b, timeout=60)
        wait_until(lambda: a.call("source.status", secondary="B")["last_confirmed"] == last, timeout_s=30,
                   what="B confirms the last seqno")
        cluster.stop_all()

        assert len(actions) >= 20 and {"kill A", "kill B"} <= set(actions), actions
        data = assert_same_data(a.root, b.root)
        assert_contiguous_journal(a.root, last)
        assert_contiguous_journal(b.root, last)
        stored = dict(data["acct"])
        lost = [k for k, v in writer.acked.items() if stored.get(k) != v]
        assert not lost, f"{len(lost)} acknowledged commits missing on A after SIGKILLs, e.g. {lost[:5]}"
        assert len(writer.acked) > 200 and writer.reconnects > 1
        assert time.monotonic() - t0 < TEST_BUDGET_S
        print(f"seed {SEED}: {len(actions)} rounds ({', '.join(actions)}), {last} transactions, "
              f"{len(writer.acked)} acknowledged keys, {writer.reconnects} writer connections, "
              f"{time.monotonic() - t0:.1f} s")
    finally:
        if writer.is_alive():
            writer._halt.set()
        cluster.stop_all()


def test_replicated_data_helper_sees_a_difference(tmp_path):
    """The comparison the fault test relies on does fail on a one-key difference."""
    import multisite

    for name, v in (("A", 1), ("B", 2)):
        with multisite.open(multisite.create(tmp_path / name, name, durability="none")) as db:
            db.create_region("acct")
            db.set("acct", ("k",), v)
    assert replicated_data(tmp_path / "A") == {"acct": [(("k",), 1)]}
    with pytest.raises(AssertionError, match=r"acct\('k',\): 1 != 2"):
        assert_same_data(tmp_path / "A", tmp_path / "B")
