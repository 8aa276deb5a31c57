"""``multisite source|receiver|update …``: control of a running instance server's components."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import ConfigError
from ..instance.layout import Layout
from ..net import control
from ..net.tls import TLSConfig
from .output import MAX_MIB, HostPort, Name, Seconds, console, print_json, table


def _root(dir: str) -> Path:
    return Layout.existing(dir).root


def _tls(cert, key, ca) -> dict | None:
    cfg = TLSConfig.from_options(cert, key, ca)
    return cfg.to_dict() if cfg else None


def _done(what: str, res: dict, as_json: bool = False) -> None:
    if as_json:
        print_json(res)
    else:
        console.print(f"{what}: state {res.get('state')}, pid {res['pid']}, log {res['log']}")


tls_options = [
    click.option("--tls-cert", default=None, help="This instance's certificate (PEM)."),
    click.option("--tls-key", default=None, help="Its private key (PEM)."),
    click.option("--tls-ca", default=None, help="CA that signs the peers' certificates (PEM)."),
]


def with_tls(f):
    for opt in reversed(tls_options):
        f = opt(f)
    return f


filter_options = [
    click.option("--filter", "filter_", default=None, metavar="CMD|MODULE:FUNCTION",
                 help="Filter every transaction: a command reading transactions on stdin and writing one "
                      "transformed transaction per transaction on stdout (split as a shell would), or an "
                      "in-process Python function module:function (dict -> dict)."),
    click.option("--filter-format", type=click.Choice(["json", "msgpack"]), default="json", show_default=True,
                 help="How a filter command reads and writes transactions: JSON lines or msgpack frames."),
    click.option("--filter-timeout", type=Seconds(), default=5.0, show_default=True,
                 help="Seconds a filter command has for each answer before it counts as hung."),
]


def with_filter(f):
    for opt in reversed(filter_options):
        f = opt(f)
    return f


def _filter_args(filter_, filter_format, filter_timeout) -> dict:
    if filter_ is None:
        return {}
    return {"filter": filter_, "filter_format": filter_format, "filter_timeout_s": filter_timeout}


@click.group()
def source() -> None:
    """Source Servers: stream this instance's journal to a secondary."""


@source.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--secondary", required=True, type=Name(), help="Name of the secondary instance this source feeds.")
@click.option("--connect", required=True, type=HostPort(), help="HOST:PORT of the secondary's Receiver Server.")
@click.option("--passive", is_flag=True, help="Start passive: no connection until activated.")
@click.option("--compress", type=int, default=0, show_default=True,
              help="zstd level (0 = off): one stream per connection across batches when the receiver offers it "
                   "(else a zstd frame per batch).")
@with_tls
@click.option("--heartbeat-interval", type=Seconds(), default=1.0, show_default=True,
              help="Seconds between heartbeats; below --heartbeat-timeout.")
@click.option("--heartbeat-timeout", type=Seconds(), default=5.0, show_default=True,
              help="Seconds without an answer before the connection counts as lost.")
@click.option("--stats-interval", type=Seconds(), default=5.0, show_default=True, help="Seconds between stats lines.")
@with_filter
def source_start(dir, secondary, connect, passive, compress, tls_cert, tls_key, tls_ca, heartbeat_interval,
                 heartbeat_timeout, stats_interval, filter_, filter_format, filter_timeout) -> None:
    """Start a Source Server for one secondary.

    Example: multisite source start /data/A --secondary B --connect b.example:7100 --compress 3

    With --filter, the secondary receives the filter's output (an out-filter, e.g. on a primary that
    runs a newer application: new value shapes back to old ones):
    multisite source start /data/B --secondary A --connect a.example:7100 --filter "python3 downgrade.py"
    """
    if heartbeat_interval >= heartbeat_timeout:  # each heartbeat would come too late: reconnects forever
        raise ConfigError(f"--heartbeat-interval ({heartbeat_interval:g} s) must be below --heartbeat-timeout "
                          f"({heartbeat_timeout:g} s): the receiver answers each heartbeat, and no answer "
                          f"within the timeout ends the connection")
    res = control.call(_root(dir), "source.start", secondary=secondary, connect=connect, passive=passive,
                       compress=compress, tls=_tls(tls_cert, tls_key, tls_ca),
                       heartbeat_interval_s=heartbeat_interval, heartbeat_timeout_s=heartbeat_timeout,
                       stats_interval_s=stats_interval, **_filter_args(filter_, filter_format, filter_timeout))
    _done(f"source server for {secondary} started", res)


def _simple(name: str, op: str, doc: str, *, timeout_opt: bool = False, connect_opt: bool = False):
    @click.argument("dir", type=click.Path(exists=True, file_okay=False))
    @click.option("--secondary", required=True, type=Name(), help="Name of the secondary.")
    def cmd(dir, secondary, **kw):
        args = {k: v for k, v in kw.items() if v is not None}
        call_timeout_s = control.CONTROL_TIMEOUT_S
        if "timeout" in args:  # the server's bound is ``timeout_s``: control.call's ``timeout`` is its socket's
            args["timeout_s"] = args.pop("timeout")
            call_timeout_s += args["timeout_s"]
        res = control.call(_root(dir), op, timeout=call_timeout_s, secondary=secondary, **args)
        _done(f"source server for {secondary} {name}", res)
    cmd.__doc__ = doc
    if timeout_opt:
        cmd = click.option("--timeout", type=Seconds(positive=False), default=5.0, show_default=True,
                           help="Seconds to send what is pending before stopping.")(cmd)
    if connect_opt:
        cmd = click.option("--connect", type=HostPort(), default=None, help="New HOST:PORT of the secondary.")(cmd)
    return source.command(name)(cmd)


