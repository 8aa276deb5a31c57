"""The command line, through click's runner: help everywhere, JSON shapes, journal show and its ranges,
backup and prune, and bad input refused with one clear line before any server, file or Spark sees it."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.instance.maintenance import prune
from multisite.journal.reader import iter_records
from multisite.journal.segments import list_segments
from multisite.testing.checks import filled_instance


def run(*args: object, ok: bool = True):
    # catch_exceptions=False: a traceback fails the test as the exception it was
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


def test_every_pipeline_command_has_help_with_an_example():
    r = CliRunner()
    for name in ("export", "snapshot", "seed", "verify", "fold"):
        out = r.invoke(cli, ["pipeline", name, "--help"])
        assert out.exit_code == 0 and "Example:" in out.output


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


# `journal show` ranges that select nothing: a clear error, never a silent empty extract.


@pytest.fixture
def journal(tmp_path):
    """A closed instance of 60 records in small segments."""
    return filled_instance(tmp_path / "A", 60)


@pytest.mark.parametrize("args,code,words", [
    (["--from", "61"], "CONFIG", ["--from 61", "last seqno is 60"]),
    (["--from", "1000", "--to", "2000"], "CONFIG", ["past the end", "60"]),
    (["--from", "10", "--to", "5"], "CONFIG", ["--to 5 is before --from 10"]),
    (["--from", "0"], "CONFIG", ["positive"]),
    (["--to", "-1"], "CONFIG", ["positive"]),
])
def test_an_empty_or_impossible_range_is_an_error(journal, args, code, words):
    res = run("journal", "show", journal, *args, ok=False)
    assert res.exit_code == 1, res.output
    assert f"error: {code}" in res.output
    for w in words:
        assert w in res.output


def test_a_range_that_was_pruned_is_a_gap(journal):
    rep = prune(journal, 40)
    assert rep.removed and rep.kept_from_seqno > 1
    res = run("journal", "show", journal, "--to", rep.kept_from_seqno - 1, ok=False)
    assert res.exit_code == 1 and "JOURNAL_GAP" in res.output and "pruned" in res.output
    res = run("journal", "show", journal, "--from", 1, ok=False)
    assert res.exit_code == 1 and "JOURNAL_GAP" in res.output


def test_ranges_inside_the_journal_still_work(journal):
    res = run("journal", "show", journal, "--from", 60, "--to", 70, "--json")
    assert res.exit_code == 0 and res.output.count("\n") == 1 and '"seqno": 60' in res.output
    res = run("journal", "show", journal, "--from", 5, "--to", 5, "--json")
    assert res.exit_code == 0 and res.output.count("\n") == 1
    empty = multisite.create(journal.parent / "E", name="E")
    res = run("journal", "show", empty)
    assert res.exit_code == 0 and res.output == ""


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


# Bad input at the command line: each is refused with one clear line before any server, file or Spark
# sees it, never a traceback, never accepted and left to fail later (or forever) in the background.


def refused(res, option: str) -> None:
    """Exit 1 (``error: CONFIG: --opt: …``) or 2 (click's usage error), naming the option, before any server
    is asked (the unit tier runs none: asking would be "no instance server is running")."""
    assert res.exit_code in (1, 2), res.output
    assert option in res.output, res.output
    assert "Traceback" not in res.output and "no instance server" not in res.output, res.output


@pytest.mark.parametrize("opt,value", [("--segment-mib", "0"), ("--segment-mib", "-5"),
                                       ("--journal-pool-mib", "0"), ("--journal-pool-mib", "-1"),
                                       ("--segment-mib", "99999999999999999")])
def test_create_refuses_sizes_out_of_range(tmp_path, opt, value):
    # was: a segment size of 0 or -5 MiB created an instance (exit 0) that no open could then open
    # ("segment_bytes must be at least 4096"); the huge one was an OverflowError traceback that left a
    # half-made directory `create` then refused; a pool of 0 or -1 MiB was stored as given
    res = run("instance", "create", tmp_path / "X", "--name", "X", opt, value, ok=False)
    refused(res, opt)
    assert not (tmp_path / "X").exists()
    res = run("instance", "create", tmp_path / "X", "--name", "X", opt, "1")
    assert res.exit_code == 0, res.output
    multisite.open(tmp_path / "X").close()


SECONDARY_CMDS = [("source", "status"), ("source", "showbacklog"), ("source", "stop"), ("source", "activate"),
                  ("source", "deactivate"), ("source", "start", "--connect", "127.0.0.1:7100")]


@pytest.mark.parametrize("cmd", SECONDARY_CMDS, ids=[" ".join(c[:2]) for c in SECONDARY_CMDS])
@pytest.mark.parametrize("name", ["", "a/b"])
def test_secondary_names_are_checked(inst, cmd, name):
    # was: a source server for '' started; `source status --secondary ''` got every source's status
    # back and died on KeyError: 'secondary'
    refused(run(*cmd[:2], inst, "--secondary", name, *cmd[2:], ok=False), "--secondary")


@pytest.mark.parametrize("args,option", [
    (("source", "start", "{d}", "--secondary", "B", "--connect", "127.0.0.1:99999"), "--connect"),
    (("source", "start", "{d}", "--secondary", "B", "--connect", "127.0.0.1:0"), "--connect"),
    (("source", "activate", "{d}", "--secondary", "B", "--connect", ""), "--connect"),
    (("source", "activate", "{d}", "--secondary", "B", "--connect", "h:70000"), "--connect"),
    (("receiver", "start", "{d}", "--listen", "127.0.0.1:99999"), "--listen"),
    (("receiver", "start", "{d}", "--listen", "nocolon"), "--listen"),
    (("rollback", "{d}", "--fetchresync", ""), "--fetchresync"),
    (("rollback", "{d}", "--fetchresync", "127.0.0.1:99999"), "--fetchresync"),
])
def test_host_port_is_checked(inst, args, option):
    # was: port 99999 accepted (the source retried an OverflowError forever, exit 0), an empty
    # --connect silently ignored, an empty --fetchresync "give exactly one of --resync or --fetchresync"
    res = run(*[str(inst) if a == "{d}" else a for a in args], ok=False)
    refused(res, option)
    assert "expected HOST:PORT" in res.output or "not in 1..65535" in res.output or "not in 0..65535" in res.output


SECONDS = [("source", "start", "{d}", "--secondary", "B", "--connect", "h:1", "--heartbeat-interval"),
           ("source", "start", "{d}", "--secondary", "B", "--connect", "h:1", "--heartbeat-timeout"),
           ("source", "start", "{d}", "--secondary", "B", "--connect", "h:1", "--stats-interval"),
           ("receiver", "start", "{d}", "--listen", "127.0.0.1:0", "--stats-interval"),
           ("source", "stop", "{d}", "--secondary", "B", "--timeout"),
           ("pipeline", "export", "{d}", "--to", "{d}/../exp", "--follow", "--interval")]


@pytest.mark.parametrize("args", SECONDS, ids=[f"{a[0]} {a[1]} {a[-1]}" for a in SECONDS])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308"])
def test_durations_are_checked(inst, args, value):
    # was: --stats-interval 0 logged in a busy loop (100k lines in 3 s, a CPU at 100%), nan made
    # heartbeats fail silently, --timeout nan/inf/1e308 a ValueError/OverflowError traceback
    res = run(*[a.replace("{d}", str(inst)) for a in args], value, ok=False)
    refused(res, args[-1])


@pytest.mark.parametrize("opt", ["--heartbeat-interval", "--stats-interval"])
def test_zero_intervals_are_refused(inst, opt):
    refused(run("source", "start", inst, "--secondary", "B", "--connect", "h:1", opt, "0", ok=False), opt)


def test_a_heartbeat_interval_past_the_timeout_is_refused(inst):
    # was: accepted; the source dropped and remade its connection every interval, forever
    res = run("source", "start", inst, "--secondary", "B", "--connect", "h:1", "--heartbeat-interval", "3",
              "--heartbeat-timeout", "1", ok=False)
    refused(res, "--heartbeat-interval")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_receive_pool_must_hold_something(inst, value):
    # was: accepted; with -1 the receiver sent XOFF after the first transaction and never XON
    refused(run("receiver", "start", inst, "--listen", "127.0.0.1:0", "--receive-pool-mib", value, ok=False),
            "--receive-pool-mib")


def test_rollback_to_a_negative_seqno_says_so(inst):
    # was: "--resync -1 is past the end of A, which is at seqno 0"
    res = run("rollback", inst, "--resync", "-1", ok=False)
    refused(res, "ROLLBACK: --resync -1 is not a seqno")
    assert "past the end" not in res.output


@pytest.fixture
def no_spark(monkeypatch):
    import multisite.pipeline.env as env

    def session(*a, **kw):
        raise AssertionError("Spark was started for a command that should have been refused first")

    monkeypatch.setattr(env, "session", session)


@pytest.mark.parametrize("args,option", [
    (("pipeline", "snapshot", "{d}", "--to", "{t}/snap", "--at", "-1"), "--at"),
    (("pipeline", "verify", "{d}", "{d}", "--at", "-1"), "--at"),
    (("pipeline", "fold", "{d}", "--into", "{d}", "--from", "0"), "--from"),
    (("pipeline", "fold", "{d}", "--into", "{d}", "--to", "-1"), "--to"),
])
def test_pipeline_seqnos_are_checked(inst, tmp_path, no_spark, args, option):
    # was: `pipeline snapshot --at -1` wrote a snapshot "at seqno -1", exit 0
    refused(run(*[a.format(d=inst, t=tmp_path) for a in args], ok=False), option)


@pytest.mark.parametrize("args", [
    ("pipeline", "export", "{n}", "--to", "{t}/exp"),
    ("pipeline", "snapshot", "{n}", "--to", "{t}/snap"),
    ("pipeline", "verify", "{d}", "{n}"),
    ("pipeline", "fold", "{d}", "--into", "{n}"),
    ("pipeline", "snapshot", "{d}", "--to", "{n}"),
], ids=["export", "snapshot", "verify", "fold", "snapshot-dest"])
def test_pipeline_checks_its_directories_before_starting_spark(inst, tmp_path, no_spark, args):
    # was: Spark started (some 10 s) before the directory was looked at
    notinst = tmp_path / "notinst"
    notinst.mkdir()
    (notinst / "x").write_text("x")
    res = run(*[a.format(d=inst, t=tmp_path, n=notinst) for a in args], ok=False)
    assert res.exit_code == 1, res.output
    assert str(notinst) in res.output and ("NOT_AN_INSTANCE" in res.output or "not empty" in res.output)


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path, monkeypatch):
    # was: the acts failed on what was already there ("demo finished: FAILED", or INSTANCE_EXISTS on
    # a subfolder), and an instance's own directory got the demo's instances written into it
    import multisite.demo as scenario

    monkeypatch.setattr(scenario, "run", lambda **kw: pytest.fail("the demo ran"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "A").mkdir()
    res = run("demo", "--workdir", tmp_path / "w", ok=False)
    assert res.exit_code == 1 and "not empty" in res.output and str(tmp_path / "w") in res.output, res.output


def _zero_a_frame_inside_the_newest_segment(root) -> None:
    """A lost write in the newest segment with intact records after it (as after a power loss)."""
    from multisite.journal.segments import SegmentView

    tail = list_segments(root / "journal")[-1]
    with SegmentView(tail) as v:
        frames = list(v.frames(tail=True))
    off, hdr = frames[len(frames) // 2]
    data = bytearray(tail.path.read_bytes())
    data[off:off + hdr.total] = bytes(hdr.total)
    tail.path.write_bytes(bytes(data))


@pytest.mark.parametrize("args", [("journal", "show", "{root}"), ("instance", "show", "{root}"),
                                  ("backup", "{root}", "{copy}")], ids=["journal-show", "instance-show", "backup"])
def test_damage_in_the_newest_segment_says_how_to_repair_it_everywhere(filled, tmp_path, args):
    # As opening does: every command that checks the newest segment names `multisite journal repair`.
    _zero_a_frame_inside_the_newest_segment(filled)
    res = run(*[a.format(root=filled, copy=tmp_path / "copy") for a in args], ok=False)
    assert res.exit_code == 1 and "JOURNAL_CORRUPT" in res.output, res.output
    assert f"multisite journal repair {filled}" in res.output, res.output


def test_journal_archive_drop_forgets_an_archive_so_prune_no_longer_waits_for_it(tmp_path):
    # An archive given up kept its mark for ever: prune then kept every segment past what it held,
    # and no command removed the mark.
    from multisite.instance import archives
    from multisite.instance.layout import Layout

    root = filled_instance(tmp_path / "A", 300)
    lay = Layout.existing(root)
    archives.record(lay, "s3://gone/A", 5)
    assert prune(root, 200).limit_seqno == 6
    refused = CliRunner().invoke(cli, ["journal", "archive", str(root), "--drop", "s3://other/A"])
    assert refused.exit_code != 0 and "s3://gone/A" in refused.output
    run("journal", "archive", root, "--drop", "s3://gone/A")
    assert archives.load_all(lay) == []
    assert prune(root, 200).limit_seqno == 200
    nourl = CliRunner().invoke(cli, ["journal", "archive", str(root)])
    assert nourl.exit_code != 0 and "--to URL" in nourl.output


@pytest.mark.parametrize("option", ["--interval", "--rate-bytes-per-s"])
def test_journal_archive_refuses_a_negative_interval_or_rate_before_copying(tmp_path, option):
    # --interval -1 copied everything, then died on time.sleep(-1) with a traceback; a negative rate was
    # taken for no limit.
    root = filled_instance(tmp_path / "A", 10)
    res = CliRunner().invoke(cli, ["journal", "archive", str(root), "--to", str(tmp_path / "arch"), "--follow",
                                   option, "-1"])
    assert res.exit_code == 2 and option in res.output, res.output
    assert not (tmp_path / "arch").exists()
