"""SyncReplicas after a vote that did not end in a commit on the primary (issue 28's simulation found both):
a ROLLBACK decision puts every voter that did not vote ROLLBACK behind at once (it holds, or will
journal, the refused frames), and a COMMIT decision the primary then undid (``aborted``) takes
``committed_seqno`` back, so that replicas can count current again."""

from multisite.grid.voting import SyncReplicas, Vote


def _current(sr: SyncReplicas, *names: str, seqno: int = 0) -> None:
    for n in names:
        assert sr.caught_up(n, seqno)


def test_an_early_rollback_puts_the_voter_still_to_answer_behind():
    sr = SyncReplicas(2, ["r1", "r2"])
    _current(sr, "r1", "r2")
    v = sr.begin(0.0, 1)
    d = sr.vote(v.txn, "r1", Vote.ROLLBACK, 0.1)  # min_sync 2 is out of reach: decided before r2 answers
    assert d is not None and not d.commit
    assert sr.current == set()  # r2 may still journal the prepare: not current until cut back and caught up


def test_a_rollback_puts_the_commit_voters_behind():
    sr = SyncReplicas(2, ["r1", "r2", "r3"])
    _current(sr, "r1", "r2", "r3")
    v = sr.begin(0.0, 1)
    sr.vote(v.txn, "r1", Vote.COMMIT, 0.1)
    sr.vote(v.txn, "r2", Vote.ROLLBACK, 0.1)
    d = sr.vote(v.txn, "r3", Vote.ROLLBACK, 0.1)
    assert not d.commit and "r1" in d.commit_votes
    assert sr.current == set()


def test_a_commit_still_keeps_its_commit_voters_current():
    sr = SyncReplicas(1, ["r1", "r2"])
    _current(sr, "r1", "r2")
    v = sr.begin(0.0, 1)
    sr.vote(v.txn, "r1", Vote.COMMIT, 0.1)
    d = sr.vote(v.txn, "r2", Vote.ROLLBACK, 0.1)
    assert d.commit and sr.current == {"r1"}


def test_an_aborted_commit_takes_committed_seqno_back():
    sr = SyncReplicas(1, ["r1", "r2"], committed_seqno=4)
    _current(sr, "r1", "r2", seqno=4)
    v = sr.begin(0.0, 5)
    sr.vote(v.txn, "r1", Vote.COMMIT, 0.1)
    d = sr.tick(10.0)[0]  # r2 timed out: decided COMMIT, committed_seqno raised to 5
    assert d.commit and sr.committed_seqno == 5
    sr.aborted(d, 4)  # the primary lost its lease while it reported: the batch is undone, its journal at 4
    assert sr.committed_seqno == 4 and sr.current == set()
    assert sr.caught_up("r2", 4)  # a replica holding all the primary holds counts again
