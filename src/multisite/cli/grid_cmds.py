"""``multisite catalog start|stop``, ``multisite container start|stop``, ``multisite grid status``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..grid.catalog import HEARTBEAT_TIMEOUT_S_DEFAULT
from ..grid.coordination import LEASE_TTL_S_DEFAULT
from ..server.client import client_tls_context
from ..grid.server.process import catalog_operate, catalog_status, start_catalog, start_container, stop_process
from ..instance.users import ROLES, add_user, list_users, remove_user
from ..net.tls import TLSConfig
from .output import console, print_json, table
from .user_cmds import read_secret, tell_added


def security_options(fn):
    """--tls-cert/--tls-key/--tls-ca, --users and --insecure of a grid process (grid/access.py)."""
    for opt in reversed([
        click.option("--tls-cert", default=None, metavar="FILE",
                     help="This member's certificate (CN = its name, OU = the grid's name), signed by the grid's CA."),
        click.option("--tls-key", default=None, metavar="FILE", help="Its private key."),
        click.option("--tls-ca", default=None, metavar="FILE",
                     help="The grid's CA: every grid wire is TLS, and members and clients must show a certificate "
                          "it signed (clients may use a user's password instead)."),
        click.option("--users", default=None, type=click.Path(file_okay=False),
                     help="Directory of the grid's users.json (multisite grid user add; default: --dir)."),
        click.option("--insecure", is_flag=True,
                     help="Allow a --listen reachable from other hosts without TLS or without users."),
    ]):
        fn = opt(fn)
    return fn


def client_options(fn):
    """How a client (grid status) reaches a grid with TLS and users."""
    for opt in reversed([
        click.option("--tls-ca", default=None, metavar="FILE", help="The grid's CA (the grid's wires are TLS)."),
        click.option("--tls-cert", default=None, metavar="FILE", help="A client certificate (CN = a user)."),
        click.option("--tls-key", default=None, metavar="FILE", help="Its private key."),
        click.option("--user", default=None, help="A user of the grid (its password from MULTISITE_PASSWORD)."),
    ]):
        fn = opt(fn)
    return fn


@click.group()
def catalog() -> None:
    """Run a grid's catalog: the placement service that puts shards on containers.

    One catalog alone keeps its placement in its --dir and is not highly available: while it is down no
    container is replaced and, without --etcd, no primary takes commits. With --etcd any number of
    catalogs run, one leads (an etcd lease), and commits never wait for a catalog.

    Example: multisite catalog start --grid grid.toml --dir /data/catalog --listen 127.0.0.1:7100
    """


@catalog.command("start")
@click.option("--grid", "grid", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The grid's policy (grid.toml: name, partitions, min_sync, max_sync, max_async, zones, maps).")
@click.option("--dir", "dir", required=True, type=click.Path(file_okay=False),
              help="Where the catalog keeps its placement (catalog.json) and logs; created if missing.")
@click.option("--listen", required=True, help="HOST:PORT where containers and `grid status` reach the catalog.")
@click.option("--heartbeat-timeout", type=float, default=HEARTBEAT_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds without a heartbeat after which a container is lost and its shards placed elsewhere.")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one).")
@click.option("--etcd", default=None, metavar="URLS",
              help="http://H:P[,http://H:P...] of an etcd cluster: the placement lives there, and this is one of any "
                   "number of catalogs of the grid (one leads).")
@click.option("--name", default=None, help="This catalog's name among the grid's catalogs (with --etcd; default "
                                           "HOST-PID).")
@click.option("--lease-ttl", type=float, default=LEASE_TTL_S_DEFAULT, show_default=True,
              help="With --etcd: seconds of the catalog's lease (a lost leader is replaced after about this).")
@security_options
def catalog_start(grid: str, dir: str, listen: str, heartbeat_timeout: float, metrics: str | None, etcd: str | None,
                  name: str | None, lease_ttl: float, tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
                  users: str | None, insecure: bool) -> None:
    """Start the catalog; returns once it answers. A restarted catalog reloads its placement from --dir
    (with --etcd: from etcd).

    Example: multisite catalog start --grid grid.toml --dir /data/cat1 --listen 127.0.0.1:7100
    --etcd http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379 --name cat1
    """
    info = start_catalog(Path(dir), Path(grid), listen, heartbeat_timeout, metrics, etcd=etcd, name=name,
                         lease_ttl_s=lease_ttl if etcd else None, tls=TLSConfig.from_options(tls_cert, tls_key, tls_ca),
                         users=Path(users) if users else None, insecure=insecure)
    who = f"catalog {info['name']}" if info.get("name") else "catalog"
    console.print(f"{who} of grid {info['grid']} started: pid {info['pid']}, listening on {info['listen']}, "
                  f"log {info['log']}" + (" (coordinated through etcd)" if etcd else ""))


@catalog.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def catalog_stop(dir: str) -> None:
    """Stop the catalog running in DIR (its placement stays in DIR for the next start).

    Example: multisite catalog stop /data/catalog
    """
    pid = stop_process(Path(dir), "catalog")
    console.print(f"catalog pid {pid} stopped")


@click.group()
def container() -> None:
    """Run a grid container: one process hosting many shards, each an instance under its --dir.

    Example: multisite container start --catalog 127.0.0.1:7100 --dir /data/c1 --listen 127.0.0.1:7201
    """


@container.command("start")
@click.option("--catalog", "catalog_addr", default=None,
              help="HOST:PORT of the grid's catalog (several, comma-separated: tried in turn).")
@click.option("--etcd", default=None, metavar="URLS",
              help="http://H:P[,...] of the grid's etcd: register there under the container's own lease instead of "
                   "with a catalog (the grid's catalogs run with --etcd too; a new container needs --grid).")
@click.option("--lease-ttl", type=float, default=LEASE_TTL_S_DEFAULT, show_default=True,
              help="With --etcd: seconds of the container's lease; its primaries stop taking commits a quarter of it "
                   "before it could end, and another is promoted after it ended.")
@click.option("--dir", "dir", required=True, type=click.Path(file_okay=False),
              help="Where the container keeps its shards (DIR/<grid>-p<partition>) and logs; created if missing.")
@click.option("--listen", required=True, help="HOST:PORT the container is known by (port 0: any free port).")
@click.option("--zone", default=None, help="The container's zone (with zones in the policy, no two shards of a "
                                           "partition share one).")
@click.option("--name", default=None, help="The container's name in the grid (default: its listen address).")
@click.option("--grid", "grid", default=None,
              help="Insist on this grid: a catalog of another grid refuses the container (default: the grid of "
                   "the first catalog that accepted it).")
@click.option("--advertise", default=None,
              help="HOST:PORT clients and replicas reach the container at, when not --listen (a proxy, a NAT).")
@click.option("--checkpoint-after", type=click.IntRange(min=0), default=None,
              help="A replica further behind than this many transactions copies a checkpoint instead of "
                   "replaying the journal (default 200,000).")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one).")
@security_options
def container_start(catalog_addr: str | None, etcd: str | None, lease_ttl: float, dir: str, listen: str,
                    zone: str | None, name: str | None, grid: str | None, advertise: str | None,
                    checkpoint_after: int | None, metrics: str | None, tls_cert: str | None, tls_key: str | None,
                    tls_ca: str | None, users: str | None, insecure: bool) -> None:
    """Start a container; returns once the catalog has accepted it and sent its assignments.

    Example: multisite container start --catalog 127.0.0.1:7100 --dir /data/c1 --listen 127.0.0.1:0 --zone a

    Example: multisite container start --etcd http://127.0.0.1:2379 --grid orders --dir /data/c1 --listen 127.0.0.1:0
    """
    if not catalog_addr and not etcd:
        raise click.UsageError("give --catalog HOST:PORT[,HOST:PORT...] or --etcd URLS")
    st = start_container(Path(dir), catalog_addr, listen, zone, name, grid, checkpoint_after=checkpoint_after,
                         advertise=advertise, metrics=metrics, etcd=etcd, lease_ttl_s=lease_ttl if etcd else None,
                         tls=TLSConfig.from_options(tls_cert, tls_key, tls_ca), users=Path(users) if users else None,
                         insecure=insecure)
    if not st.get("registered"):
        console.print(f"container started in {dir}, still waiting for {'etcd' if etcd else 'the catalog'} "
                      f"{etcd or catalog_addr}")
        return
    console.print(f"container {st['name']} of grid {st['grid']} started: pid {st['pid']}, "
                  f"{len(st['shards'])} shard(s) at placement version {st['applied_version']}")


@container.command("stop")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
def container_stop(dir: str) -> None:
    """Stop the container running in DIR (its shards stay in DIR; the catalog loses it after the timeout).

    Example: multisite container stop /data/c1
    """
    pid = stop_process(Path(dir), "container")
    console.print(f"container pid {pid} stopped")


@click.group()
def grid() -> None:
    """Look at a grid through its catalog.

    Example: multisite grid status --catalog 127.0.0.1:7100
    """


@grid.command("status")
@click.option("--catalog", "catalog_addr", required=True,
              help="HOST:PORT of the grid's catalog (several, comma-separated: the first that answers).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@client_options
def grid_status(catalog_addr: str, as_json: bool, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                user: str | None) -> None:
    """Placement (partition → primary, sync and async containers), containers, under-replicated partitions.

    Example: multisite grid status --catalog 127.0.0.1:7100 --json
    """
    st = catalog_status(catalog_addr, tls=client_tls_context(tls_ca, tls_cert, tls_key, check_hostname=False),
                        user=user, password=os.environ.get("MULTISITE_PASSWORD") if user else None)
    if as_json:
        print_json(st)
        return
    pol = st["policy"]
    console.print(f"grid {st['grid']}: {pol['partitions']} partitions, min_sync {pol['min_sync']}, max_sync "
                  f"{pol['max_sync']}, max_async {pol['max_async']}; placement version {st['version']}")
    co = st.get("coordination")
    if co:
        console.print(f"coordinated through etcd: leader catalog {co['leader'] or 'none (an election is due)'}; "
                      f"answered by {co['this']}" + ("" if co["leading"] else " (a follower)"))
        table("catalogs", ["name", "address", "role"],
              [(c["name"], c["address"], "leader" if c["leader"] else "follower") for c in co["catalogs"]],
              whole=["address"])
        table("etcd", ["member", "healthy", "error"],
              [(m["url"], "yes" if m["healthy"] else "no", m["error"] or "-") for m in st.get("etcd", [])],
              whole=["member"])
    table("placement", ["partition", "primary", "sync (* current)", "async", "epoch", "seqnos", "backlog"],
          [(p["partition"], p["primary"] or "-",
            ", ".join(c + ("*" if c in p["current"] else "") for c in p["sync"]) or "-",
            ", ".join(p["async"]) or "-", p["epoch"],
            " ".join(f"{c}={s}" for c, s in sorted(p["seqnos"].items())) or "-",
            " ".join(f"{c}={n}" for c, n in sorted(p.get("backlog", {}).items())) or "-")
           for p in st["partitions"]], whole=["primary"])  # replica lists wrap between addresses
    if any("loader" in p for p in st["partitions"]):  # issue 16
        rows = []
        for p in st["partitions"]:
            lo = p.get("loader") or {}
            pr = lo.get("primary") or {}
            rows.append((p["partition"], pr.get("state", "-"), pr.get("database", "-"), pr.get("applied", "-"),
                         pr.get("refused", "-"), pr.get("replayed", "-"),
                         " ".join(f"{c}={n}" for c, n in sorted(lo.get("buffered", {}).items())) or "-",
                         pr.get("last_error") or "-"))
        table("loader", ["partition", "state", "database", "applied", "refused", "replayed", "buffered",
                         "last error"], rows)
    if pol["min_sync"] == 0:
        lags = [n for p in st["partitions"] for n in p.get("backlog", {}).values()]
        console.print(f"min_sync is 0: a promotion may lose up to the replicas' lag (now at most "
                      f"{max(lags, default=0)} transaction(s) behind a primary)")
    table("containers", ["name", "state", "zone", "address", "last heartbeat", "shards", "primaries"],
          [(c["name"], "up" if c["up"] else "down", c["zone"] or "-", c["address"],
            f"{c['last_heartbeat_age_s']:.1f} s ago", c["shards"], c["primaries"]) for c in st["containers"]],
          whole=["name", "address"])
    if st["under_replicated"]:
        table("under-replicated", ["partition", "role", "placed/wanted", "blocks commits", "why"],
              [(u["partition"], u["role"], f"{u['placed']}/{u['wanted']}", "yes" if u["blocks_commits"] else "no",
                u["reason"]) for u in st["under_replicated"]])
    else:
        console.print("every partition is fully placed")
    for i in st["ignored"]:
        console.print(f"container {i['container']} takes no shards: {i['why']}")


def _client(tls_ca, tls_cert, tls_key, user) -> dict:
    return {"tls": client_tls_context(tls_ca, tls_cert, tls_key, check_hostname=False), "user": user,
            "password": os.environ.get("MULTISITE_PASSWORD") if user else None}


@grid.command("drain")
@click.argument("container_name")
@click.option("--catalog", "catalog_addr", required=True, help="HOST:PORT of the grid's catalogs (the leader takes it).")
@click.option("--undo", is_flag=True, help="Let the container take shards again.")
@client_options
def grid_drain(container_name: str, catalog_addr: str, undo: bool, tls_ca: str | None, tls_cert: str | None,
               tls_key: str | None, user: str | None) -> None:
    """Move a container's primaries and replicas away (a primary goes to a current synchronous replica
    only, never by a promotion that may lose commits); once `grid status` shows it holds no shard it may
    stop. Needs the admin role on a grid with users.

    Example: multisite grid drain c2 --catalog 127.0.0.1:7100
    """
    res = catalog_operate(catalog_addr, "drain", {"container": container_name, "on": not undo},
                          **_client(tls_ca, tls_cert, tls_key, user))
    console.print(res["message"])


@grid.command("promote")
@click.option("--catalog", "catalog_addr", required=True, help="HOST:PORT of the grid's catalogs (the leader takes it).")
@click.option("--partition", type=int, required=True, help="The partition whose primary is lost.")
@click.option("--to", "to", required=True, help="The replica (container name) to make its primary.")
@click.option("--force", is_flag=True, help="Required: the replica may lack acknowledged commits.")
@client_options
def grid_promote(catalog_addr: str, partition: int, to: str, force: bool, tls_ca: str | None, tls_cert: str | None,
                 tls_key: str | None, user: str | None) -> None:
    """Force a replica to be the primary of a partition whose primary is lost while no synchronous
    replica was current (the partition then waits, to lose nothing). It may lose acknowledged commits:
    the warning says how many, as far as the last reported seqnos tell.

    Example: multisite grid promote --catalog 127.0.0.1:7100 --partition 3 --to c2 --force
    """
    if not force:
        raise click.UsageError("a forced promotion may lose acknowledged commits: give --force to do it")
    res = catalog_operate(catalog_addr, "promote", {"partition": partition, "container": to},
                          **_client(tls_ca, tls_cert, tls_key, user))
    console.print(f"[bold yellow]warning:[/bold yellow] {res['message']}")


@grid.group("user")
def grid_user() -> None:
    """Users of a grid's clients (commits, reads, status, routes), kept in DIR/users.json as for an instance
    server; give every catalog and container that DIR with --users (or copy the file)."""


@grid_user.command("add")
@click.argument("dir", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True,
              help="read-only: reads, status, routes; read-write: also commits; admin: everything.")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
@click.option("--token", is_flag=True, help="Generate a random token as the secret and print it (once).")
@click.option("--cert-only", is_flag=True,
              help="No secret: the user authenticates only with a TLS client certificate whose common name is NAME.")
@click.option("--replace", is_flag=True, help="Replace an existing user's role and secret.")
def grid_user_add(dir: str, name: str, role: str, password_stdin: bool, token: bool, cert_only: bool,
                  replace: bool) -> None:
    """Add a user of the grid; running catalogs and containers take it on the next connection.

    Example: echo 's3cret-pass' | multisite grid user add /data/grid-users app --role read-write --password-stdin
    """
    secret = read_secret(name, password_stdin, token, cert_only)
    tell_added(add_user(dir, name, role, secret, replace=replace, instance=False), secret if token else None, replace)


@grid_user.command("remove")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("name")
def grid_user_remove(dir: str, name: str) -> None:
    """Remove a user of the grid (its open connections are refused at their next request).

    Example: multisite grid user remove /data/grid-users app
    """
    u = remove_user(dir, name, instance=False)
    console.print(f"user {u.name} removed (was {u.role})")


@grid_user.command("list")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, role, by}.")
def grid_user_list(dir: str, as_json: bool) -> None:
    """The grid's users, their roles and how they authenticate.

    Example: multisite grid user list /data/grid-users --json
    """
    rows = [{"name": u.name, "role": u.role, "by": u.by} for u in list_users(dir, instance=False)]
    if as_json:
        print_json(rows)
        return
    table("users", ["name", "role", "by"], [(r["name"], r["role"], r["by"]) for r in rows], whole=["name"])


def register(cli: click.Group) -> None:
    cli.add_command(catalog)
    cli.add_command(container)
    cli.add_command(grid)
