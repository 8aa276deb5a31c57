"""The engine's two-phase local commit (``Database.prepare``: a grid primary's batch held applied and
framed until the vote) and checkpoint copy (``engine.checkpoint``: a consistent state read while the
instance commits on, and a new instance made from it)."""

from __future__ import annotations

import threading

import pytest

import multisite
from multisite.engine.checkpoint import install_state, read_state
from multisite.errors import NotPrimary, RegionNotFound
from multisite.journal.reader import iter_frames
from multisite.journal.records import SET, FrameRun
from multisite.values import encode_value


def ops(*pairs):
    return [(SET, "m", (k,), encode_value(v)) for k, v in pairs]


@pytest.fixture
def db(tmp_path):
    multisite.create(tmp_path / "a", "a", durability="group")
    d = multisite.open(tmp_path / "a")
    d.create_region("m")
    yield d
    d.close()


def test_a_committed_batch_is_journaled_with_the_frames_it_prepared(db):
    prep = db.prepare([ops((1, "x")), ops((2, "y"), (3, "z"))])
    assert prep.results == [1, 2] and [s for s, _ in prep.frames] == [1, 2]
    frames = [f for _, f in prep.frames]
    prep.commit()
    assert db.get("m", (1,)) == "x" and db.seqno == 2
    journaled = [bytes(fr) for run in [FrameRun.of(prep.frames)] for _, fr in run.frames()]
    assert journaled == frames
    assert [s for s, _ in iter_frames(db.layout.journal, 1)] == [1, 2]


def test_an_aborted_batch_leaves_no_trace_and_its_seqnos_are_reused(db):
    db.set("m", (0,), "before")
    prep = db.prepare([ops((1, "never"))])
    prep.abort()
    assert db.get("m", (1,)) is None and db.seqno == 1
    assert [s for s, _ in iter_frames(db.layout.journal, 1)] == [1]
    prep2 = db.prepare([ops((1, "later"))])
    assert prep2.first_seqno == 2
    prep2.commit()
    assert db.get("m", (1,)) == "later"


def test_a_transaction_that_fails_alone_is_reported_and_the_others_commit(db):
    prep = db.prepare([ops((1, "a")), [(SET, "nope", (2,), encode_value(1))], ops((3, "c"))])
    assert isinstance(prep.results[1], RegionNotFound) and prep.results[0] == 1 and prep.results[2] == 2
    prep.commit()
    assert db.get("m", (3,)) == "c" and db.seqno == 2


def test_nothing_else_commits_while_a_batch_is_prepared(db):
    prep = db.prepare([ops((1, "a"))])
    done = threading.Event()
    t = threading.Thread(target=lambda: (db.set("m", (9,), "other"), done.set()))
    t.start()
    assert not done.wait(0.2)  # waits for the commit lock
    token = prep.write()
    t.join(5)
    assert done.is_set() and db.seqno == 2
    db.harden(token)


def test_a_secondary_cannot_prepare(tmp_path):
    multisite.create(tmp_path / "b", "b")
    with multisite.open(tmp_path / "b") as b:
        b.update_info(lambda i: setattr(i, "role", "secondary"))
        with pytest.raises(NotPrimary):
            b.prepare([ops((1, "x"))])


def test_a_checkpoint_is_the_state_at_the_store_seqno_while_commits_go_on(db, tmp_path):
    for i in range(500):
        db.set("m", (i,), i)
    db.flush()
    with read_state(db.layout.root) as st:
        for i in range(500, 600):  # committed during the copy: not in it, replayed after it
            db.set("m", (i,), i)
        db.flush()
        assert st.seqno == 500 and st.keys == 500 and st.regions["m"] == (True, None)
        rows = [r for b in st.batches(64) for r in b]
        install_state(tmp_path / "copy", "copy", group="default", durability="group", seqno=st.seqno,
                      regions=st.regions, batches=[rows])
    with multisite.open(tmp_path / "copy") as copy:
        assert copy.seqno == 500 and copy.get("m", (499,)) == 499 and copy.get("m", (500,)) is None
        runs = [FrameRun.of(list(iter_frames(db.layout.journal, 501, whole=True)))]
        copy.apply_frames(runs)
        assert copy.seqno == 600 and dict(copy.items("m")) == dict(db.items("m"))
