"""A group commit whose fdatasync failed (EIO): the store is never committed past the hardened journal.

Linux reports a failed writeback once: the next fdatasync on the file returns success although the
pages the first one failed on may never reach the disk. The store's periodic commit (run by the client
listener's sync thread, ``Database.flush_if_due``) and ``close`` both harden the journal first; taking
that second fdatasync's success for the journal's would commit the failed transaction to the store, and
a power cut then leaves the store ahead of its journal: the instance no longer opens. The EIO is
simulated (a test cannot make a device fail); the power cut is the failed record's bytes zeroed.
"""

from __future__ import annotations

import errno

import pytest

import multisite
from multisite.journal import writer as journal_writer
from multisite.journal.records import SET
from multisite.values import encode_value


def _eio(fd: int) -> None:
    raise OSError(errno.EIO, "Input/output error")


def test_a_failed_fdatasync_keeps_the_store_behind_the_hard_journal(tmp_path, monkeypatch):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    db = multisite.open(root)
    db.create_region("acct")
    db.set("acct", ("a",), 1)  # hard
    seg, before = db.journal.path, db.journal.size
    prep = db.prepare([[(SET, "acct", ("b",), encode_value(2))]])
    token = prep.write(flush_store=False)  # the client listener's batch, its fdatasync still to come
    after = db.journal.size
    monkeypatch.setattr(journal_writer.os, "fdatasync", _eio)
    with pytest.raises(multisite.JournalError, match="fdatasync"):
        db.harden(token)  # its client is answered with this error
    monkeypatch.undo()  # the next fdatasync reports success, as Linux's does after an EIO
    db._core.last_flush = float("-inf")  # the store's periodic commit is due
    with pytest.raises(multisite.JournalError, match="failed earlier"):
        db.flush_if_due()  # the sync thread's check (it logs the error)
    db.close()
    with open(seg, "r+b") as f:  # the power cut: the pages the EIO was about never reached the disk
        f.seek(before)
        f.write(bytes(after - before))
    with multisite.open(root) as db:
        assert db.seqno == 1 and db.get("acct", ("a",)) == 1 and db.get("acct", ("b",)) is None
