"""`multisite journal show` ranges that select nothing: a clear error, never a silent empty extract."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import multisite
from multisite.testing.checks import filled_instance
from multisite.cli.main import cli
from multisite.instance.maintenance import prune


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def journal(tmp_path):
    return filled_instance(tmp_path / "A", 60)


@pytest.mark.parametrize("args,code,words", [
    (["--from", "61"], "CONFIG", ["--from 61", "last seqno is 60"]),
    (["--from", "1000", "--to", "2000"], "CONFIG", ["past the end", "60"]),
    (["--from", "10", "--to", "5"], "CONFIG", ["--to 5 is before --from 10"]),
    (["--from", "0"], "CONFIG", ["positive"]),
    (["--to", "-1"], "CONFIG", ["positive"]),
])
def test_an_empty_or_impossible_range_is_an_error(journal, args, code, words):
    res = run("journal", "show", journal, *args)
    assert res.exit_code == 1, res.output
    assert f"error: {code}" in res.output
    for w in words:
        assert w in res.output


def test_a_range_that_was_pruned_is_a_gap(journal):
    rep = prune(journal, 40)
    assert rep.removed and rep.kept_from_seqno > 1
    res = run("journal", "show", journal, "--to", rep.kept_from_seqno - 1)
    assert res.exit_code == 1 and "JOURNAL_GAP" in res.output and "pruned" in res.output
    res = run("journal", "show", journal, "--from", 1)
    assert res.exit_code == 1 and "JOURNAL_GAP" in res.output


def test_ranges_inside_the_journal_still_work(journal):
    res = run("journal", "show", journal, "--from", 60, "--to", 70, "--json")
    assert res.exit_code == 0 and res.output.count("\n") == 1 and '"seqno": 60' in res.output
    res = run("journal", "show", journal, "--from", 5, "--to", 5, "--json")
    assert res.exit_code == 0 and res.output.count("\n") == 1
    empty = multisite.create(journal.parent / "E", name="E")
    res = run("journal", "show", empty)
    assert res.exit_code == 0 and res.output == ""
