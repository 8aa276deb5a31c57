"""TOML configuration: every option of every start command round-trips through a file (the command
parses to the same values as from the command line), the command line wins over the file, and bad
files give errors naming the file, line and key. Parsing only: nothing is started here."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from multisite import config
from multisite.cli.config_opts import STARTS, is_path, option_keys
from multisite.cli.main import cli
from multisite.errors import ConfigError


def command(path: tuple[str, ...]) -> click.Command:
    cmd = cli
    for part in path:
        cmd = cmd.commands[part]
    return cmd


CANDIDATES = ["127.0.0.1:7000", "B", 3, 2.5, 1024, "0"]


def sample(cmd: click.Command, key: str, p: click.Parameter, tmp: Path):
    """A value the parameter accepts, as TOML holds it (an absolute path for a path: the same from anywhere)."""
    if getattr(p, "is_flag", False):
        return True
    if is_path(key, p) and not isinstance(p.type, click.Path):
        return str(tmp / "f.toml")
    if isinstance(p.type, click.Choice):
        return p.type.choices[-1]
    if isinstance(p.type, click.Path):
        return str(tmp / ("d" if p.type.dir_okay else "f.toml"))
    ctx = click.Context(cmd)
    for v in CANDIDATES:
        try:
            p.type.convert(v, p, ctx)
            return v
        except (click.BadParameter, ConfigError):
            continue
    raise AssertionError(f"no sample value for {p.name} of {cmd.name}")


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v) + '"'


def parse(cmd: click.Command, args: list[str]) -> dict:
    with cmd.make_context(cmd.name, args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("path", sorted(STARTS), ids=lambda p: " ".join(p))
def test_every_option_round_trips_through_a_file(path, tmp_path):
    try:
        cmd = command(path)
    except KeyError:
        pytest.skip(f"{' '.join(path)} is not registered (its module's imports are missing)")
    (tmp_path / "d").mkdir()
    (tmp_path / "f.toml").write_text("")
    section = STARTS[path]
    table = f"{section}.B" if section in config.NAMED_SECTIONS else section
    lines, argv = [f"[{table}]"], []
    for key, p in option_keys(cmd).items():
        if key == "secondary":  # named by the table
            argv[:0] = ["--secondary", "B"]
            continue
        v = sample(cmd, key, p, tmp_path)
        lines.append(f"{key} = {toml_value(v)}" if not p.multiple else f"{key} = [{toml_value(v)}]")
        if isinstance(p, click.Argument):
            argv.append(str(v))
        elif getattr(p, "is_flag", False):
            argv.append(p.opts[0])
        else:
            argv += [next(o for o in p.opts if o.startswith("--")), str(v)]
    f = tmp_path / "site.toml"
    f.write_text("\n".join(lines) + "\n")
    from_cli = parse(cmd, argv)
    from_file = parse(cmd, ["--config", str(f)])
    assert from_file == from_cli
    assert len(from_file) == len(option_keys(cmd))


def test_the_command_line_wins_over_the_file(tmp_path):
    (tmp_path / "A").mkdir()
    f = tmp_path / "a.toml"
    f.write_text(f'[server]\ndir = "{tmp_path / "A"}"\nlisten = "127.0.0.1:7000"\nkeepalive = 40\n')
    cmd = command(("server", "start"))
    got = parse(cmd, ["--config", str(f), "--keepalive", "50"])
    assert got["keepalive"] == 50 and got["listen"] == "127.0.0.1:7000" and got["dir"] == str(tmp_path / "A")
    assert parse(cmd, ["--config", str(f)])["keepalive"] == 40


def test_underscore_names_are_the_same_keys(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('[source.B]\nconnect = "127.0.0.1:7101"\nheartbeat_timeout = 9.5\n')
    (tmp_path / "B").mkdir()
    got = parse(command(("source", "start")), [str(tmp_path / "B"), "--config", str(f)])
    assert got["heartbeat_timeout"] == 9.5 and got["secondary"] == "B" and got["connect"] == "127.0.0.1:7101"


def test_a_source_table_is_picked_by_secondary(tmp_path):
    f = tmp_path / "a.toml"
    f.write_text('[source.B]\nconnect = "127.0.0.1:1"\n\n[source.C]\nconnect = "127.0.0.1:2"\n')
    (tmp_path / "A").mkdir()
    cmd = command(("source", "start"))
    assert parse(cmd, [str(tmp_path / "A"), "--config", str(f), "--secondary", "C"])["connect"] == "127.0.0.1:2"
    with pytest.raises(ConfigError, match=r"2 \[source.NAME\] tables \(B, C\): say which with --secondary"):
        parse(cmd, [str(tmp_path / "A"), "--config", str(f)])


@pytest.mark.parametrize("text, message", [
    ('[server]\nlisten = "127.0.0.1:1"\n\n# x\nlisen = "127.0.0.1:2"\n',
     r"a.toml:5: unknown key 'lisen' in \[server\] for `.*start`; its keys are cpus, dir"),
    ('[server]\nkeepalive = "soon"\n', r"a.toml:2: \[server\] keepalive = 'soon': .*not a valid integer"),
    ('[sever]\nlisten = "x"\n', r"a.toml:1: unknown table 'sever'; the tables are server, receiver"),
    ('[server]\nlisten = \n', r"a.toml: not valid TOML: .*line 2"),
    ('server = 3\n', r"a.toml:1: server must be a table"),
    ('[receiver]\nautorollback = "yes"\n', r"a.toml:2: \[receiver\] autorollback is a flag: true or false"),
    ('[source]\nconnect = "127.0.0.1:1"\n', r"a.toml:2: \[source\] holds one table per name, as \[source.connect\]"),
])
def test_bad_files_name_the_line_and_key(tmp_path, text, message):
    (tmp_path / "A").mkdir()
    f = tmp_path / "a.toml"
    f.write_text(text)
    path = ("receiver", "start") if "receiver" in text else ("server", "start")
    with pytest.raises(ConfigError, match=message):
        parse(command(path), [str(tmp_path / "A"), "--config", str(f)])


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration file .*nope.toml"):
        config.load(tmp_path / "nope.toml")


def test_line_of_finds_quoted_keys_in_dotted_tables():
    lines = ['[source."B"]', "  'connect' = 1", "[source.C]", "connect = 2"]
    assert config.line_of(lines, "source.B", "connect") == 2
    assert config.line_of(lines, "source.C", "connect") == 4
    assert config.line_of(lines, "source.C") == 3
    assert config.line_of(lines, "server", "connect") is None


def test_a_source_table_refuses_a_secondary_key_naming_another(tmp_path):
    # [source.B] with secondary = "C" started a Source Server for C with B's settings.
    f = tmp_path / "a.toml"
    f.write_text('[source.B]\nconnect = "127.0.0.1:1"\nsecondary = "C"\n')
    (tmp_path / "A").mkdir()
    with pytest.raises(ConfigError, match=r"a.toml:3: .*\[source.B\] names its secondary"):
        parse(command(("source", "start")), [str(tmp_path / "A"), "--config", str(f)])


def test_relative_paths_in_the_file_resolve_against_its_directory(tmp_path, monkeypatch):
    # They resolved against the current directory: a restart from the recorded file elsewhere read other files.
    site = tmp_path / "etc"
    (site / "A").mkdir(parents=True)
    f = site / "site.toml"
    f.write_text('[server]\ndir = "A"\ntls-cert = "certs/a.pem"\ntls-key = "/abs/a.key"\ntls-ca = "../ca.pem"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    got = parse(command(("server", "start")), ["--config", "../etc/site.toml"])
    assert Path(got["dir"]).resolve() == site / "A"
    assert Path(got["tls_cert"]).resolve() == site / "certs" / "a.pem"
    assert got["tls_key"] == "/abs/a.key"
    assert Path(got["tls_ca"]).resolve() == tmp_path / "ca.pem"


def test_relative_paths_on_the_command_line_stay_relative_to_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "etc" / "A").mkdir(parents=True)
    (tmp_path / "B").mkdir()
    f = tmp_path / "etc" / "site.toml"
    f.write_text('[server]\ndir = "A"\ntls-cert = "a.pem"\n')
    monkeypatch.chdir(tmp_path)
    got = parse(command(("server", "start")), ["B", "--config", str(f), "--tls-cert", "b.pem"])
    assert got["dir"] == "B" and got["tls_cert"] == "b.pem"


@pytest.mark.parametrize("path, key, off", [
    (("server", "start"), "insecure", "--no-insecure"),
    (("receiver", "start"), "autorollback", "--no-autorollback"),
    (("receiver", "start"), "no-update", "--update"),
    (("receiver", "start"), "noresync", "--resync"),
    (("source", "start"), "passive", "--no-passive"),
])
def test_a_flag_the_file_sets_is_turned_off_on_the_command_line(tmp_path, path, key, off):
    # A flag set true in the file could not be turned off: the command line had no --no-... form.
    (tmp_path / "A").mkdir()
    section = "source.B" if path[0] == "source" else path[0]
    f = tmp_path / "a.toml"
    extra = {"source": 'connect = "127.0.0.1:1"\n', "receiver": 'listen = "127.0.0.1:0"\n'}.get(path[0], "")
    f.write_text(f'[{section}]\n{key} = true\n{extra}')
    cmd = command(path)
    name = key.replace("-", "_")
    assert parse(cmd, [str(tmp_path / "A"), "--config", str(f)])[name] is True
    assert parse(cmd, [str(tmp_path / "A"), "--config", str(f), off])[name] is False
    assert parse(cmd, [str(tmp_path / "A"), "--config", str(f), off, "--" + key])[name] is True  # the last wins


def test_every_flag_of_a_start_command_has_an_off_form():
    for path in STARTS:
        try:
            cmd = command(path)
        except KeyError:
            continue
        for key, p in option_keys(cmd).items():
            if getattr(p, "is_flag", False):
                assert p.secondary_opts, f"{' '.join(path)} --{key} has no off form"
