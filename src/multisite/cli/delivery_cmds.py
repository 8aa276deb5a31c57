"""``multisite delivery …``: publications, subscriptions, the Message Agent, status, conflicts, extract."""

from __future__ import annotations

import logging
import os
import signal
import time
from datetime import datetime, timezone

import click
from rich.console import Console

from .. import engine
from ..delivery.server import api
from ..delivery.server.api import status_table, when
from ..delivery.server.agent import Agent
from ..delivery.build import MESSAGE_BYTES_DEFAULT
from ..journal.offsets import format_offset
from .output import console, print_json, table


@click.group()
def delivery() -> None:
    """Guaranteed message delivery: a consolidated instance and remote sites exchanging messages.

    Example: multisite delivery publish /data/HQ --publication sales --regions orders --subscribe-by region
    """


def _regions(text: str) -> list[str]:
    return [r.strip() for r in text.split(",") if r.strip()]


def _key(key: str | None, key_file: str | None) -> str:
    if key_file:
        with open(key_file) as f:
            return f.read().strip()
    return key or ""


@delivery.command("publish")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--publication", required=True, help="The publication's name.")
@click.option("--regions", required=True, help="Comma-separated regions it publishes (created if missing).")
@click.option("--subscribe-by", default=None, help="A field of the rows' values: subscribers get the rows whose "
                                                   "field equals their --value.")
@click.option("--inbox", default=None, help="The folder this instance's agent reads messages from "
                                            "(default: DIR/delivery/inbox).")
def publish_cmd(dir: str, publication: str, regions: str, subscribe_by: str | None, inbox: str | None) -> None:
    """Make a publication on the consolidated instance in DIR.

    Example: multisite delivery publish /data/HQ --publication sales --regions orders --subscribe-by region
    """
    with engine.open(dir) as db:
        pub = api.publish(db, publication, _regions(regions), subscribe_by, inbox)
        console.print(f"publication {pub.name} of {', '.join(pub.regions)}"
                      + (f" subscribed by {pub.subscribe_by}" if pub.subscribe_by else "")
                      + f"; inbox {api.status(db)['inbox']}")


@delivery.command("subscribe")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--publication", required=True)
@click.option("--subscriber", required=True, help="The remote user: the remote instance's name.")
@click.option("--address", required=True, help="Where its messages go: its inbox folder, or an http:// or "
                                               "mqtt:// address.")
@click.option("--value", default=None, help="The subscribe-by value: the rows this subscriber gets.")
@click.option("--key", default=None, help="64 hex digits: encrypt and authenticate this link (AES-256-GCM).")
@click.option("--key-file", type=click.Path(exists=True, dir_okay=False), default=None, help="The key, from a file.")
def subscribe_cmd(dir: str, publication: str, subscriber: str, address: str, value: str | None, key: str | None,
                  key_file: str | None) -> None:
    """Subscribe a remote user to a publication of the consolidated instance in DIR; it gets what is
    committed from now on (use `delivery extract` for the rows already there).

    Example: multisite delivery subscribe /data/HQ --publication sales --subscriber paris --address /sync/paris --value FR
    """
    with engine.open(dir) as db:
        link = api.subscribe(db, publication, subscriber, address, value, _key(key, key_file))
        out = api.status(db)
    row = next(r for r in out["remote_users"] if r["user"] == link.user)
    console.print(f"{link.user} subscribed to {link.publication} at {link.address} from offset "
                  f"{format_offset(row['log_sent'])}")


@delivery.command("remote-setup")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--consolidated", required=True, help="The consolidated instance's name.")
@click.option("--address", required=True, help="Where messages to it go (its inbox folder or URL).")
@click.option("--publication", required=True, help="The publication this remote takes part in.")
@click.option("--regions", required=True, help="Comma-separated regions whose changes go to the consolidated instance.")
@click.option("--inbox", default=None, help="The folder this instance's agent reads messages from "
                                            "(default: DIR/delivery/inbox).")
