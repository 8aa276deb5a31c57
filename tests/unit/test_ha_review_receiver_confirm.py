"""Review of issue 25: a secondary confirms (for --min-confirm, the primary's slot and backlog) only
what it hardened. The Receiver Server's answers read the instance's seqno at any time, and the Update
Process advances it as it applies a batch, before the batch's journal write and fdatasync: an answer
sent meanwhile (a heartbeat's, every 0.2 s) confirmed transactions that a crash of the secondary
would lose, and the primary answered commits as confirmed on it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import multisite
from multisite.journal.reader import iter_frames
from multisite.journal.records import FrameRun
from multisite.replication.server.receiver import ReceiverServer
from multisite.testing.checks import held_fdatasync


@pytest.fixture
def primary(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(11):
            db.set("acct", ("k", i), i)
    return root


@pytest.mark.parametrize("durability", ["group", "fsync"])
def test_ha_review_a_receiver_confirms_only_what_its_journal_hardened(primary, tmp_path, durability):
    root = multisite.create(tmp_path / "B", name="B", durability=durability)
    db = multisite.open(root)
    try:
        db.update_info(lambda i: setattr(i, "role", "secondary"))
        rec = ReceiverServer.__new__(ReceiverServer)  # what its answers read: the instance, the SI stream
        rec.db, rec.update = db, SimpleNamespace(si_stream=None)
        frames = list(iter_frames(primary / "journal", whole=True))
        with held_fdatasync(db._core.journal) as (in_sync, release):  # the batch's fdatasync takes a while
            t = threading.Thread(target=db.apply_frames, args=([FrameRun.of(frames)],))
            t.start()
            try:
                assert in_sync.wait(10)
                confirmed_meanwhile = rec._applied_seqno()
            finally:
                release.set()
                t.join()
        assert confirmed_meanwhile == 0  # nothing of the batch is hard yet
        assert rec._applied_seqno() == 11
    finally:
        db.close()
