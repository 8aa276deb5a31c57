"""The instance file in odd states: every one a clear error naming the file, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import InstanceFileCorrupt


def test_an_instance_file_that_is_a_directory_is_a_clear_error(inst):
    # It raised IsADirectoryError (a traceback from the CLI).
    (inst / "instance.msi").unlink()
    (inst / "instance.msi").mkdir()
    with pytest.raises(InstanceFileCorrupt, match="instance.msi is a directory"):
        multisite.open(inst)
    res = CliRunner().invoke(cli, ["instance", "show", str(inst)])
    assert res.exit_code == 1 and "INSTANCE_FILE_CORRUPT" in res.output and "instance.msi" in res.output


@pytest.mark.parametrize("cut", [0, 3, 7, 8, 20, -1])
def test_a_truncated_instance_file_names_the_file(inst, cut):
    data = (inst / "instance.msi").read_bytes()
    (inst / "instance.msi").write_bytes(data[:cut] if cut >= 0 else data[:-1])
    with pytest.raises(InstanceFileCorrupt, match=str(inst / "instance.msi")):
        multisite.open(inst)