@click.option("--key", default=None, help="64 hex digits: the link's key, the same as the consolidated side's.")
@click.option("--key-file", type=click.Path(exists=True, dir_okay=False), default=None)
def remote_setup_cmd(dir: str, consolidated: str, address: str, publication: str, regions: str, inbox: str | None,
                     key: str | None, key_file: str | None) -> None:
    """Make the instance in DIR a remote site of a consolidated instance.

    Example: multisite delivery remote-setup /data/paris --consolidated HQ --address /sync/HQ --publication sales --regions orders --inbox /sync/paris
    """
    with engine.open(dir) as db:
        link = api.remote_setup(db, consolidated, address, publication, _regions(regions), inbox,
                                _key(key, key_file))
        inbox_now = api.status(db)["inbox"]
    console.print(f"{db.name} is a remote of {link.user} (at {link.address}); inbox {inbox_now}")


def print_status(st: dict, title: str | None = None) -> None:
    """The SYSREMOTEUSER table, wide enough for whole offsets (13 digits past the first segment)."""
    Console(width=max(console.width, 150)).print(status_table(st, title))


@delivery.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The table as JSON.")
def status_cmd(dir: str, as_json: bool) -> None:
    """Print the SYSREMOTEUSER table: per remote user, the four offsets and the last message each way.

    Example: multisite delivery status /data/HQ --json
    """
    with engine.open(dir) as db:
        st = api.status(db)
    if as_json:
        print_json(st)
    else:
        print_status(st)


@delivery.command("conflicts")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def conflicts_cmd(dir: str, as_json: bool) -> None:
    """Print the update conflicts resolved on this instance (the consolidated copy won).

    Example: multisite delivery conflicts /data/HQ
    """
    with engine.open(dir) as db:
        rows = api.conflicts(db)
    if as_json:
        print_json([{k: (v.hex() if isinstance(v, bytes) else v) for k, v in r.items()} for r in rows])
        return
    table("update conflicts", ("user", "offset", "region", "key", "rule", "time"),
          [(r["user"], format_offset(r["offset"]), r["region"], tuple(r["key"]), r["rule"], when(r["time"]))
           for r in rows])


@delivery.command("agent")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--once", is_flag=True, help="One poll, then exit.")
@click.option("--interval", type=click.FloatRange(0.0, 86400.0), default=5.0, show_default=True,
              help="Seconds between polls when there was nothing to do.")
@click.option("--until-idle", is_flag=True, help="Poll until a poll neither receives nor sends anything, then exit.")
@click.option("--message-bytes", type=click.IntRange(256, 1 << 30), default=MESSAGE_BYTES_DEFAULT, show_default=True,
              help="The message size limit; a larger transaction spans several messages.")
@click.option("--json", "as_json", is_flag=True, help="Print each poll's report as one JSON line.")
@click.option("--listen-mqtt", default=None, metavar="mqtt://HOST:PORT/TOPIC",
              help="Also take this agent's messages from an MQTT broker's topic (a persistent session, QoS 1) "
                   "into its inbox folder.")
@click.option("--listen-http", default=None, metavar="HOST:PORT",
              help="Also serve POST /messages/NAME here: peers whose address for this instance is http://HOST:PORT.")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics: poll counts and the SYSREMOTEUSER offsets.")
def agent_cmd(dir: str, once: bool, interval: float, until_idle: bool, message_bytes: int, as_json: bool,
              listen_mqtt: str | None, listen_http: str | None, metrics: str | None) -> None:
    """Run the Message Agent: receive, apply and confirm messages, send new transactions. It logs to
    DIR/log/delivery-agent.log; SIGTERM stops it between polls.

    Example: multisite delivery agent /data/paris --interval 60
    """
    lg = _agent_log(dir)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    from ..delivery.server import http_transport as delivery_http, mqtt_transport as delivery_mqtt

    delivery_mqtt.register()
    delivery_http.register()
    with engine.open(dir) as db:
        agent = Agent(db, message_bytes=message_bytes, feeders=_feeders(db, listen_mqtt, listen_http))
        lg.info("agent of %s started (pid %d)", db.name, os.getpid())
        ms = _serve_metrics(db, metrics, lg)
        try:
            while not stop:
                rep = agent.poll()
                if ms is not None:
                    ms.update(rep, api.status(db), time.time())
                _print_poll(rep, as_json)
                if once or (until_idle and not rep.busy):
                    break
                if not rep.busy:
                    time.sleep(interval)
        finally:
            if ms is not None:
                ms.close()
            agent.close()
            lg.info("agent of %s stopped", db.name)


