"""``multisite demo``: the main job."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import InstanceExists


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where to create the demo instances: a new or empty folder (default: a new temporary folder).")
def demo(workdir: str | None) -> None:
    """Run the replication scenario on the embedded defaults and check its outcome.

    Example: multisite demo
    """
    from .. import demo as scenario

    # The acts create their instances under fixed names in the folder: in one that holds anything
    # (an earlier demo's instances, an instance's own files) they would fail part-way and the demo
    # would report FAILED for what is only the wrong folder.
    if workdir is not None:
        root = Path(workdir).absolute()
        if root.is_dir() and any(root.iterdir()):
            raise InstanceExists(f"demo folder {root} is not empty; give a new or empty folder to --workdir")
    sys.exit(0 if scenario.run(workdir=workdir) else 1)
