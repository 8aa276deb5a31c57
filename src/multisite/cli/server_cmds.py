"""``multisite server start|stop|status``: the process that owns an instance."""

from __future__ import annotations

from pathlib import Path

import click

from ..instance.layout import Layout
from ..net import control
from ..server.sockets import KEEPALIVE_S
from ..server.process import start_server, stop_server
from ..net.tls import TLSConfig
from .output import console, print_json, table

@click.group()
def server() -> None:
    """Run the process that owns an instance (engine, journal pool, replication servers)."""


@server.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--listen", default=None, help="HOST:PORT for application clients (multisite.connect).")
@click.option("--cpus", default=None,
              help="Run the server on these CPUs only, e.g. 0 or 0-1 (group commit under load gains ~30% "
                   "from one CPU: its threads wake each other faster).")
@click.option("--keepalive", type=int, default=KEEPALIVE_S, show_default=True,
              help="Seconds a client may stay silent before the server probes it; a client whose host or "
                   "network is gone answers no probe and is dropped about twice as late, freeing its connection.")
@click.option("--tls-cert", default=None, help="The client port's certificate (PEM): clients connect with TLS.")
@click.option("--tls-key", default=None, help="Its private key (PEM).")
@click.option("--tls-ca", default=None,
              help="CA whose client certificates are accepted (PEM); a certificate's common name is a user.")
@click.option("--insecure", is_flag=True,
              help="Allow --listen on an address other than loopback without users (anyone reaching the port "
                   "may read, write and stop); without it such a server is refused.")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one).")
def start_cmd(dir: str, listen: str | None, cpus: str | None, keepalive: int, tls_cert: str | None,
              tls_key: str | None, tls_ca: str | None, insecure: bool, metrics: str | None) -> None:
    """Start the instance server; returns once it answers. With users (`multisite user add`) every
    client authenticates (a password or token, or a TLS client certificate naming the user).

    Example: multisite server start /data/A --listen 0.0.0.0:7000 --tls-cert a.pem --tls-key a.key --tls-ca ca.pem
    --metrics 127.0.0.1:9100
    """
    tls = TLSConfig.from_options(*(str(Path(f).absolute()) if f else None for f in (tls_cert, tls_key, tls_ca)))
    info = start_server(Path(dir), listen, cpus, keepalive, metrics, tls=tls, insecure=insecure)
    console.print(f"instance server started: pid {info['pid']}, log {info['log']}"
                  + (f", clients on port {info['client_port']}" if info.get("client_port") else "")
                  + (f", metrics on port {info['metrics_port']}" if info.get("metrics_port") else "")
                  + (f", CPUs {','.join(map(str, info['cpus']))}" if cpus else ""))


@server.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--timeout", type=float, default=10.0, show_default=True,
              help="Seconds for source servers to send what is pending before the server exits.")
def stop_cmd(dir: str, timeout: float) -> None:
    """Stop the instance server (sources first send what they can within --timeout).

    Example: multisite server stop /data/A --timeout 30
    """
    pid = stop_server(Path(dir), timeout)
    console.print(f"instance server pid {pid} stopped; log {Path(dir).absolute() / 'log' / 'server.log'}")


@click.command("status")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def status_cmd(dir: str, as_json: bool) -> None:
    """Status of an instance server and all its components.

    Example: multisite status /data/A --json
    """
    st = control.call(Layout.existing(dir).root, "status")
    if as_json:
        print_json(st)
        return
    table(f"instance {st['name']}", ["pid", "role", "seqno", "durability", "CPUs", "journal pool", "update process",
                                     "clients"],
          [(st["pid"], st["role"], st["seqno"], st["durability"], _cpu_list(st["cpus"]),
            f"{st['pool']['first_seqno']}..{st['pool']['last_seqno']}", st["update"]["state"],
            st.get("clients", 0) if st.get("client_port") else "-")])
    cc = st.get("client_commits")
    if cc and cc["commits"]:  # issue 14: the listener's group commits
        table("client commits (gathered)", ["commits", "batches written", "fdatasyncs", "commits per fdatasync",
                                            "fdatasyncs on the loop"],
              [(cc["commits"], cc["batches"], cc["groups"], f"{cc['commits'] / max(1, cc['groups']):.1f}",
                cc.get("inline", 0))])
    if st.get("client_auth"):
        ca = st["client_auth"]
        adm = ca.get("admission") or {"refused": {}, "evicted": 0, "timeouts": 0, "waiting": 0}
        at_accept = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in adm["refused"].items() if n) or "0"
        table("client port", ["authentication", "users", "TLS", "refused", "refused at accept", "evicted",
                              "login timeouts", "waiting to log in"],
              [("required" if ca["required"] else "none", ca["users"], "yes" if ca["tls"] else "no", ca["refused"],
                at_accept, adm["evicted"], adm["timeouts"], adm["waiting"])])
    if st["sources"]:
        table("source servers", ["secondary", "state", "mode", "last sent", "confirmed", "backlog", "reading"],
              [(n, s["state"], s["mode"], s["last_sent"], s["last_confirmed"], s["backlog"], s["reading_from"])
               for n, s in st["sources"].items()], whole=["secondary"])
    if st["receiver"]:
        r = st["receiver"]
        table("receiver server", ["state", "source", "listen", "received", "applied", "backlog"],
              [(r["state"], r["source"], r["listen"], r["received_seqno"], r["seqno"], r["backlog"])],
              whole=["source", "listen"])


def _cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def register(cli: click.Group) -> None:
    cli.add_command(server)
    cli.add_command(status_cmd)
