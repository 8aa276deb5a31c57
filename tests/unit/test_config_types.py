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


@pytest.mark.parametrize("table", ['[receiver]\nlisen = "127.0.0.1:1"\n', '[source.B]\ncompress = "max"\n'])
def test_server_start_checks_the_component_tables_before_it_starts_anything(tmp_path, table):
    """`server start --config` starts the receiver and sources of the file after the server: a bad key
    in their tables must stop it before the server process is spawned, not leave that running."""
    (tmp_path / "A").mkdir()
    f = tmp_path / "a.toml"
    f.write_text(f'[server]\nlisten = "127.0.0.1:0"\n\n{table}')
    cmd = cli.commands["server"].commands["start"]
    with pytest.raises(ConfigError, match=r"a.toml:5: "):
        with cmd.make_context("start", [str(tmp_path / "A"), "--config", str(f)]):
            pass
