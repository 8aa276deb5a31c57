"""``multisite dashboard``: the web page of a replication topology (see ``multisite.web``)."""

from __future__ import annotations

import asyncio
import logging

import click

from .output import HostPort, Seconds


@click.command("dashboard")
@click.argument("targets", nargs=-1, required=True, metavar="INSTANCE_DIR_OR_METRICS_ADDRESS_OR_DOCSERVER_HOME...")
@click.option("--listen", required=True, type=HostPort(listen=True), help="HOST:PORT to serve the page on "
              "(port 0: a free one, printed).")
@click.option("--token", default=None, help="Clients not on loopback must give this (?token=...); without it "
                                            "they are refused.")
@click.option("--interval", type=Seconds(), default=1.0, show_default=True,
              help="Seconds between polls of the targets (the series keep the last hour).")
def dashboard_cmd(targets: tuple[str, ...], listen: str, token: str | None, interval: float) -> None:
    """Serve the dashboard: topology map, lag and backlog per link, commit rate per primary, history
    records, lost-transaction files and the schedule map, refreshed live. A target is an instance
    directory on this machine, HOST:PORT of an instance server's --metrics endpoint, or the HOME of a
    document server (its connection documents go on the schedule map). Runs until SIGTERM or Ctrl-C.

    Example: multisite dashboard --listen 127.0.0.1:8080 /data/A /data/B /data/C
    """
    from ..web.app import Dashboard

    lg = logging.getLogger("multisite")
    if not lg.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        lg.addHandler(h)
        lg.setLevel(logging.INFO)
    dash = Dashboard(list(targets), interval, token)

    def ready(host: str, port: int) -> None:
        print(f"dashboard on http://{host}:{port}/", flush=True)  # a script (or test) reads the port here

    asyncio.run(dash.serve(listen, ready))


def register(cli: click.Group) -> None:
    cli.add_command(dashboard_cmd)
