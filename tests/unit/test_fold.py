"""Fold (``pipeline.fold``) refuses a replica it cannot fold into before reading anything: a replica
already past the target, or one holding transactions its source rolled off. The Spark session passed
in is one that fails if used, so these run without Spark; the folds that read are in
tests/spark/test_fold_seed_cases.py."""

from __future__ import annotations

import pytest

import multisite
from multisite import pipeline
from multisite.errors import ConfigError, HistoryMismatch
from multisite.journal.reader import iter_records
from multisite.testing.builders import numbered, replica_of, rewrite_after, state_of


class NoSpark:
    """A Spark session that must not be used: the call has to be refused before any read."""

    def __getattr__(self, name):
        raise AssertionError(f"Spark was used (.{name}) where the call should have stopped first")







def test_fold_to_below_the_replica_is_refused_before_reading(tmp_path):
    a = numbered(tmp_path / "A", "A", 10)
    b = replica_of(a, tmp_path / "B", "B", 10)
    before = state_of(b)
    with pytest.raises(ConfigError, match="already at seqno 10"):
        pipeline.fold(str(a), str(b), to_seqno=5, spark=NoSpark())
    # --to the replica's own seqno: nothing to do, and nothing done (its journal stays where it is)
    rep = pipeline.fold(str(a), str(b), to_seqno=10, spark=NoSpark())
    assert (rep.to_seqno, rep.updates_read, rep.points) == (10, 0, 0)
    assert not list(b.glob("journal-before-fold-*"))
    with multisite.open(b) as db:
        assert db.seqno == 10
    assert state_of(b) == before
    assert [r.seqno for r in iter_records(b / "journal", 1)] == list(range(1, 11))


def test_fold_refuses_a_replica_whose_transactions_the_source_rolled_off(tmp_path):
    # the replica still holds its last transaction in its journal: that transaction is compared
    a = numbered(tmp_path / "A", "A", 10)
    b = replica_of(a, tmp_path / "B", "B", 10)
    rewrite_after(a, 5, 15)
    before = state_of(b)
    with pytest.raises(HistoryMismatch, match="replica B .* at seqno 10 .* source A.* differ from seqno 6") as e:
        pipeline.fold(str(a), str(b), spark=NoSpark())
    assert "rollback" in str(e.value) and e.value.details["common_seqno"] == 5
    with multisite.open(b) as db:
        assert db.seqno == 10
    assert state_of(b) == before
