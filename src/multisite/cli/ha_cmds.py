"""``multisite ha start|stop|status|failover-preview|switchover``: automatic failover for log shipping.

Each member of a cluster runs an HA manager beside its instance server (``ha start``); the managers
coordinate through etcd (``ha/DESIGN.md``). ``status``, ``failover-preview`` and ``switchover`` read
and write etcd only, so they run from any machine that reaches it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import click

from ..errors import ConfigError, ServerError
from ..ha.coordinator import Coordinator
from ..ha.decide import Member, View, candidate, lacking
from ..ha.process import start_ha, stop_ha
from ..instance.layout import Layout
from ..net import control
from ..server.process import start_server
from .output import HostPort, console, print_json, table

SWITCHOVER_REQUEST_TTL_S = 30.0  # a switchover request nobody carries out expires
SWITCHOVER_MAX_LAG_DEFAULT = 10_000  # transactions behind the primary a switchover target may be
LEADER_RECORD_WAIT_S = 3.0  # a switchover waits this long at most for a leader's record newer than its first read


@click.group()
def ha() -> None:
    """Automatic failover of a log-shipping cluster through etcd (a manager beside each instance server)."""


@ha.command("start")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--cluster", required=True, help="The cluster's name in etcd (one LMS group).")
@click.option("--etcd", required=True, metavar="URLS", help="etcd's client URLs: http://H:P[,http://H:P...].")
@click.option("--ttl", type=float, default=1.0, show_default=True,
              help="Seconds of the primary's lease: a primary that cannot renew stops taking commits before it "
                   "ends; a lost primary is replaced about this long after it is lost.")
@click.option("--min-confirm", type=int, default=0, show_default=True,
              help="Acknowledge a commit only once this many secondaries confirmed they hardened it.")
@click.option("--replication", type=HostPort(listen=True), default=None,
              help="HOST:PORT this member's Receiver Server listens on (published for the primary's sources); "
                   "default: the --advertise host (or 127.0.0.1), any free port.")
@click.option("--advertise", default=None, metavar="HOST",
              help="The host the other members and the clients reach this member at, published with its client "
                   "port; default: the host its server listens on, if it names one, else 127.0.0.1.")
@click.option("--listen", type=HostPort(listen=True), default="127.0.0.1:0", show_default=True,
              help="With no server running: the client port of the server that ha start starts.")
def start_cmd(dir: str, cluster: str, etcd: str, ttl: float, min_confirm: int, replication: str | None,
              advertise: str | None, listen: str) -> None:
    """Start the HA manager of DIR's instance (and its server when none runs); it joins the cluster.

    Example: multisite ha start /data/A --cluster orders --etcd http://10.0.0.1:2379,http://10.0.0.2:2379
    --advertise 10.0.0.5
    """
    root = Layout.existing(dir).root
    if not control.is_running(root):
        info = start_server(root, listen)
        console.print(f"instance server started: pid {info['pid']}, clients on port {info['client_port']}")
    info = start_ha(root, cluster, etcd, ttl_s=ttl, min_confirm=min_confirm, replication=replication,
                    advertise=advertise)
    console.print(f"HA manager started: pid {info['pid']}, cluster {cluster}, replication on {info['replication']}, "
                  f"log {root / 'log' / 'ha.log'}")


@ha.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def stop_cmd(dir: str) -> None:
    """Stop DIR's HA manager (a leader gives its key up at once); the instance server goes on serving,
    a primary's fenced: it refuses commits (NOT_PRIMARY) until a manager runs for it again.

    Example: multisite ha stop /data/A
    """
    pid = stop_ha(Path(dir))
    console.print(f"HA manager stopped (pid {pid})" if pid else f"no HA manager runs for {dir}")


def _view(cluster: str, etcd: str) -> View:
    coord = Coordinator(cluster, etcd, name="(cli)", ttl_s=1.0)
    view = asyncio.run(coord.view())
    if not view.reachable:
        raise ServerError(f"no etcd member answered at {etcd}")
    return view


def status_rows(view: View) -> list[dict]:
    """One row a member: role, seqno, backlog and lag behind the leader (as its sources see them), whether
    it counts for --min-confirm, addresses, whether it leads."""
    lead = next((m for m in view.members if view.leader and m.name == view.leader.name), None)
    top = lead.seqno if lead else max((m.seqno for m in view.members), default=0)
    links = {n: (lag, backlog, counts) for n, lag, backlog, counts in (lead.links if lead else ())}
    return [{"name": m.name, "role": m.role, "leader": bool(lead and lead.name == m.name), "seqno": m.seqno,
             "backlog": links[m.name][1] if m.name in links else max(0, top - m.seqno),
             "lag_s": links[m.name][0] if m.name in links else None,
             "counts_for_min_confirm": links[m.name][2] if m.name in links else False,
             "client": m.client, "replication": m.replication, "group": m.group} for m in view.members]


@ha.command("status")
@click.option("--cluster", required=True)
@click.option("--etcd", required=True, metavar="URLS")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def status_cmd(cluster: str, etcd: str, as_json: bool) -> None:
    """The cluster as etcd has it: the leader and its term, every member's role, seqno and backlog.

    Example: multisite ha status --cluster orders --etcd http://127.0.0.1:2379 --json
    """
    view = _view(cluster, etcd)
    rows = status_rows(view)
    lead = next((m for m in view.members if view.leader and m.name == view.leader.name), None)
    left = lead.lease_left_s if lead else None  # as of the leader's last record (published every pass)
    out = {"cluster": cluster, "leader": view.leader.name if view.leader else None,
           "term": view.leader.term if view.leader else view.last_term, "lease_left_s": left, "members": rows,
           "switchover": view.handover}
    if as_json:
        print_json(out)
        return
    table(f"cluster {cluster}: leader {out['leader'] or '(none)'}, term {out['term']}"
          + (f", lease {left:g} s left" if left is not None else ""),
          ["member", "role", "leader", "seqno", "backlog", "lag s", "min-confirm", "client", "replication"],
          [[r["name"], r["role"], "*" if r["leader"] else "", r["seqno"], r["backlog"],
            "" if r["lag_s"] is None else f"{r['lag_s']:.3f}", "counts" if r["counts_for_min_confirm"] else "",
            r["client"], r["replication"]] for r in rows], whole=["member", "client", "replication"])


@ha.command("failover-preview")
@click.option("--cluster", required=True)
@click.option("--etcd", required=True, metavar="URLS")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def preview_cmd(cluster: str, etcd: str, as_json: bool) -> None:
    """For every member: the transactions others have that it lacks, i.e. what would go to lost files if it
    were promoted now; and which member a failover would choose if the primary were lost now.

    Example: multisite ha failover-preview --cluster orders --etcd http://127.0.0.1:2379
    """
    view = _view(cluster, etcd)
    best = candidate([m for m in view.members if not (view.leader and m.name == view.leader.name)])
    rows = []
    for m in view.members:
        lacks = lacking(view.members, m.name)
        rows.append({"name": m.name, "seqno": m.seqno, "chosen": best is not None and best.name == m.name,
                     "lacks": {n: {"count": k, "seqnos": [view_seqno(view, n) - k + 1, view_seqno(view, n)]}
                               for n, k in lacks.items()},
                     "would_lose": max(lacks.values(), default=0)})
    if as_json:
        print_json({"cluster": cluster, "candidate": best.name if best else None, "members": rows})
        return
    table(f"failover preview of {cluster}: a failover now promotes {best.name if best else '(nobody)'}",
          ["member", "seqno", "chosen", "would lose", "lacks (member: seqnos)"],
          [[r["name"], r["seqno"], "*" if r["chosen"] else "", r["would_lose"],
            "; ".join(f"{n}: {v['seqnos'][0]}..{v['seqnos'][1]}" for n, v in r["lacks"].items())] for r in rows],
          whole=["member"])


def view_seqno(view: View, name: str) -> int:
    return next(m.seqno for m in view.members if m.name == name)


def switchover_view(read: Callable[[], View], wait_s: float = LEADER_RECORD_WAIT_S,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> View:
    """The view a switchover is checked against: read (``read``) until the leader's record is one it
    published after the first read (up to ``wait_s``). A leader publishes once a pass, every third of
    its lease: a record read once may predate its last commits by that long, and the target's, which
    a secondary publishes every 50 ms, then looked level with it. A loaded run switched over to a
    member paused 30 commits behind (the leader's record 30 behind its journal too): the primary
    stopped its commits for HANDOVER_TIMEOUT_S waiting for a confirmation that could not come."""
    first = read()
    lead = _leader_record(first)
    view, deadline = first, clock() + wait_s
    while lead is not None and clock() < deadline:
        sleep(0.05)
        view = read()
        now = _leader_record(view)
        if now is not None and now != lead:  # republished (its lease_left_s alone changes at each pass)
            return view
    return view if _leader_record(view) is not None else first


def _leader_record(view: View) -> Member | None:
    return next((m for m in view.members if view.leader and m.name == view.leader.name), None)


def check_switchover(view: View, cluster: str, to: str, max_lag: int) -> None:
    """ConfigError (ServerError with no leader) when ``to`` cannot be switched over to now."""
    names = [m.name for m in view.members]
    if to not in names:
        raise ConfigError(f"switchover --to {to!r}: not a member of cluster {cluster!r} "
                          f"(its members are {', '.join(names) or 'none'})")
    if view.leader is None:
        raise ServerError(f"cluster {cluster!r} has no leader now: a failover is under way; try again")
    if view.leader.name == to:
        raise ConfigError(f"switchover --to {to!r}: it is the primary already")
    lead = _leader_record(view)
    if lead is None:  # the key is held, its holder's record not (yet) published
        raise ServerError(f"cluster {cluster!r}: the primary {view.leader.name} has not published its record yet; "
                          f"try again")
    lag = lead.seqno - view_seqno(view, to)
    if lag > max_lag:
        raise ConfigError(f"switchover --to {to!r}: it lags the primary {view.leader.name} by {lag:,} transactions "
                          f"(more than --max-lag {max_lag:,}); wait for it to catch up")


@ha.command("switchover")
@click.option("--cluster", required=True)
@click.option("--etcd", required=True, metavar="URLS")
@click.option("--to", "to", required=True, help="The member to make primary.")
@click.option("--max-lag", type=int, default=SWITCHOVER_MAX_LAG_DEFAULT, show_default=True,
              help="Refuse a target further behind the primary than this many transactions.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for the handover.")
def switchover_cmd(cluster: str, etcd: str, to: str, max_lag: int, timeout: float) -> None:
    """Planned handover: the primary stops taking commits, drains to --to, and hands it the key; nothing goes
    to a lost file.

    Example: multisite ha switchover --cluster orders --etcd http://127.0.0.1:2379 --to B
    """
    check_switchover(switchover_view(lambda: _view(cluster, etcd)), cluster, to, max_lag)
    coord = Coordinator(cluster, etcd, name="(cli)", ttl_s=1.0)
    t0 = time.monotonic()
    asyncio.run(coord.request_switchover(to, SWITCHOVER_REQUEST_TTL_S))
    while time.monotonic() - t0 < timeout:
        v = asyncio.run(coord.view())
        if v.leader is not None and v.leader.name == to and any(m.name == to and m.role == "primary"
                                                                 for m in v.members):
            console.print(f"switchover done: {to} is primary (term {v.leader.term}) after "
                          f"{time.monotonic() - t0:.2f} s")
            return
        time.sleep(0.05)
    raise ServerError(f"switchover to {to!r} did not finish within {timeout:g} s: see the members' log/ha.log")


def register(cli: click.Group) -> None:
    cli.add_command(ha)
