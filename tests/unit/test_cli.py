"""The command line, through click's runner: help everywhere, JSON shapes, backup and prune."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.journal.reader import iter_records
from multisite.journal.segments import list_segments


def run(*args: str, ok: bool = True):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, res.output
    return res


def _walk(group: click.Group, path: tuple[str, ...] = ()):
    yield path, group
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, path + (name,))
        else:
            yield path + (name,), cmd


COMMANDS = list(_walk(cli))


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "multisite" for p, _ in COMMANDS])
def test_every_command_has_help_with_an_example(path, cmd):
    res = run(*path, "--help")
    assert "Usage:" in res.output
    assert (cmd.help or "").strip(), f"`multisite {' '.join(path)}` has no help text"
    if not isinstance(cmd, click.Group):
        assert "Example" in res.output, f"`multisite {' '.join(path)} --help` shows no example"


def test_the_expected_commands_exist():
    paths = {" ".join(p) for p, _ in COMMANDS}
    assert {"instance create", "instance show", "journal show", "journal prune", "backup", "demo"} <= paths


def test_instance_create_and_show_json(tmp_path):
    d = tmp_path / "A"
    res = run("instance", "create", d, "--name", "A", "--group", "bank", "--supplementary",
              "--durability", "group")
    assert "created instance A" in res.output
    info = json.loads(run("instance", "show", d, "--json").output)
    assert (info["name"], info["group"], info["supplementary"], info["role"], info["durability"]) == (
        "A", "bank", True, "primary", "group")
    assert info["journal_seqno"] == 0 and info["journal_segments"] == 1
    assert [(h["start_seqno"], h["root_primary"], h["role"]) for h in info["history"]] == [(1, "A", "originating")]
    assert info["slots"] == {}
    with multisite.open(d) as db:
        db.create_region("r")
        db.set("r", ("k",), 1)
        db.update_info(lambda i: setattr(i.slot("B"), "last_confirmed", 1))
    info = json.loads(run("instance", "show", d, "--json").output)
    assert info["journal_seqno"] == 1 and info["seqno"] == 1
    assert info["slots"]["B"]["last_confirmed"] == 1
    text = run("instance", "show", d).output
    assert "A" in text and "bank" in text and "originating" in text


def test_errors_print_one_line_and_exit_1(tmp_path):
    d = tmp_path / "A"
    run("instance", "create", d, "--name", "A")
    res = run("instance", "create", d, "--name", "A", ok=False)
    assert res.exit_code == 1 and "INSTANCE_EXISTS" in res.output and "Traceback" not in res.output
    (tmp_path / "empty").mkdir()
    res = run("instance", "show", tmp_path / "empty", ok=False)
    assert res.exit_code == 1 and "NOT_AN_INSTANCE" in res.output


@pytest.fixture
def filled(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("acct")
        db.create_region("local", replicated=False)
        db.set("acct", ("a", 1), {"n": 1})
        with db.transaction() as tx:
            tx.set("acct", ("a", 1), {"n": 2})
            tx.set("acct", ("a", 2), "two")
            tx.zkill("acct", ("b",))
        db.kill("acct", ("a",))
        for i in range(250):
            db.set("acct", ("bulk", i), {"i": i, "pad": "x" * 40})
        db.set("local", ("x",), "not journaled")
    return root


def test_journal_show_json(filled):
    lines = run("journal", "show", filled, "--json").output.splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["seqno"] for r in recs] == list(range(1, 254))
    assert recs[0]["origin"] == "A" and recs[0]["stream"] == 0
    assert recs[0]["updates"] == [{"op": "set", "region": "acct", "key": ["a", 1], "value": {"n": 1},
                                   "before": None}]
    assert recs[1]["updates"] == [
        {"op": "set", "region": "acct", "key": ["a", 1], "value": {"n": 2}, "before": {"n": 1}},
        {"op": "set", "region": "acct", "key": ["a", 2], "value": "two", "before": None},
        {"op": "zkill", "region": "acct", "key": ["b"], "before": None}]
    assert recs[2]["updates"] == [{"op": "kill", "region": "acct", "key": ["a"],
                                   "killed": [[["a", 1], {"n": 2}], [["a", 2], "two"]]}]
    part = [json.loads(x) for x in run("journal", "show", filled, "--from", 10, "--to", 12, "--json")
            .output.splitlines()]
    assert [r["seqno"] for r in part] == [10, 11, 12]


def test_journal_show_text(filled):
    out = run("journal", "show", filled, "--from", 2, "--to", 3).output
    assert "TXN seqno=2" in out and "TXN seqno=3" in out and "seqno=4" not in out
    assert 'SET   acct("a",1)={"n":2}  before={"n":1}' in out
    assert 'KILL  acct("a")  removed=2 node(s)' in out


@pytest.mark.parametrize("live", [False, True], ids=["closed", "live"])
def test_backup_opens_with_the_same_data(filled, tmp_path, live):
    with multisite.open(filled) as src:
        expected = {r: list(src.items(r)) for r in ("acct", "local")}
        seqno = src.seqno
        if live:  # commits the store has not flushed yet, and an owner holding the instance
            for i in range(20):
                src.set("acct", ("live", i), i)
            expected["acct"] = list(src.items("acct"))
            seqno = src.seqno
            res = run("backup", filled, tmp_path / "copy")
    if not live:
        res = run("backup", filled, tmp_path / "copy")
    assert "backed up to" in res.output
    with multisite.open(tmp_path / "copy") as copy:
        assert copy.seqno == seqno
        assert copy.name == "A"
        assert {r: list(copy.items(r)) for r in ("acct", "local")} == expected
        copy.set("acct", ("after-backup",), 1)  # a working instance
        assert copy.seqno == seqno + 1
    assert [r.seqno for r in iter_records(tmp_path / "copy" / "journal")] == list(range(1, seqno + 2))
    with multisite.open(filled) as src:  # the source is untouched by the copy's writes
        assert src.seqno == seqno and src.get("acct", ("after-backup",)) is None


def test_backup_refuses_a_non_empty_destination(filled, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    res = run("backup", filled, tmp_path / "busy", ok=False)
    assert res.exit_code == 1 and "INSTANCE_EXISTS" in res.output


def _segments(root):
    """(name, first seqno, last seqno) of each segment; the newest one's last is the journal's last."""
    infos = list_segments(root / "journal")
    last = max(r.seqno for r in iter_records(root / "journal", infos[-1].first_seqno))
    lasts = [n.first_seqno - 1 for n in infos[1:]] + [last]
    return [(i.path.name, i.first_seqno, lst) for i, lst in zip(infos, lasts)]


def test_journal_prune_removes_only_whole_segments_below_before(filled):
    segs = _segments(filled)
    assert len(segs) >= 5
    before = segs[2][2]  # the third segment's last seqno: it holds `before` itself, so it stays
    res = run("journal", "prune", filled, "--before", before)
    assert "removed 2 segment(s)" in res.output
    assert _segments(filled) == segs[2:]
    assert not run("journal", "prune", filled, "--before", before).output.startswith("removed 1")
    before = segs[3][2] + 1  # the fourth segment is now wholly below: it goes
    run("journal", "prune", filled, "--before", before)
    assert _segments(filled) == segs[4:]
    recs = [json.loads(x) for x in run("journal", "show", filled, "--json").output.splitlines()]
    assert recs[0]["seqno"] == segs[4][1] and recs[-1]["seqno"] == segs[-1][2]
    with multisite.open(filled) as db:  # still opens, with all its data
        assert db.seqno == segs[-1][2] and db.get("acct", ("bulk", 249))["i"] == 249


def test_journal_prune_keeps_what_a_slot_still_needs_and_never_the_newest(filled):
    segs = _segments(filled)
    confirmed = segs[1][1]  # the slot has confirmed the second segment's first seqno only
    with multisite.open(filled) as db:
        db.update_info(lambda i: setattr(i.slot("B"), "last_confirmed", confirmed))
    res = run("journal", "prune", filled, "--before", 10**9)
    assert "removed 1 segment(s)" in res.output and "'B'" in res.output
    assert _segments(filled) == segs[1:]
    with multisite.open(filled) as db:
        db.update_info(lambda i: setattr(i.slot("B"), "last_confirmed", 10**9))
    run("journal", "prune", filled, "--before", 10**9)
    assert _segments(filled) == segs[-1:]  # everything below, never the newest segment
    run("journal", "prune", filled, "--before", 10**9)
    assert _segments(filled) == segs[-1:]


def test_journal_prune_keeps_what_the_store_has_not_flushed(filled, monkeypatch):
    from multisite.engine import core as engine_core
    from multisite.instance.layout import Layout
    from multisite.instance.maintenance import store_seqno

    monkeypatch.setattr(engine_core, "STORE_FLUSH_INTERVAL_S", 3600.0)  # no timed flush on a slow machine
    with multisite.open(filled) as db:  # an owner whose store lags its journal
        for i in range(300):
            db.set("acct", ("more", i), {"pad": "y" * 60})
        flushed = store_seqno(Layout(filled))
        assert flushed < db.seqno - 100, "precondition: the store should lag the journal here"
        before = _segments(filled)
        run("journal", "prune", filled, "--before", 10**9)
        after = _segments(filled)
        removed = before[: len(before) - len(after)]
        assert all(last < flushed + 1 for _, _, last in removed)
        assert after[0][1] <= flushed + 1
    with multisite.open(filled) as db:
        assert db.get("acct", ("more", 299)) == {"pad": "y" * 60}


def test_journal_prune_rejects_a_bad_seqno(filled):
    res = run("journal", "prune", filled, "--before", 0, ok=False)
    assert res.exit_code == 1 and "CONFIG" in res.output
