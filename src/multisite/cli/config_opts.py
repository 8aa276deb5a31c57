"""``--config FILE.toml`` on every command that starts a component (``multisite.config`` has the format).

The file's table for the command gives the options' values by their command-line names; what the
command line gives wins over the file, the file over the defaults (the file fills click's
``default_map``, which the command line overrides). Every key is checked before the command runs: an
unknown key, or a value the option refuses, is a ConfigError naming the file, line, table and key.

``server start --config FILE`` also starts the components the file has tables for (the receiver, one
Source Server per ``[source.NAME]``) once the server answers, and records FILE in the instance's
``run/config-file``: a later ``server start DIR`` without ``--config`` reads the same file, so the
settings that came from it survive a restart; components started by hand do not come back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import config
from ..errors import ConfigError
from .output import console

CONFIG_RECORD = "config-file"  # in an instance's run/ folder: the file its server was last started with


def option_keys(cmd: click.Command) -> dict[str, click.Parameter]:
    """The keys a command's table may hold: long option names without ``--``, argument names."""
    keys: dict[str, click.Parameter] = {}
    for p in cmd.params:
        if p.name == "config" or not p.expose_value:
            continue
        if isinstance(p, click.Argument):
            keys[p.name] = p
            continue
        longs = [o[2:] for o in p.opts if o.startswith("--")]
        if longs:
            keys[longs[0]] = p
    return keys


def is_path(key: str, p: click.Parameter) -> bool:
    """Whether an option names a file or directory: a ``click.Path``, or a TLS file (``tls-cert``...)."""
    return isinstance(p.type, click.Path) or (key.startswith("tls-") and not getattr(p, "is_flag", False))


def resolve_paths(cfg: config.ConfigFile, key: str, p: click.Parameter, value: Any) -> Any:
    """A relative path in the file is relative to the FILE's directory, not the current one: the same
    file read from another directory (a restart through ``run/config-file``) names the same files."""
    if not is_path(key, p):
        return value
    base = cfg.path.absolute().parent

    def one(v: Any) -> Any:
        return str(base / Path(v).expanduser()) if isinstance(v, str) and v else v
    return [one(v) for v in value] if isinstance(value, list) else one(value)


def _peek(args: list[str], opt: str) -> str | None:
    for i, a in enumerate(args):
        if a == opt and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(opt + "="):
            return a[len(opt) + 1:]
    return None


class ConfigMixin:
    """Mixed into a command's class by ``enable``: fills ``default_map`` from the file's table."""

    config_section: str = ""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        path = _peek(args, "--config")
        if path is None and self.config_section == "server":
            path = recorded_config(args)
        if path is not None:
            cfg = config.load(path)
            section = self._section(cfg, args)
            table = cfg.table(section) if section else None
            ctx.default_map = {**(ctx.default_map or {}), **self.defaults(ctx, cfg, section, table or {})}
            ctx.meta["multisite.config"] = (cfg, section)
            if getattr(self, "after_config", None) is start_components:  # check what it will start, first
                for sub, sec in [("receiver", "receiver")] + [("source", f"source.{n}") for n in cfg.names("source")]:
                    cmd = _GROUP.commands[sub].commands["start"]  # type: ignore[union-attr]
                    cmd.defaults(click.Context(cmd, info_name=f"multisite {sub} start"), cfg, sec,
                                 cfg.table(sec) or {})
        return super().parse_args(ctx, args)  # type: ignore[misc]

    def _section(self, cfg: config.ConfigFile, args: list[str]) -> str | None:
        s = self.config_section
        if s not in config.NAMED_SECTIONS:
            return s
        names = cfg.names(s)
        want = _peek(args, "--secondary")
        if want is not None:
            return f"{s}.{want}" if want in names else None
        if len(names) == 1:
            return f"{s}.{names[0]}"
        if not names:
            return None
        raise ConfigError(f"{cfg.path} has {len(names)} [{s}.NAME] tables ({', '.join(names)}): say which with "
                          f"--secondary NAME")

    def defaults(self, ctx: click.Context, cfg: config.ConfigFile, section: str | None,
                 table: dict[str, Any]) -> dict[str, Any]:
        keys = option_keys(self)  # type: ignore[arg-type]
        out: dict[str, Any] = {}
        if section and section.startswith("source."):
            out["secondary"] = section.split(".", 1)[1]
        for key, value in table.items():
            p = keys.get(key) or keys.get(key.replace("_", "-"))
            if p is None:
                raise ConfigError(f"{cfg.where(section or '', key)}: unknown key {key!r} in [{section}] for "
                                  f"`{ctx.command_path}`; its keys are {', '.join(sorted(keys))}")
            if p.name == "secondary" and out.get("secondary", value) != value:
                raise ConfigError(f"{cfg.where(section or '', key)}: [{section}] names its secondary; "
                                  f"secondary = {value!r:.60} contradicts it")
            if getattr(p, "multiple", False) or (isinstance(p, click.Argument) and p.nargs == -1):
                if not isinstance(value, list):
                    value = [value]
            elif getattr(p, "is_flag", False) and not isinstance(value, bool):
                raise ConfigError(f"{cfg.where(section or '', key)}: [{section}] {key} is a flag: true or false, "
                                  f"got {value!r:.60}")
            elif (isinstance(value, (list, dict)) or (isinstance(value, bool) and not getattr(p, "is_flag", False))
                  or (isinstance(p.type, click.types.IntParamType) and isinstance(value, float))):
                raise ConfigError(f"{cfg.where(section or '', key)}: [{section}] {key} = {value!r:.60}: one "
                                  f"{'whole number' if isinstance(p.type, click.types.IntParamType) else 'value'} "
                                  f"expected, as on the command line")
            value = resolve_paths(cfg, key, p, value)
            try:
                p.type_cast_value(ctx, value)
            except (click.BadParameter, ConfigError) as e:  # the project's own types raise ConfigError
                msg = e.format_message() if isinstance(e, click.BadParameter) else e.message
                raise ConfigError(f"{cfg.where(section or '', key)}: [{section}] {key} = {value!r:.60}: {msg}") from None
            out[p.name] = value  # type: ignore[index]
        return out

    def invoke(self, ctx: click.Context) -> Any:
        rv = super().invoke(ctx)  # type: ignore[misc]
        after = getattr(self, "after_config", None)
        if after is not None and "multisite.config" in ctx.meta:
            after(ctx, *ctx.meta["multisite.config"])
        return rv


