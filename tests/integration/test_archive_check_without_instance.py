"""``journal archive --check`` reads only the archive: it runs where the instance directory is not
(another host, the instance gone), given the archive by ``--to URL`` or as its one argument."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from multisite.cli.main import cli
from multisite.pipeline.archive import archive

from .test_journal_archive import journaled, sealed


def test_check_needs_no_instance_directory(tmp_path):
    # DIR was a required argument that must exist, although --check never reads it.
    a = journaled(tmp_path / "A", 150)
    segs, _ = sealed(a)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    shutil.rmtree(a)
    r = CliRunner()
    for argv in (["--check", "--to", str(dest)], ["--check", str(dest)], ["--check", "--to", f"file://{dest}"]):
        out = r.invoke(cli, ["journal", "archive", *argv])
        assert out.exit_code == 0 and "0 damaged" in out.output, (argv, out.output)
    (dest / "segments" / segs[0].path.name).unlink()
    out = r.invoke(cli, ["journal", "archive", "--check", str(dest)])
    assert out.exit_code == 1 and segs[0].path.name in out.output and "missing" in out.output, out.output


def test_archiving_still_needs_the_instance_directory(tmp_path):
    out = CliRunner().invoke(cli, ["journal", "archive", "--to", str(tmp_path / "arch")])
    assert out.exit_code != 0 and "give the instance directory" in out.output, out.output
    out = CliRunner().invoke(cli, ["journal", "archive", "--check"])
    assert out.exit_code != 0 and "give the archive to check" in out.output, out.output
