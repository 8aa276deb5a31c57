"""Rollback and lost-transaction files on an open instance (no servers).

A seeded random workload of sets, kills and zkills runs beside a model: the state of every region
after each seqno. A rollback to any earlier seqno must give back exactly the model's state at that
seqno, from before-images alone; the lost file must hold the rolled-off records exactly, in commit
order; the journal must end at the target, also across segment boundaries; and the instance must go
on committing and reopen cleanly.
"""

from __future__ import annotations

import random

import pytest

import multisite
from multisite.errors import RollbackError
from multisite.journal.reader import iter_records
from multisite.journal.segments import list_segments
from multisite.journal.lostfile import FORMAT, LostFile, list_lost_files, write_lost_file
from multisite.replication.resync import local_target_for_stream

REGIONS = ("acct", "audit")


def state(db) -> dict:
    return {r: list(db.items(r)) for r in REGIONS}


def random_txn(db, rng: random.Random) -> None:
    """One transaction of 1..4 updates over a small key space, so kills hit existing subtrees."""
    with db.transaction() as tx:
        for _ in range(rng.randint(1, 4)):
            region = rng.choice(REGIONS)
            key = (rng.choice("abc"), rng.randint(0, 3)) if rng.random() < 0.8 else (rng.choice("abc"),)
            op = rng.random()
            if op < 0.6:
                tx.set(region, key, {"v": rng.randint(0, 10**6), "pad": "x" * rng.randint(0, 40)})
            elif op < 0.8:
                tx.kill(region, key[:1])
            else:
                tx.zkill(region, key)


