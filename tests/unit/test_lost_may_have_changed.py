"""$ZQGBLMOD as a public API and command: ``multisite.LostFile(...).may_have_changed`` and
``multisite lost may-have-changed FILE REGION KEY``, the README's replay example, and bad input
(a missing file, a damaged file, a bad key) refused with one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import ConfigError, KeyTypeError, LostFileCorrupt
from multisite.journal.lostfile import write_lost_file
from multisite.journal.reader import iter_records


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def lost_path(db, tmp_path):
    """Lost transactions 4..6: set acct(a,1), kill acct(b), zkill acct(c,1)."""
    db.set("acct", ("a", 1), "old")
    db.set("acct", ("b", 1), 1)
    db.set("acct", ("c", 1), 1)
    first = db.seqno + 1
    db.set("acct", ("a", 1), "lost")
    db.kill("acct", ("b",))
    db.zkill("acct", ("c", 1))
    return write_lost_file(tmp_path, instance="A", group="g", common_seqno=first - 1, reason="t",
                           records=list(iter_records(db.layout.journal, first)))


def test_the_package_exports_lost_files(lost_path):
    assert {"LostFile", "list_lost_files"} <= set(multisite.__all__)
    assert multisite.list_lost_files(lost_path.parent) == [lost_path]
    lf = multisite.LostFile.read(lost_path)
    assert lf.may_have_changed("acct", ("a", 1)) and lf.may_have_changed("acct", ["b", 1, "x"])
    assert not lf.may_have_changed("acct", ("a", 2)) and not lf.may_have_changed("other", ("a", 1))
    assert lf.changes_to("acct", ("b", 7)) == [{"seqno": 5, "op": "kill", "key": ["b"]}]
    assert lf.changes_to("acct", ("c", 1, "below a zkill")) == []


def test_a_bad_key_or_region_is_a_key_type_error(lost_path):
    lf = multisite.LostFile.read(lost_path)
    for bad in ((), ("a", 1.5), ("a", True), "a", None):
        with pytest.raises(KeyTypeError):
            lf.may_have_changed("acct", bad)
    with pytest.raises(KeyTypeError, match="region"):
        lf.may_have_changed(None, ("a", 1))


def test_the_cli_says_yes_and_why(lost_path):
    res = run("lost", "may-have-changed", lost_path, "acct", '["b", 7]')
    assert res.exit_code == 0 and res.output.startswith("yes:"), res.output
    assert "kill acct(\"b\") at seqno 5" in res.output
    res = run("lost", "may-have-changed", lost_path, "acct", '("a",2)')  # the text form the CLI prints
    assert res.exit_code == 0 and res.output.startswith("no:"), res.output


def test_the_cli_json_shape(lost_path):
    res = run("lost", "may-have-changed", lost_path, "acct", '["a", 1]', "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"file": str(lost_path), "region": "acct", "key": ["a", 1], "on": None,
                                      "may_have_changed": True,
                                      "changes": [{"seqno": 4, "op": "set", "key": ["a", 1]}]}
    out = json.loads(run("lost", "may-have-changed", lost_path, "acct", '["d"]', "--json").output)
    assert out["may_have_changed"] is False and out["changes"] == []


def test_zqgblmod_asks_the_instance_that_went_on_after_the_common_seqno(lost_path, tmp_path):
    """GT.M's question: did the instance that went on change the key after the fork? The new
    primary B holds the common history 1..3, then its own updates of (a,1) and of the subtree (b)."""
    b = multisite.create(tmp_path / "B", name="B", durability="none")
    with multisite.open(b) as nb:
        nb.create_region("acct")
        for k in (("a", 1), ("b", 1), ("c", 1)):
            nb.set("acct", k, "common")
        nb.set("acct", ("a", 1), "B's own")
        nb.kill("acct", ("b",))
    lf = multisite.LostFile.read(lost_path)
    assert lf.header["common_seqno"] == 3
    assert lf.changed_on(b, "acct", ("a", 1)) == [{"seqno": 4, "op": "set", "key": ["a", 1]}]
    assert lf.changed_on(b, "acct", ("b", 1, "x")) == [{"seqno": 5, "op": "kill", "key": ["b"]}]
    assert lf.changed_on(b, "acct", ("c", 1)) == []  # set at seqno 3, the common point: no conflict
    res = run("lost", "may-have-changed", lost_path, "acct", '["c", 1]', "--on", b)
    assert res.exit_code == 0 and res.output.startswith("no:") and "after common seqno 3" in res.output, res.output
    out = json.loads(run("lost", "may-have-changed", lost_path, "acct", '["a", 1]', "--on", b, "--json").output)
    assert out["on"] == str(b) and out["changes"] == [{"seqno": 4, "op": "set", "key": ["a", 1]}]
    with pytest.raises(ConfigError, match="not an instance directory"):
        lf.changed_on(tmp_path / "nowhere", "acct", ("a", 1))


@pytest.mark.parametrize("key,code", [("a", "CONFIG"), ("{\"a\": 1}", "CONFIG"), ("[]", "KEY_TYPE"),
                                      ("[1.5]", "KEY_TYPE"), ("[\"a\", null]", "KEY_TYPE"), ("", "CONFIG")])
def test_the_cli_refuses_a_bad_key_in_one_line(lost_path, key, code):
    res = run("lost", "may-have-changed", lost_path, "acct", key)
    assert res.exit_code == 1 and res.output.startswith(f"error: {code}:"), res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_the_cli_refuses_a_missing_or_damaged_file(lost_path, tmp_path):
    res = run("lost", "may-have-changed", tmp_path / "missing.mslost", "acct", '["a"]')
    assert res.exit_code == 1 and res.output.startswith("error: CONFIG:") and "not a lost-transaction file" in res.output
    data = bytearray(lost_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    lost_path.write_bytes(bytes(data))
    with pytest.raises(LostFileCorrupt):
        multisite.LostFile.read(lost_path)
    res = run("lost", "may-have-changed", lost_path, "acct", '["a"]')
    assert res.exit_code == 1 and res.output.startswith("error: LOST_FILE_CORRUPT:"), res.output
    with pytest.raises(ConfigError):
        multisite.LostFile.read(tmp_path / "missing.mslost")


def replay(db, lost: multisite.LostFile) -> list[int]:
    """The README's replay loop; returns the seqnos left for review."""
    review = []
    for t in lost.transactions:
        ups = t["updates"]
        if all(u["op"] == "set" and not lost.changed_on(db.layout.root, u["region"], u["key"]) for u in ups):
            with db.transaction() as tx:
                for u in ups:
                    tx.set(u["region"], tuple(u["key"]), u["value"])
        else:
            review.append(t["seqno"])
    return review