OFF_FORMS = {"--noresync": "--resync"}  # a flag already named as a negation: its off form, spelled plainly


def add_off_form(p: click.Parameter) -> None:
    """Give a boolean flag its ``--no-FLAG`` form (``--no-X`` gets ``--X``): a flag the file sets true
    can then be turned off on the command line, which still wins."""
    if not (isinstance(p, click.Option) and p.is_bool_flag) or p.secondary_opts:
        return
    long = next((o for o in p.opts if o.startswith("--")), None)
    if long is None:
        return
    off = OFF_FORMS.get(long) or ("--" + long[5:] if long.startswith("--no-") else "--no-" + long[2:])
    p.secondary_opts = [off]


def enable(cmd: click.Command, section: str, after=None) -> click.Command:
    """Give ``cmd`` a ``--config FILE.toml`` option reading table ``section``."""
    if isinstance(cmd, ConfigMixin):
        return cmd
    cmd.params.append(click.Option(["--config"], type=click.Path(dir_okay=False), expose_value=False,
                                   metavar="FILE.toml",
                                   help=f"Take settings from the [{section}{'.NAME' if section in config.NAMED_SECTIONS else ''}] "
                                        "table of this TOML file (same names as the options; options given "
                                        "here win)."))
    for p in cmd.params:
        add_off_form(p)
    cmd.__class__ = type(f"Config{type(cmd).__name__}", (ConfigMixin, type(cmd)), {})
    cmd.config_section = section  # type: ignore[attr-defined]
    if after is not None:
        cmd.after_config = after  # type: ignore[attr-defined]
    return cmd


# -- server start: the components of the file, and the record that survives a restart ------------
def recorded_config(args: list[str]) -> str | None:
    """The file an instance's server was last started with: found through the first argument that is
    an instance directory holding ``run/config-file`` (a file that is gone is forgotten)."""
    for a in args:
        rec = Path(a) / "run" / CONFIG_RECORD
        if not a.startswith("-") and rec.is_file():
            path = rec.read_text().strip()
            if Path(path).is_file():
                return path
    return None


def start_components(ctx: click.Context, cfg: config.ConfigFile, section: str | None) -> None:
    """After ``server start``: record the file, then start the receiver and sources it has tables for."""
    root = Path(ctx.params["dir"]).absolute()
    (root / "run" / CONFIG_RECORD).write_text(str(cfg.path.absolute()))
    group = ctx.find_root().command
    todo: list[tuple[list[str], list[str]]] = []
    if cfg.table("receiver") is not None:
        todo.append((["receiver", "start"], [str(root)]))
    for name in cfg.names("source"):
        todo.append((["source", "start"], [str(root), "--secondary", name]))
    for path, args in todo:
        cmd: Any = group
        for part in path:
            cmd = cmd.commands[part]
        console.print(f"from {cfg.path}: {' '.join(path)} {' '.join(args[1:])}".rstrip())
        cmd.main(args + ["--config", str(cfg.path)], prog_name=f"multisite {' '.join(path)}", standalone_mode=False)


STARTS = {  # command path -> table
    ("server", "start"): "server",
    ("receiver", "start"): "receiver",
    ("source", "start"): "source",
    ("catalog", "start"): "catalog",
    ("container", "start"): "container",
    ("docserver", "start"): "docserver",
    ("delivery", "agent"): "delivery-agent",
    ("dashboard",): "dashboard",
}


_GROUP: click.Group | None = None  # the multisite command group (register)


def register(cli: click.Group) -> None:
    global _GROUP
    _GROUP = cli
    for path, section in STARTS.items():
        cmd: Any = cli
        for part in path:
            cmd = getattr(cmd, "commands", {}).get(part)
            if cmd is None:
                break
        if cmd is not None:
            enable(cmd, section, start_components if section == "server" else None)