def _agent_log(dir: str) -> logging.Logger:
    """The delivery logger, writing (INFO and up) to DIR/log/delivery-agent.log: an agent runs unattended,
    so what it did and why it stopped is kept beside the instance."""
    from ..instance.layout import Layout

    logfile = Layout.existing(dir).log / "delivery-agent.log"
    handler = logging.FileHandler(logfile)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    lg = logging.getLogger("multisite.delivery")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    return lg


def _feeders(db, listen_mqtt: str | None, listen_http: str | None) -> tuple:
    """What fills the agent's inbox folder besides the file transport: an MQTT topic's subscriber and an
    HTTP endpoint peers POST to, as ``--listen-mqtt`` and ``--listen-http`` ask."""
    from ..delivery.server import http_transport as delivery_http, mqtt_transport as delivery_mqtt
    from ..delivery.server.transport import inbox_folder

    feeders = []
    if listen_mqtt:
        inbox = inbox_folder(api.status(db)["inbox"] or "")
        feeders.append(delivery_mqtt.MqttFeeder(listen_mqtt, inbox, f"multisite-agent-{db.name}"))
    if listen_http:
        feeders.append(delivery_http.HttpInbox(listen_http, inbox_folder(api.status(db)["inbox"] or "")))
    return tuple(feeders)


def _serve_metrics(db, metrics: str | None, lg: logging.Logger):
    """The agent's Prometheus metrics served on ``metrics`` (HOST:PORT), or None without ``--metrics``."""
    if not metrics:
        return None
    from ..delivery.server.metrics import AgentMetrics

    ms = AgentMetrics()
    ms.status = api.status(db)
    lg.info("metrics served on http://%s:%d/metrics", metrics.rsplit(":", 1)[0], ms.serve(metrics))
    return ms


def _print_poll(rep, as_json: bool) -> None:
    """One poll's report: a JSON line with ``--json`` (every poll), else a line when the poll moved
    something or rejected a message; rejected messages and links that could not send, in red, always."""
    import json

    line = {"received": rep.received, "applied_messages": rep.applied_messages,
            "applied_transactions": rep.applied_transactions, "conflicts": rep.conflicts,
            "duplicates": rep.duplicates, "waiting": rep.waiting, "rejected": rep.rejected,
            "sent_messages": rep.sent_messages, "sent_transactions": rep.sent_transactions,
            "resend_requests": rep.resend_requests, "link_errors": rep.link_errors, "busy": rep.busy}
    if as_json:
        click.echo(json.dumps(line), nl=True)
    elif rep.busy or rep.rejected:
        console.print(f"poll: applied {rep.applied_transactions} transactions in {rep.applied_messages} "
                      f"messages ({rep.conflicts} conflicts, {rep.duplicates} duplicates, {rep.waiting} "
                      f"waiting), sent {rep.sent_transactions} in {rep.sent_messages} messages")
    for r in rep.rejected:
        console.print(f"[red]rejected[/red] {r}")
    for r in rep.link_errors:
        console.print(f"[red]not sent[/red] to {r}")


@delivery.command("extract")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--subscriber", required=True)
@click.option("--to", "to", required=True, type=click.Path(file_okay=False), help="The new remote instance's folder.")
@click.option("--spark", "use_spark", is_flag=True, help="Read the rows with Spark (local[*]), for large publications.")
def extract_cmd(dir: str, subscriber: str, to: str, use_spark: bool) -> None:
    """Build a new remote instance holding exactly a subscriber's rows, its link restarted at the
    journal's end offset on both sides.

    Example: multisite delivery extract /data/HQ --subscriber paris --to /data/paris-new --spark
    """
    with engine.open(dir) as db:
        if use_spark:
            from ..pipeline.delivery_extract import extract

            out = extract(db, subscriber, to)
        else:
            out = api.extract(db, subscriber, to)
    console.print(f"extracted {out['rows']} rows of {subscriber} into {out['instance']} at offset {out['offset']}")


@delivery.command("keygen")
def keygen_cmd() -> None:
    """Print a new link key (64 hex digits) for --key / --key-file on both sides of a link.

    Example: multisite delivery keygen > paris.key
    """
    click.echo(os.urandom(32).hex())


def register(cli: click.Group) -> None:
    cli.add_command(delivery)