@pytest.fixture
def db(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    d = multisite.open(root)
    for r in REGIONS:
        d.create_region(r)
    d.create_region("scratch", replicated=False)
    yield d
    d.close()


def run_model(db, rng: random.Random, n: int, model: dict[int, dict]) -> None:
    for _ in range(n):
        random_txn(db, rng)
        model[db.seqno] = state(db)


# -- lost files -------------------------------------------------------------------------------------
def test_lost_file_round_trip_and_format(db, tmp_path):
    db.set("acct", ("a", 1), {"n": 1})
    with db.transaction() as tx:
        tx.set("acct", ("a", 1), {"n": 2})
        tx.set("acct", ("a", 2), "two")
        tx.zkill("acct", ("a", 9))  # absent: before-image None
    db.kill("acct", ("a",))
    db.zkill("acct", ("b",))
    recs = list(iter_records(db.layout.journal))
    path = write_lost_file(tmp_path, instance="A", group="g", records=recs, common_seqno=0, reason="test")
    assert path.name.endswith("-A-1-4.mslost") and list_lost_files(tmp_path) == [path]
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
    lines = path.read_bytes().splitlines()
    assert len(lines) == 1 + 4 + 1
    lf = LostFile.read(path)
    assert lf.header["format"] == FORMAT
    assert (lf.header["instance"], lf.header["group"], lf.header["from_seqno"], lf.header["to_seqno"],
            lf.header["common_seqno"], lf.header["reason"]) == ("A", "g", 1, 4, 0, "test")
    assert list(lf.records()) == recs
    t = lf.transactions
    assert [x["seqno"] for x in t] == [1, 2, 3, 4]
    assert all((x["stream"], x["stream_seqno"], x["origin"]) == (0, x["seqno"], "A") for x in t)
    assert t[1]["updates"][0] == {"op": "set", "region": "acct", "key": ["a", 1], "value": {"n": 2},
                                  "before": {"n": 1}}
    assert t[1]["updates"][1]["before"] is None
    assert t[1]["updates"][2] == {"op": "zkill", "region": "acct", "key": ["a", 9], "before": None}
    assert t[2]["updates"][0]["killed"] == [[["a", 1], {"n": 2}], [["a", 2], "two"]]


def test_may_have_changed_is_zqgblmod(db, tmp_path):
    db.set("acct", ("b", 1), 1)
    db.set("acct", ("b", 2), 2)
    db.set("acct", ("c", 1), 1)
    first = db.seqno + 1
    db.set("acct", ("a", 1), "x")
    db.kill("acct", ("b",))
    db.zkill("acct", ("c", 1))
    lf = LostFile.read(write_lost_file(tmp_path, instance="A", group="g", records=list(
        iter_records(db.layout.journal, first)), common_seqno=first - 1, reason="t"))
    yes = [("a", 1), ("b",), ("b", 1), ("b", 7), ("b", 1, "deep"), ("c", 1)]
    no = [("a", 2), ("a",), ("c",), ("c", 1, "below a zkill"), ("c", 2), ("d", 1)]
    assert [k for k in yes if not lf.may_have_changed("acct", k)] == []
    assert [k for k in no if lf.may_have_changed("acct", k)] == []
    assert not lf.may_have_changed("audit", ("a", 1))


# -- rollback ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rollback_gives_back_every_earlier_state(db, seed):
    rng = random.Random(seed)
    model = {0: state(db)}
    run_model(db, rng, 60, model)
    for _ in range(4):  # roll back, commit more, roll back again: each time to the model's state
        target = rng.randint(max(0, db.seqno - 40), db.seqno - 1)
        before = list(iter_records(db.layout.journal, 1, target))
        gone = list(iter_records(db.layout.journal, target + 1))
        n_lost = {str(f) for f in list_lost_files(db.layout.lost)}
        rep = db.rollback(target)
        assert (rep.rolled_back, rep.from_seqno, rep.to_seqno) == (len(gone), target + len(gone), target)
        assert db.seqno == target and state(db) == model[target]
        assert list(iter_records(db.layout.journal)) == before
        assert {str(f) for f in list_lost_files(db.layout.lost)} - n_lost == {rep.lost_file}
        assert list(LostFile.read(rep.lost_file).records()) == gone
        for s in [s for s in model if s > target]:
            del model[s]
        run_model(db, rng, rng.randint(1, 30), model)
    root = db.layout.root
    db.close()
    with multisite.open(root) as again:
        assert state(again) == model[again.seqno]


def test_kill_and_zkill_come_back_from_their_before_images(db):
    for i in range(5):
        db.set("acct", ("k", i), {"i": i})
        db.set("acct", ("k", i, "sub"), [i, "sub"])
    db.set("acct", ("z",), "zz")
    db.set("acct", ("z", 1), "below z")
    snap, target = state(db), db.seqno
    with db.transaction() as tx:
        tx.set("acct", ("k", 2), "overwritten")
        tx.kill("acct", ("k",))  # the kill's before-image holds the overwritten value's replacement
        tx.set("acct", ("k", 3), "reborn")
    db.zkill("acct", ("z",))  # the key only: ("z", 1) stays
    assert db.get("acct", ("z", 1)) == "below z" and db.get("acct", ("z",)) is None
    db.kill("acct", ("k", 3))
    db.set("scratch", ("local",), "not journaled")
    rep = db.rollback(target)
    assert rep.rolled_back == 3
    assert state(db) == snap
    assert db.get("scratch", ("local",)) == "not journaled"  # unreplicated regions are not rolled back


def test_rollback_across_segment_boundaries(db):
    for i in range(400):
        db.set("acct", ("s", i), {"pad": "y" * 60, "i": i})
    segs = list_segments(db.layout.journal)
    assert len(segs) >= 8
    target = segs[2].first_seqno + 3  # inside the third segment
    db.set("acct", ("marker",), 0)  # not rolled back below: it is past the target
    rep = db.rollback(target)
    assert rep.rolled_back == 401 - target
    after = list_segments(db.layout.journal)
    assert [s.index for s in after] == [s.index for s in segs[:3]]
    assert [r.seqno for r in iter_records(db.layout.journal)] == list(range(1, target + 1))
    assert sorted(k[1] for k, _ in db.items("acct")) == list(range(target))
    db.set("acct", ("after",), 1)
    assert db.seqno == target + 1
    root = db.layout.root
    db.close()
    with multisite.open(root) as again:
        assert again.seqno == target + 1 and again.get("acct", ("after",)) == 1
        assert [r.seqno for r in iter_records(again.layout.journal)][-2:] == [target, target + 1]


def test_rollback_not_ahead_is_a_no_op(db):
    db.set("acct", ("a",), 1)
    for to in (db.seqno, db.seqno + 10):
        rep = db.rollback(to)
        assert rep.rolled_back == 0 and rep.lost_file is None
    assert list_lost_files(db.layout.lost) == [] and db.seqno == 1
    with pytest.raises(RollbackError):
        db.rollback(-1)
    assert db.seqno == 1 and db.get("acct", ("a",)) == 1


def test_a_primary_starts_a_new_history_record_after_its_rollback(db):
    for i in range(10):
        db.set("acct", ("a", i), i)
    first = db.info.history[0]
    db.rollback(6)
    hist = db.info.history
    assert hist[0] == first
    assert hist[-1].start_seqno == 7 and hist[-1].root_primary == "A" and hist[-1].uid != first.uid
    db.set("acct", ("new",), 1)
    assert db.seqno == 7


def test_supplementary_rollback_resets_both_streams(tmp_path):
    """Seed 000's {100,0,10}, {101,1,18}, {102,0,11}: rolling {101,1,18} off takes {102,0,11} too,
    and afterwards the instance continues stream 1 from 17 and its own stream 0 from 10."""
    from multisite.journal.records import SET, Record, Update
    from multisite.values import encode_value

    root = multisite.create(tmp_path / "P", name="P", group="si", supplementary=True, durability="none")
    with multisite.open(root) as p:
        p.create_region("t")

        def from_a(seqno: int) -> Record:
            return Record(seqno, 0, seqno, "A", 0.0, [Update(SET, "t", (f"A{seqno}",), encode_value(seqno))])

        p.apply_records([from_a(s) for s in range(1, 18)], si_stream=1)
        for i in range(9):
            p.set("t", (f"P{i}",), i)
        assert p.stream_seqno(0) == 9
        p.set("t", ("P10",), 10)  # {27,0,10}
        p.apply_records([from_a(18)], si_stream=1)  # {28,1,18}
        p.set("t", ("P11",), 11)  # {29,0,11}
        tags = [(r.seqno, r.stream, r.stream_seqno) for r in iter_records(p.layout.journal, 27)]
        assert tags == [(27, 0, 10), (28, 1, 18), (29, 0, 11)]
        target = local_target_for_stream(p, 1, 17)  # A's common point is its seqno 17
        assert target == 27
        rep = p.rollback(target)
        assert [(r.seqno, r.stream, r.stream_seqno) for r in LostFile.read(rep.lost_file).records()] == \
            [(28, 1, 18), (29, 0, 11)]
        assert (p.stream_seqno(1), p.stream_seqno(0)) == (17, 10)
        p.set("t", ("P11a",), 11)
        p.apply_records([from_a(18)], si_stream=1)
        tags = [(r.seqno, r.stream, r.stream_seqno) for r in iter_records(p.layout.journal, 28)]
        assert tags == [(28, 0, 11), (29, 1, 18)]


def test_a_lost_file_path_that_is_wrong_is_a_config_error_not_a_damaged_file(tmp_path):
    from multisite.errors import ConfigError
    from multisite.journal.lostfile import LostFile

    for wrong in (tmp_path / "missing.mslost", tmp_path):
        with pytest.raises(ConfigError, match="is not a lost-transaction file"):
            LostFile.read(wrong)


def test_supplementary_rollback_in_one_of_several_streams_and_its_lost_file_numbering(tmp_path):
    """Streams 1 and 2 from two groups, interleaved with P's own: rolling stream 2 back past its
    seqno 3 takes every later transaction off (any stream), resets each stream to what remains, and
    the lost file says its seqnos are P's and its stream seqnos the sources', naming each stream's group."""
    import base64
    import json
    import zlib

    from click.testing import CliRunner

    from multisite.cli.main import cli
    from multisite.instance.instance_file import StreamInfo
    from multisite.journal.lostfile import NUMBERING_SI
    from multisite.journal.records import SET, Record, Update
    from multisite.values import encode_value

    def rec(origin: str, seqno: int) -> Record:
        return Record(seqno, 0, seqno, origin, 0.0, [Update(SET, "t", (f"{origin}{seqno}",), encode_value(seqno))])

    root = multisite.create(tmp_path / "P", name="P", group="si", supplementary=True, durability="none")
    with multisite.open(root) as p:
        p.create_region("t")

        def streams(info):
            info.streams = {1: StreamInfo(1, "g1", "O1"), 2: StreamInfo(2, "g2", "O2")}
        p.update_info(streams)
        p.apply_records([rec("O1", s) for s in (1, 2)], si_stream=1)  # P 1, 2
        p.apply_records([rec("O2", s) for s in (1, 2, 3)], si_stream=2)  # P 3, 4, 5
        p.set("t", ("P1",), 1)  # P 6 {6,0,1}
        p.apply_records([rec("O2", 4)], si_stream=2)  # P 7 {7,2,4}
        p.apply_records([rec("O1", 3)], si_stream=1)  # P 8 {8,1,3}
        p.set("t", ("P2",), 2)  # P 9 {9,0,2}
        target = local_target_for_stream(p, 2, 3)
        assert target == 6
        rep = p.rollback(target, reason="test", common_seqno=3)
        assert (p.stream_seqno(0), p.stream_seqno(1), p.stream_seqno(2)) == (1, 2, 3)
        assert p.info.streams[2].last_stream_seqno == 3 and p.info.streams[1].last_stream_seqno == 2
    lf = LostFile.read(rep.lost_file)
    assert lf.numbering == NUMBERING_SI == {"seqno": "local", "stream_seqno": "source (per stream)"}
    assert lf.header["streams"] == {"1": "g1", "2": "g2"} and lf.stream_groups == {1: "g1", 2: "g2"}
    assert [(t["seqno"], t["stream"], t["stream_seqno"]) for t in lf.transactions] == \
        [(7, 2, 4), (8, 1, 3), (9, 0, 2)]
    out = CliRunner().invoke(cli, ["lost", "show", rep.lost_file], catch_exceptions=False).output
    assert "seqno is P's own" in out and "1: g1, 2: g2" in out
    assert "seqno (local)" in out and "stream seqno (source)" in out and "2 (g2)" in out

    # A file written before the numbering was recorded reads and shows as before.
    lines = open(rep.lost_file, "rb").read().splitlines(keepends=True)
    head = json.loads(lines[0])
    del head["numbering"], head["streams"]
    body = (json.dumps(head) + "\n").encode() + b"".join(lines[1:-1])
    old = tmp_path / "old.mslost"
    old.write_bytes(body + (json.dumps({"end": True, "count": 3, "crc32": zlib.crc32(body)}) + "\n").encode())
    lf_old = LostFile.read(old)
    assert lf_old.numbering is None and lf_old.stream_groups == {} and len(list(lf_old.records())) == 3
    assert base64.b64decode(lf_old.transactions[0]["payload"])
    out = CliRunner().invoke(cli, ["lost", "show", str(old)], catch_exceptions=False).output
    assert "numbering" not in out and "seqno (local)" not in out and "stream seqno" in out


def test_a_bc_lost_file_says_its_seqnos_are_the_groups(db, tmp_path):
    from multisite.journal.lostfile import NUMBERING_BC

    db.set("acct", ("a",), 1)
    lf = LostFile.read(write_lost_file(tmp_path, instance="A", group="g", records=list(iter_records(
        db.layout.journal)), common_seqno=0, reason="t"))
    assert lf.numbering == NUMBERING_BC and lf.stream_groups == {}


def test_fetchresync_of_a_supplementary_instance_works_in_the_stream_of_the_primarys_group(tmp_path):
    """``rollback --fetchresync`` chooses the stream as a Receiver Server would: a known group's
    stream is rolled back to its common point; a 16th group is refused with nothing changed."""
    from multisite.errors import NoFreeStream
    from multisite.instance.instance_file import InstanceFile, StreamInfo
    from multisite.journal.records import SET, Record, Update
    from multisite.replication.history import hello_for, to_entries, to_records
    from multisite.replication.roles import resync_instance
    from multisite.values import encode_value

    o2 = InstanceFile(name="O2", group="g2")
    o2.add_history(1, "O2", "originating")
    root = multisite.create(tmp_path / "P", name="P", group="si", supplementary=True, durability="none")
    with multisite.open(root) as p:
        p.create_region("t")

        def streams(info):
            info.streams = {n: StreamInfo(n, f"g{n}", f"O{n}") for n in range(1, 16)}
            info.streams[2].history = to_records(to_entries(o2.history), upstream="O2")
        p.update_info(streams)

        def rec(origin: str, seqno: int) -> Record:
            return Record(seqno, 0, seqno, origin, 0.0, [Update(SET, "t", (f"{origin}-{seqno}",), encode_value(1))])
        p.apply_records([rec("O1", 1)], si_stream=1)
        p.apply_records([rec("O2", s) for s in (1, 2, 3)], si_stream=2)
        p.apply_records([rec("O1", 2)], si_stream=1)
        o16 = InstanceFile(name="O16", group="g16")
        o16.add_history(1, "O16", "originating")
        with pytest.raises(NoFreeStream, match="P already receives 15 SI streams"):
            resync_instance(p, primary=hello_for(o16, 5))
        assert p.seqno == 5
        # O2 was rolled back to 1 and went on: P's stream 2 is ahead past its seqno 1
        o2.truncate_history(1)
        o2.add_history(2, "O2", "originating")
        rep = resync_instance(p, primary=hello_for(o2, 4), address="o2:1")
        assert (rep.from_seqno, rep.to_seqno, rep.rolled_back) == (5, 2, 3)
        assert (p.stream_seqno(1), p.stream_seqno(2)) == (1, 1)
        assert [(t["stream"], t["stream_seqno"]) for t in LostFile.read(rep.lost_file).transactions] == \
            [(2, 2), (2, 3), (1, 2)]