_simple("stop", "source.stop", "Stop a Source Server (it first sends what it can within --timeout).\n\n"
        "Example: multisite source stop /data/A --secondary B", timeout_opt=True)
_simple("activate", "source.activate", "Make a passive Source Server active: it connects and streams.\n\n"
        "Example: multisite source activate /data/A --secondary B", connect_opt=True)
_simple("deactivate", "source.deactivate", "Make an active Source Server passive: it closes the connection.\n\n"
        "Example: multisite source deactivate /data/A --secondary B")


def _source_table(res: dict) -> None:
    table(f"source server for {res['secondary']}", ["field", "value"],
          [(k, res[k]) for k in ("pid", "state", "mode", "connect", "seqno", "last_sent", "last_confirmed",
                                 "backlog", "reading_from", "lag_s", "connects", "filter", "last_error", "log")],
          whole=["value"])


@source.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--secondary", required=True, type=Name())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def source_status(dir, secondary, as_json) -> None:
    """Status of a Source Server: state, seqnos, backlog.

    Example: multisite source status /data/A --secondary B --json
    """
    res = control.call(_root(dir), "source.status", secondary=secondary)
    print_json(res) if as_json else _source_table(res)


@source.command("showbacklog")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--secondary", required=True, type=Name())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def source_backlog(dir, secondary, as_json) -> None:
    """Transactions not yet sent to / confirmed by a secondary.

    Example: multisite source showbacklog /data/A --secondary B
    """
    res = control.call(_root(dir), "source.status", secondary=secondary)
    out = {k: res[k] for k in ("pid", "state", "seqno", "last_sent", "last_confirmed", "backlog", "backlog_unsent")}
    if as_json:
        print_json(out)
    else:
        table(f"backlog to {secondary}", list(out), [list(out.values())])


@click.group()
def receiver() -> None:
    """The Receiver Server: accepts a Source Server and fills the receive pool."""


@receiver.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--listen", required=True, type=HostPort(listen=True),
              help="HOST:PORT to accept the Source Server on.")
@with_tls
@click.option("--autorollback", is_flag=True, help="Roll back automatically when the source's history needs it.")
@click.option("--noresync", is_flag=True, help="SI only: resume from the last common transaction without rollback.")
@click.option("--receive-pool-mib", type=click.IntRange(1, MAX_MIB), default=64, show_default=True,
              help="XOFF above this, XON below 1/4.")
@click.option("--no-update", is_flag=True, help="Do not start the Update Process.")
@click.option("--stats-interval", type=Seconds(), default=5.0, show_default=True, help="Seconds between stats lines.")
@with_filter
def receiver_start(dir, listen, tls_cert, tls_key, tls_ca, autorollback, noresync, receive_pool_mib, no_update,
                   stats_interval, filter_, filter_format, filter_timeout) -> None:
    """Start the Receiver Server (and the Update Process): the instance becomes a replicating secondary.

    Example: multisite receiver start /data/B --listen 0.0.0.0:7100

    With --filter, received transactions go through the filter before the receive pool (an
    in-filter, e.g. on a secondary that runs a newer application: old value shapes to new ones):
    multisite receiver start /data/B --listen 0.0.0.0:7100 --filter myapp.upgrade:person
    """
    res = control.call(_root(dir), "receiver.start", listen=listen, tls=_tls(tls_cert, tls_key, tls_ca),
                       autorollback=autorollback, noresync=noresync,
                       receive_pool_bytes=receive_pool_mib * 1024 * 1024, update=not no_update,
                       stats_interval_s=stats_interval, **_filter_args(filter_, filter_format, filter_timeout))
    _done(f"receiver server listening on {res['listen']}", res)


@receiver.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def receiver_stop(dir) -> None:
    """Stop the Receiver Server and the Update Process.

    Example: multisite receiver stop /data/B
    """
    _done("receiver server stopped", control.call(_root(dir), "receiver.stop"))


@receiver.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def receiver_status(dir, as_json) -> None:
    """Status of the Receiver Server and Update Process: seqnos, backlog.

    Example: multisite receiver status /data/B --json
    """
    res = control.call(_root(dir), "receiver.status")
    if as_json:
        print_json(res)
        return
    table("receiver server", ["field", "value"],
          [(k, res.get(k)) for k in ("pid", "state", "listen", "source", "seqno", "received_seqno", "backlog",
                                     "receive_pool_bytes", "xoff", "filter", "last_error", "log")],
          whole=["value"])


@click.group()
def update() -> None:
    """The Update Process: applies received transactions."""


@update.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def update_start(dir) -> None:
    """Start the Update Process.

    Example: multisite update start /data/B
    """
    _done("update process started", control.call(_root(dir), "update.start"))


@update.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def update_stop(dir) -> None:
    """Stop the Update Process; received records wait in the receive pool (until XOFF).

    Example: multisite update stop /data/B
    """
    _done("update process stopped", control.call(_root(dir), "update.stop"))


@update.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def update_status(dir, as_json) -> None:
    """Status of the Update Process.

    Example: multisite update status /data/B
    """
    res = control.call(_root(dir), "update.status")
    print_json(res) if as_json else table("update process", list(res), [list(res.values())])


def register(cli: click.Group) -> None:
    for g in (source, receiver, update):
        cli.add_command(g)
