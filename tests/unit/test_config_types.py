"""TOML values of the wrong type for an option are errors naming the file, line and key: click alone
would turn a list or a table into its Python text, a boolean into 0 or 1 and cut 2.7 down to 2."""

from __future__ import annotations

import pytest

from multisite.cli.main import cli
from multisite.errors import ConfigError


@pytest.mark.parametrize("line", [
    "keepalive = true",
    "keepalive = 2.7",
    'listen = ["127.0.0.1:1", "127.0.0.1:2"]',
    "cpus = [0, 1]",
    'metrics = {host = "x"}',
])
def test_a_value_of_the_wrong_toml_type_is_refused_with_its_line(tmp_path, line):
    (tmp_path / "A").mkdir()
    f = tmp_path / "a.toml"
    f.write_text(f"[server]\n\n{line}\n")
    cmd = cli.commands["server"].commands["start"]
    key = line.split(" =")[0]
    with pytest.raises(ConfigError, match=rf"a.toml:3: \[server\] {key} = "):
        with cmd.make_context("start", [str(tmp_path / "A"), "--config", str(f)]):
            pass
