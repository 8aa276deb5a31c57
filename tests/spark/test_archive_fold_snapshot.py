"""``pipeline fold`` and ``pipeline snapshot`` with ``--archive``: an instance archived with ``multisite
journal archive`` and then pruned, so that the archive is the only place of its early seqnos, folds
into a far-behind replica and snapshots at an early seqno exactly as its unpruned copy does."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner
from test_archive_read import journaled

from multisite import pipeline
from multisite.cli.main import cli
from multisite.pipeline.plan import journal_bounds

STATE = ["region", "key_text", "value", "value_raw"]


def invoke(*args):
    out = CliRunner().invoke(cli, [str(a) for a in args])
    return out.exit_code, out.output + (str(out.exception) if out.exception else "")


def state_rows(spark, snap):
    return sorted(map(tuple, spark.read.parquet(str(snap / "state")).select(*STATE).collect()))


def test_fold_and_snapshot_read_the_pruned_seqnos_from_the_archive(spark, tmp_path):
    a = journaled(tmp_path / "A", 50)
    shutil.copytree(a, tmp_path / "B")  # far-behind replicas at seqno 50, holding A's transactions
    shutil.copytree(a, tmp_path / "B2")
    journaled(a, 350, start=51)
    unpruned = shutil.copytree(a, tmp_path / "U")
    arch = tmp_path / "arch"
    assert invoke("journal", "archive", a, "--to", arch, "--json")[0] == 0
    assert invoke("journal", "prune", a, "--before", 10**9)[0] == 0
    first, last = journal_bounds(str(a))
    assert first > 61 and last == 400  # the archive is the only place of seqnos 1..first-1

    # snapshot at an early seqno (before the store's): the journal from seqno 1, read from the archive
    code, out = invoke("pipeline", "snapshot", a, "--to", tmp_path / "refused", "--at", 60)
    assert code != 0 and "--archive" in out
    code, out = invoke("pipeline", "snapshot", a, "--to", tmp_path / "sA", "--at", 60, "--archive", arch, "--json")
    assert code == 0, out
    assert json.loads(out)["seqno"] == 60
    assert invoke("pipeline", "snapshot", unpruned, "--to", tmp_path / "sU", "--at", 60)[0] == 0
    assert state_rows(spark, tmp_path / "sA") == state_rows(spark, tmp_path / "sU")
    assert len(state_rows(spark, tmp_path / "sA")) == 40
    code, out = invoke("pipeline", "snapshot", arch, "--to", tmp_path / "sArch")
    assert code != 0 and "history" in out and f"--archive {arch}" in out  # an archive alone: refused, named

    # fold 51..400 into a replica at 50: seqnos 51..first-1 only in the archive
    code, out = invoke("pipeline", "fold", a, "--into", tmp_path / "B")
    assert code != 0 and "cannot fold 51..400" in out  # the gap, before the replica is touched
    code, out = invoke("pipeline", "fold", a, "--into", tmp_path / "B", "--archive", arch, "--json")
    assert code == 0, out
    rep = json.loads(out)
    assert (rep["from_seqno"], rep["to_seqno"]) == (51, 400)
    assert invoke("pipeline", "fold", unpruned, "--into", tmp_path / "B2")[0] == 0
    for other in (tmp_path / "B2", unpruned):
        v = pipeline.verify(str(tmp_path / "B"), str(other), engine="local")
        assert v.equal and not v.ahead and v.seqno == 400, v.summary()
    code, out = invoke("pipeline", "fold", arch, "--into", tmp_path / "B2")
    assert code != 0 and "history records" in out and f"--archive {arch}" in out
