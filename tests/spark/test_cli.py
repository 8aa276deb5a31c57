"""The pipeline commands on a real SparkSession: JSON output, verify's exit status."""

from __future__ import annotations

import json

from click.testing import CliRunner

import multisite
from conftest import KNOWN, build
from multisite.cli.main import cli


def test_export_snapshot_seed_verify_from_the_command_line(spark, tmp_path, known):
    r = CliRunner()
    out = r.invoke(cli, ["pipeline", "export", str(known), "--to", str(tmp_path / "lake"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["to_seqno"] == 5
    assert r.invoke(cli, ["pipeline", "snapshot", str(known), "--to", str(tmp_path / "s"), "--json"]).exit_code == 0
    out = r.invoke(cli, ["pipeline", "seed", str(tmp_path / "s"), "--into", str(tmp_path / "C"), "--name", "C",
                         "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["keys"] == 3
    out = r.invoke(cli, ["pipeline", "verify", str(known), str(tmp_path / "C"), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["equal"] is True
    other = build(tmp_path / "B", "B", KNOWN[:4])
    with multisite.open(other) as db:
        db.set("log", ("extra",), 1)
    out = r.invoke(cli, ["pipeline", "verify", str(known), str(other), "--at", "5"])
    assert out.exit_code == 1 and "DIFFERENT" in out.output