@pytest.mark.parametrize("changed_since", [False, True])
def test_the_readme_replay_example(lost_path, tmp_path, changed_since):
    """On a new primary at the common point: the lost set re-applies unless the key changed since;
    the kill and the zkill are left to business logic."""
    with multisite.open(multisite.create(tmp_path / "B", name="B", durability="none")) as b:
        b.create_region("acct")
        for k, v in ((("a", 1), "old"), (("b", 1), 1), (("c", 1), 1)):
            b.set("acct", k, v)
        if changed_since:
            b.set("acct", ("a", 1), "new on B")
        lost = multisite.LostFile.read(lost_path)
        assert replay(b, lost) == ([4, 5, 6] if changed_since else [5, 6])
        assert b.get("acct", ("a", 1)) == ("new on B" if changed_since else "lost")


def test_zqgblmod_after_an_si_rollback_compares_the_originating_groups_numbering(tmp_path):
    """An SI rollback's common seqno is one of the originating primary P's: asked of P, P's later
    seqnos count; asked of the supplementary instance S itself, its stream's later stream seqnos do
    (not its own local transactions, whose seqnos are another numbering)."""
    p = multisite.create(tmp_path / "P", name="P", group="g1", durability="none")
    with multisite.open(p) as pd:
        pd.create_region("acct")
        for i in range(1, 6):
            pd.set("acct", ("k", i), i)  # P's seqnos 1..5
    s = multisite.create(tmp_path / "S", name="S", group="g2", supplementary=True, durability="none")
    with multisite.open(s) as sd:
        sd.create_region("acct")
        sd.set("acct", ("local",), "mine")  # S's own transaction: stream 0, local seqno 1
        sd.apply_records(list(iter_records(p / "journal", 1, 5)), si_stream=1)  # stream 1, seqnos 1..5 of P
    lost = multisite.LostFile.read(write_lost_file(  # what an SI rollback to P's seqno 3 would write
        tmp_path, instance="S", group="g2", common_seqno=3, reason="t", records=list(iter_records(s / "journal", 5)),
        si_streams={1: "g1"}, common_stream=1))
    assert lost.header["common_seqno_stream"] == 1
    assert [c["seqno"] for c in lost.changed_on(p, "acct", ("k", 4))] == [4]  # P's seqno 4 > 3
    assert lost.changed_on(p, "acct", ("k", 2)) == []
    on_s = lost.changed_on(s, "acct", ("k", 4))  # S's stream 1 record of P's seqno 4: S's local seqno 5
    assert [c["seqno"] for c in on_s] == [5]
    assert lost.changed_on(s, "acct", ("k", 3)) == []  # stream seqno 3: at the common point
    assert lost.changed_on(s, "acct", ("local",)) == []  # S's own: not of the originating group
