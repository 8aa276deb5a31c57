"""Issue 16: the Loader protocol's decisions without I/O (grid/loader.py): the replica's buffer under
outcomes late, twice or for transactions never received; the replay plan; the loader's health."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.grid.loader import (
    Health,
    LoaderHealth,
    ReplayKind,
    ReplicaBuffer,
    TxnId,
    replay_plan,
)


def t(seqno: int, d: str = "aa") -> TxnId:
    return TxnId(0, seqno, d)


def test_commit_and_rollback_outcomes():
    b = ReplicaBuffer(0)
    for s in (1, 2, 3):
        b.receive(t(s))
    assert b.outcome(True, 2) == ([t(1), t(2)], [])
    assert b.outcome(False, 2) == ([], [t(3)])
    assert b.to_replay() == []
    assert b.status() == {"buffered": 0, "committed_seqno": 2, "committed": 2, "discarded": 1}


def test_late_twice_and_unknown_outcomes_change_nothing():
    b = ReplicaBuffer(0)
    b.receive(t(1))
    b.outcome(True, 1)
    assert b.outcome(True, 1) == ([], [])  # twice
    assert b.outcome(False, 0) == ([], [])  # a late rollback never discards a committed transaction
    assert b.outcome(True, 9) == ([], [])  # for transactions never received
    b.receive(t(5))  # at or below the committed seqno: already committed here
    assert b.to_replay() == []


def test_a_reused_seqno_is_another_transaction():
    b = ReplicaBuffer(0)
    b.receive(t(1, "aa"))
    b.receive(t(2, "bb"))
    b.receive(t(2, "cc"))  # the primary rolled 2 back and committed another at 2: the old one goes
    assert b.to_replay() == [t(1, "aa"), t(2, "cc")]
    assert b.discarded == 1


events = st.lists(st.one_of(
    st.tuples(st.just("recv"), st.integers(1, 12), st.sampled_from(["aa", "bb"])),
    st.tuples(st.just("out"), st.booleans(), st.integers(0, 12))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events)
def test_buffer_invariants(evs):
    b = ReplicaBuffer(0)
    committed: set[TxnId] = set()
    for e in evs:
        if e[0] == "recv":
            b.receive(t(e[1], e[2]))
        else:
            before = b.committed_seqno
            done, gone = b.outcome(e[1], e[2])
            committed |= set(done)
            assert not set(done) & set(gone)
            assert all(x.seqno > before for x in gone)  # nothing at or below a committed seqno is discarded
            assert b.committed_seqno >= before  # a commit is never undone
        assert all(s > b.committed_seqno for s in b.buffered)  # buffered = no outcome yet
        assert all(x.seqno == s for s, x in b.buffered.items())
        assert not committed & set(b.to_replay())
    assert [x.seqno for x in b.to_replay()] == sorted(b.buffered)


def test_replay_plan():
    j = {s: f"d{s}" for s in range(1, 11)}
    assert replay_plan(0, None, j, 10, 1).txns == tuple(TxnId(0, s, f"d{s}") for s in range(1, 11))
    p = replay_plan(0, TxnId(0, 8, "d8"), j, 10, 1)
    assert p.kind is ReplayKind.REPLAY and [x.seqno for x in p.txns] == [8, 9, 10]  # 8: skipped by id
    p = replay_plan(0, TxnId(0, 10, "d10"), j, 10, 1)
    assert p.kind is ReplayKind.IN_STEP and p.txns == (TxnId(0, 10, "d10"),)
    assert replay_plan(0, TxnId(0, 11, "x"), j, 10, 1).kind is ReplayKind.DIVERGED  # the database ahead
    assert replay_plan(0, TxnId(0, 8, "other"), j, 10, 1).kind is ReplayKind.DIVERGED  # another txn at 8
    # the journal starts after the database's last id (a checkpoint-installed shard): replay what it has
    assert [x.seqno for x in replay_plan(0, TxnId(0, 3, "d3"), {s: j[s] for s in (6, 7)}, 7, 6).txns] == [6, 7]


@given(st.integers(0, 30), st.integers(0, 30))
def test_replay_plan_hands_over_exactly_what_the_database_lacks(db_seqno, shard_seqno):
    j = {s: f"d{s}" for s in range(1, shard_seqno + 1)}
    last = TxnId(0, db_seqno, f"d{db_seqno}") if db_seqno else None
    p = replay_plan(0, last, j, shard_seqno, 1)
    if db_seqno > shard_seqno:
        assert p.kind is ReplayKind.DIVERGED
    else:
        assert [x.seqno for x in p.txns] == list(range(max(db_seqno, 1), shard_seqno + 1))


def test_health_backoff():
    h = LoaderHealth(base_s=0.1, max_s=1.0)
    assert h.may_try(0.0)
    assert h.down(0.0, "refused") == 0.1
    assert not h.may_try(0.05) and h.may_try(0.1)
    assert h.down(0.1, "refused") == 0.1 + 0.2
    for _ in range(10):
        r = h.down(1.0, "x")
    assert r == 2.0 and h.state is Health.DOWN
    h.ok()
    assert h.state is Health.UP and h.failures == 0


def test_the_sqlite_loader_skips_applied_ids_and_a_module_class_loads(tmp_path):
    from multisite.grid import LoaderRefused
    from multisite.grid.server.loader_runner import make_loader
    for kind in ("sqlite", "multisite.grid.server.loader_runner:SQLiteLoader"):
        path = tmp_path / f"{kind.replace(':', '_')}.db"
        ld = make_loader({"m": {"loader": kind, "path": str(path), "table": "t"}})
        a, b = TxnId(0, 1, "aa"), TxnId(0, 2, "bb")
        assert ld.apply([(a, [("m", "[1]", {"x": 1})])]) == 1
        assert ld.apply([(a, [("m", "[1]", {"x": 99})]), (b, [("m", "[2]", 2), ("m", "[1]", None)])]) == 1
        assert ld.last_applied(0) == b and ld.last_applied(1) is None
        import sqlite3
        with sqlite3.connect(path) as c:
            assert c.execute("SELECT key, value FROM t").fetchall() == [("[2]", "2")]
        try:
            ld.apply([(TxnId(0, 3, "cc"), [("m", None, 1)])])  # a NULL key: refused, nothing of it kept
        except LoaderRefused:
            pass
        else:
            raise AssertionError("a NULL key was taken")
        assert ld.last_applied(0) == b
        ld.close()
