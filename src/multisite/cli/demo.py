"""``multisite demo``: the main job."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where to create the demo instances (default: a new temporary folder).")
def demo(workdir: str | None) -> None:
    """Run the replication scenario on the embedded defaults and check its outcome.

    Example: multisite demo
    """
    from .. import demo as scenario

    sys.exit(0 if scenario.run(workdir=workdir) else 1)
