"""Bad input at the command line: each is refused with one clear line before any server, file or Spark
sees it, never a traceback, never accepted and left to fail later (or forever) in the background."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli


def run(*args: object):
    # catch_exceptions=False: a traceback fails the test as the exception it was
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


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
    res = run("instance", "create", tmp_path / "X", "--name", "X", opt, value)
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
    refused(run(*cmd[:2], inst, "--secondary", name, *cmd[2:]), "--secondary")


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
    res = run(*[str(inst) if a == "{d}" else a for a in args])
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
    res = run(*[a.replace("{d}", str(inst)) for a in args], value)
    refused(res, args[-1])


@pytest.mark.parametrize("opt", ["--heartbeat-interval", "--stats-interval"])
def test_zero_intervals_are_refused(inst, opt):
    refused(run("source", "start", inst, "--secondary", "B", "--connect", "h:1", opt, "0"), opt)


def test_a_heartbeat_interval_past_the_timeout_is_refused(inst):
    # was: accepted; the source dropped and remade its connection every interval, forever
    res = run("source", "start", inst, "--secondary", "B", "--connect", "h:1", "--heartbeat-interval", "3",
              "--heartbeat-timeout", "1")
    refused(res, "--heartbeat-interval")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_receive_pool_must_hold_something(inst, value):
    # was: accepted; with -1 the receiver sent XOFF after the first transaction and never XON
    refused(run("receiver", "start", inst, "--listen", "127.0.0.1:0", "--receive-pool-mib", value),
            "--receive-pool-mib")


def test_rollback_to_a_negative_seqno_says_so(inst):
    # was: "--resync -1 is past the end of A, which is at seqno 0"
    res = run("rollback", inst, "--resync", "-1")
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
    refused(run(*[a.format(d=inst, t=tmp_path) for a in args]), option)


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
    res = run(*[a.format(d=inst, t=tmp_path, n=notinst) for a in args])
    assert res.exit_code == 1, res.output
    assert str(notinst) in res.output and ("NOT_AN_INSTANCE" in res.output or "not empty" in res.output)


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path, monkeypatch):
    # was: the acts failed on what was already there ("demo finished: FAILED", or INSTANCE_EXISTS on
    # a subfolder), and an instance's own directory got the demo's instances written into it
    import multisite.demo as scenario

    monkeypatch.setattr(scenario, "run", lambda **kw: pytest.fail("the demo ran"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "A").mkdir()
    res = run("demo", "--workdir", tmp_path / "w")
    assert res.exit_code == 1 and "not empty" in res.output and str(tmp_path / "w") in res.output, res.output
