"""``verify`` honest about seqnos, and small inputs compared without Spark (``engine="auto"``).

Spark must not start here: ``pipeline.env.session`` is replaced by one that fails, so a comparison
that reached for Spark fails the test. The same comparisons on Spark are in tests/spark/test_verify_engines.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import multisite
from multisite import pipeline
from multisite.cli.main import cli
from multisite.pipeline.local_state import state_at
from multisite.testing.builders import numbered, replica_of, state_of

KNOWN = [  # as tests/spark/conftest.py: sets, a zkill and a kill of a subtree
    [("set", "acct", ("a", 1), {"owner": "ann", "n": 1}), ("set", "log", (1,), "one")],
    [("set", "acct", ("a", 2), {"owner": "bob", "n": 2}), ("set", "acct", ("b",), {"owner": 7, "n": "x"})],
    [("set", "acct", ("a", 1), {"owner": "ann", "n": 10}), ("zkill", "log", (1,), None)],
    [("kill", "acct", ("a",), None)],
    [("set", "acct", ("a", 3), {"owner": "cy", "n": 3}), ("set", "log", ("x", 2), [1, 2])],
]


def build(path, name, txns):
    root = multisite.create(path, name=name, durability="none")
    with multisite.open(root) as db:
        db.create_region("acct")
        db.create_region("log")
        for t in txns:
            with db.transaction() as tx:
                for op, region, key, value in t:
                    getattr(tx, op)(region, key, *([value] if op == "set" else []))
    return root


@pytest.fixture(autouse=True)
def no_spark(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("Spark was started for a small comparison")

    monkeypatch.setattr("multisite.pipeline.env.session", refuse)


def test_state_at_every_seqno_matches_the_engine_replaying_to_it(tmp_path):
    a = build(tmp_path / "A", "A", KNOWN)
    for upto in range(0, 6):
        b = replica_of(a, tmp_path / f"B{upto}", f"B{upto}", upto)
        want = {(r, multisite.keys.encode_key(k)): multisite.values.encode_value(v)
                for (r, k), v in state_of(b).items()}
        assert state_at(str(a), upto)[0] == want, upto  # from the journal (before A's store seqno)
        assert state_at(str(b))[0] == want  # from B's store


def test_state_of_a_live_instance_rolls_its_store_forward_through_kills(tmp_path):
    a = build(tmp_path / "A", "A", KNOWN[:3])
    b = build(tmp_path / "B", "B", KNOWN)
    with multisite.open(a) as db:  # live: the store copy may be behind the journal, which carries the kill
        for t in KNOWN[3:]:
            with db.transaction() as tx:
                for op, region, key, value in t:
                    getattr(tx, op)(region, key, *([value] if op == "set" else []))
        assert state_at(str(a))[0] == state_at(str(b))[0]
        assert pipeline.verify(str(a), str(b)).in_sync


def test_a_side_ahead_is_reported_with_its_count_not_as_equal(tmp_path):
    a = numbered(tmp_path / "A", "A", 10)
    b = replica_of(a, tmp_path / "B", "B", 7)
    rep = pipeline.verify(str(a), str(b))
    assert rep.engine == "local" and rep.seqno == 7 and rep.equal
    assert (rep.ahead, rep.ahead_by, rep.in_sync) == ("A", 3, False)
    assert "A is ahead by 3 transactions" in rep.summary()
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(b), str(a)])
    assert out.exit_code == 3, out.output
    assert "EQUAL at seqno 7" in out.output and "B is ahead by 3 transactions" in out.output
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(b), "--json"])
    d = json.loads(out.output)
    assert out.exit_code == 3 and d["ahead"] == "A" and d["ahead_by"] == 3 and d["end_b"] == 7


def test_a_transaction_only_b_holds_is_not_equal_at_b_end(tmp_path):
    # the case: B has one transaction A lacks; compared at B's end it is a difference
    a = numbered(tmp_path / "A", "A", 5)
    b = replica_of(a, tmp_path / "B", "B", 5)
    with multisite.open(b) as db:
        db.set("r", ("only-b",), 1)
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(b)])
    assert out.exit_code == 3 and "B is ahead by 1 transaction " in out.output, out.output
    with multisite.open(a) as db:  # A catches up with other content: different at seqno 6
        db.set("r", ("only-a",), 1)
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(b)])
    assert out.exit_code == 1 and "DIFFERENT at seqno 6" in out.output and "1 missing in A" in out.output


def test_in_sync_sides_exit_zero_and_differences_exit_one_with_a_parquet_file(tmp_path):
    a = build(tmp_path / "A", "A", KNOWN)
    b = build(tmp_path / "B", "B", KNOWN)
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(b)])
    assert out.exit_code == 0 and "EQUAL at seqno 5" in out.output and "ahead" not in out.output
    with multisite.open(b) as db:  # plant: one changed value, one extra key, one missing key
        db.store.put(db.store.regions["acct"].id, multisite.keys.encode_key(("a", 3)),
                     multisite.values.encode_value({"owner": "zz", "n": 3}))
        db.store.put(db.store.regions["log"].id, multisite.keys.encode_key(("new",)), multisite.values.encode_value(1))
        db.store.delete(db.store.regions["log"].id, multisite.keys.encode_key(("x", 2)))
        db.store.flush()
    rep = pipeline.verify(str(a), str(b), out=str(tmp_path / "diff"))
    assert (rep.different, rep.missing_in_a, rep.missing_in_b) == (1, 1, 1)
    assert [(r["difference"], r["key_text"]) for r in rep.sample] == [
        ("different", '("a",3)'), ("missing_in_a", '("new")'), ("missing_in_b", '("x",2)')]
    assert rep.sample[0]["value_b"] == '{"owner":"zz","n":3}'
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "diff").to_pylist()
    assert {(r["difference"], r["key_text"]) for r in t} == {(s["difference"], s["key_text"]) for s in rep.sample}
    assert CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(b)]).exit_code == 1


def test_at_past_an_end_is_refused(tmp_path):
    a = numbered(tmp_path / "A", "A", 3)
    out = CliRunner().invoke(cli, ["pipeline", "verify", str(a), str(a), "--at", "4"])
    assert out.exit_code == 1 and "ends at seqno 3" in out.output
