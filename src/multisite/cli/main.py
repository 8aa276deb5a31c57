"""The ``multisite`` command: verbs grouped by part, thin over the Python API.

Errors of the MultisiteError tree print as one line (code and message) with exit status 1, or the
error's own ``exit_code`` (3: a replication session ran but a direction was refused); ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import sys

import click

from ..errors import MultisiteError


class Root(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MultisiteError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(getattr(e, "exit_code", 1))


@click.group(cls=Root)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="multisite")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """multisite: database replication across sites over one journal.

    Example: multisite instance create /data/A --name A
    """
    ctx.ensure_object(dict)["debug"] = debug


def _register() -> None:
    from . import demo, instance_cmds, journal_cmds

    cli.add_command(instance_cmds.instance)
    cli.add_command(instance_cmds.backup_cmd)
    cli.add_command(journal_cmds.journal)
    cli.add_command(demo.demo)
    for name in ("server_cmds", "replication_cmds", "failover_cmds", "pipeline_cmds", "grid_cmds", "delivery_cmds",
                 "doc_cmds", "user_cmds", "dashboard_cmds", "ha_cmds",
                 "config_opts"):  # last: gives --config to the start commands registered before it
        try:
            mod = __import__(f"multisite.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name != f"multisite.cli.{name}":
                raise
            continue
        mod.register(cli)


_register()


def main() -> None:
    cli(prog_name="multisite")
