"""Document databases and their replication: ``db``, ``doc``, ``docserver``, the console verbs
``replicate``/``pull``/``push``, and ``connections list``."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import click

from ..errors import ConfigError, ReplicationRefused, ServerError
from ..multimaster.server import docdb, docdb_files
from ..multimaster.server.docclient import connect
from ..multimaster.session import Mode, run_local, summary
from ..multimaster.server.process import call, known_peers, resolve_peer, start_docserver, stop_docserver
from .output import HostPort, console, print_json, table


def _fields(text: str) -> dict:
    try:
        v = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"FIELDS must be a JSON object, e.g. '{{\"name\": \"Ada\"}}': {e}") from None
    if not isinstance(v, dict):
        raise ConfigError("FIELDS must be a JSON object of field names to values")
    return v


ON_HELP = ("HOME of the document server serving DIR: go through it (by default the server DIR records while one "
           "serves it; without one, DIR is opened here).")


def on_option(f):
    return click.option("--on", "on", default=None, type=click.Path(exists=True, file_okay=False), help=ON_HELP)(f)


def _database(dir: str, on: str | None):
    """The database at DIR: through the document server serving it (``--on HOME``, or the one DIR records
    in ``run/served_by.json``), else opened here. Either has DocDB's methods and is a context manager."""
    if on is not None:
        return connect(on, db=str(Path(dir).absolute()))
    if docdb_files.served_by(dir) is not None:
        try:
            return connect(dir)
        except ServerError:  # a record left by a server that was killed: nobody holds DIR, open it here
            pass
    return docdb.open(dir)


# ``doc list`` shows the start of each document's fields (``doc get UNID`` shows them all), and says so.
FIELDS_SUMMARY_CHARS = 60


def _summary(text: str) -> str:
    return text if len(text) <= FIELDS_SUMMARY_CHARS else text[:FIELDS_SUMMARY_CHARS] + "…"


@click.group()
def db() -> None:
    """Document databases (multi-master): create, inspect, set ACLs and forms, replicate on one machine.

    Example: multisite db create /data/profiles --title Profiles
    """


@db.command("create")
@click.argument("dir", type=click.Path(file_okay=False))
@click.option("--title", required=True, help="The database's title.")
@click.option("--replica-of", "replica_of", default=None,
              help="A document database directory, or a replica ID (16 hex digits): make a new replica of it.")
@click.option("--durability", type=click.Choice(["fsync", "group", "none"]), default="fsync", show_default=True)
@click.option("--group-read", is_flag=True,
              help="Let the directory's group read the data (directory 0750, files 0640); by default only its "
                   "owner may (0700, 0600).")
def db_create(dir: str, title: str, replica_of: str | None, durability: str, group_read: bool) -> None:
    """Create a document database (a new replica ID, or --replica-of an existing one), readable by its
    owner only (0700, files 0600), or by its group too with --group-read.

    Example: multisite db create /data/b --title Profiles --replica-of /data/a
    """
    rid = None
    if replica_of:
        rid = docdb.read_identity(replica_of)["replica_id"] if Path(replica_of).is_dir() else replica_of
    with docdb.create(dir, title, replica_id=rid, durability=durability, group_read=group_read) as d:
        console.print(f"document database {title!r} created in {dir}: replica ID {d.replica_id}, "
                      f"database ID {d.db_id}")


@db.command("info")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@on_option
def db_info(dir: str, as_json: bool, on: str | None) -> None:
    """Identity, document count, change number, ACL and forms of a database (through its document server
    while one serves it).

    Example: multisite db info /data/a --json
    """
    with _database(dir, on) as d:
        info = d.info()
    if as_json:
        print_json(info)
        return
    table(f"database {info['title']}", ["property", "value"],
          [(k, json.dumps(v) if isinstance(v, dict) else v) for k, v in info.items()], whole=["value"])


@db.command("acl")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("server")
@click.argument("access", type=click.Choice(docdb.ACCESS_LEVELS))
@on_option
def db_acl(dir: str, server: str, access: str, on: str | None) -> None:
    """Give SERVER (or '*': any other) none, reader or writer access: none hides the database from it, a
    reader may pull but its pushes are refused.

    Example: multisite db acl /data/a B reader
    """
    with _database(dir, on) as d:
        d.set_access(server, access)
        console.print(f"{d.title}: {server} is now {access}; ACL {d.acl()}")


@db.command("form")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("name")
@click.option("--merge/--no-merge", default=False, help="Merge replication conflicts field by field.")
@on_option
def db_form(dir: str, name: str, merge: bool, on: str | None) -> None:
    """Declare a form, with or without "merge replication conflicts".

    Example: multisite db form /data/a Person --merge
    """
    with _database(dir, on) as d:
        d.define_form(name, merge=merge)
        console.print(f"{d.title}: form {name} merge {'on' if merge else 'off'}")


@db.command("replicate")
@click.argument("a", type=click.Path(exists=True, file_okay=False))
@click.argument("b", type=click.Path(exists=True, file_okay=False))
@click.option("--mode", type=click.Choice([m.value for m in Mode]), default="pull-push", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def db_replicate(a: str, b: str, mode: str, as_json: bool) -> None:
    """Replicate two replicas on this machine (no server): A initiates, in MODE. Exits 3
    (REPLICATION_REFUSED) when a direction was refused, as ``replicate`` does.

    Example: multisite db replicate /data/a /data/b --mode pull-push
    """
    t0 = time.perf_counter()
    with docdb.open(a) as da, docdb.open(b) as dbb:
        rep = run_local(da, dbb, Mode(mode), server_a=str(Path(a).name), server_b=str(Path(b).name)).to_dict()
    rep["seconds"] = round(time.perf_counter() - t0, 3)
    _print_report(rep, as_json)
    _exit_if_refused(rep)


@click.group()
def doc() -> None:
    """Documents in a database: create, update, delete, get, list. While a document server serves the
    database they go through that server (found from DIR, or --on HOME); otherwise DIR is opened here.

    Example: multisite doc create /data/a Person '{"name": "Ada"}'
    """


@doc.command("create")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("form")
@click.argument("fields")
@on_option
def doc_create(dir: str, form: str, fields: str, on: str | None) -> None:
    """Create a document; prints its UNID.

    Example: multisite doc create /data/a Person '{"name": "Ada"}'
    """
    with _database(dir, on) as d:
        click.echo(d.create(form, _fields(fields)))


@doc.command("update")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("unid")
@click.argument("fields")
@on_option
def doc_update(dir: str, unid: str, fields: str, on: str | None) -> None:
    """Change fields of a document (a new version: sequence number + 1).

    Example: multisite doc update /data/a 0006... '{"age": 37}'
    """
    with _database(dir, on) as d:
        print_json(d.update(unid, _fields(fields)).public())


@doc.command("delete")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("unid")
@on_option
def doc_delete(dir: str, unid: str, on: str | None) -> None:
    """Delete a document (a deletion stub that replicates).

    Example: multisite doc delete /data/a 0006...
    """
    with _database(dir, on) as d:
        print_json(d.delete(unid).public())


@doc.command("merge")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("unid")
@on_option
def doc_merge(dir: str, unid: str, on: str | None) -> None:
    """Merge a document's conflict documents into it, field by field (the form must merge conflicts:
    db form DIR NAME --merge): a new version takes each conflict's changes to fields its own changes
    did not touch, and those conflict documents go. Sessions never merge (the result would depend on
    the order replicas meet); this is an edit, replicated as one. Prints the new version, or null
    when nothing merges.

    Example: multisite doc merge /data/a 0006...
    """
    with _database(dir, on) as d:
        m = d.merge_conflicts(unid)
        print_json(None if m is None else m.public())


@doc.command("get")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("unid")
@on_option
def doc_get(dir: str, unid: str, on: str | None) -> None:
    """A document with its OID and $Revisions, as JSON.

    Example: multisite doc get /data/a 0006...
    """
    with _database(dir, on) as d:
        x = d.get(unid, include_deleted=True)
        print_json(None if x is None else x.public())


@doc.command("list")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--deleted", is_flag=True, help="Include deletion stubs.")
@on_option
def doc_list(dir: str, as_json: bool, deleted: bool, on: str | None) -> None:
    """Every document: UNID, form, sequence number, conflict flag, fields.

    Example: multisite doc list /data/a --json
    """
    with _database(dir, on) as d:
        docs = [x.public() for x in d.documents(include_deleted=deleted)]
    if as_json:
        print_json(docs)
        return
    table("documents", ["unid", "form", "seq", "conflict", "deleted", "fields"],
          [(x["unid"], x["form"], x["seq"], "yes" if x["conflict"] else "", "yes" if x["deleted"] else "",
            _summary(json.dumps(x["fields"]))) for x in docs], whole=["unid"])


@click.group()
def docserver() -> None:
    """Run a document server: it serves databases to other servers and runs the Replicator.

    Example: multisite docserver start /data/a --name A --listen 127.0.0.1:7300 --home /data/srvA
    """


@docserver.command("start")
@click.argument("dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True, help="The server's name (ACLs and peers name servers).")
@click.option("--listen", required=True, type=HostPort(listen=True), help="HOST:PORT other servers reach it on.")
@click.option("--home", default=None, type=click.Path(file_okay=False),
              help="Where the server keeps its log and run files; names its control socket "
                   "(default: docserver-NAME beside the first DIR).")
@click.option("--replicators", default=1, show_default=True, type=int,
              help="Replicator tasks: sessions with that many servers at once.")
@click.option("--peer", "peers", multiple=True, help="NAME=HOST:PORT of another server (repeatable).")
@click.option("--address-book", default=None, type=click.Path(exists=True, file_okay=False),
              help="A document database holding Connection documents (served and replicated too).")
@click.option("--tls-cert", default=None, help="The server's certificate (PEM): mutual TLS on every link.")
@click.option("--tls-key", default=None)
@click.option("--tls-ca", default=None, help="The CA that signs every trusted server's certificate.")
@click.option("--tls-client-cert", default=None, help="The certificate it presents when it initiates "
                                                      "(default --tls-cert).")
@click.option("--tls-client-key", default=None)
@click.option("--tls-names", is_flag=True, help="A peer is the server its certificate's common name names: a "
                                                "Hello that claims another name is refused (ACLs then trust names).")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one).")
@click.option("--couch-listen", default=None, type=HostPort(listen=True), metavar="HOST:PORT",
              help="Also speak CouchDB's replication protocol on http://HOST:PORT/<database> (PouchDB, CouchDB); "
                   "users from HOME/users.json (multisite user add HOME NAME), access from each database's ACL.")
@click.option("--couch-cors-origin", "couch_cors_origins", multiple=True, metavar="ORIGIN",
              help="A browser origin (scheme://host[:port]) whose pages may call the CouchDB endpoints with the "
                   "user's credentials (repeatable; default: none but the endpoints' own).")
def docserver_start(dirs, name, listen, home, replicators, peers, address_book, tls_cert, tls_key, tls_ca,
                    tls_client_cert, tls_client_key, tls_names, metrics, couch_listen, couch_cors_origins) -> None:
    """Start a document server serving DIRS; returns once it answers.

    Example: multisite docserver start /data/a --name A --listen 127.0.0.1:7300 --home /data/srvA --replicators 2

    Example: multisite docserver start /data/a --name A --listen 127.0.0.1:7300 --couch-listen 127.0.0.1:5984

    Example: ... --couch-listen 0.0.0.0:5984 --couch-cors-origin https://app.example.com
    """
    peer_map = {}
    for p in peers:
        n, sep, addr = p.partition("=")
        if not sep:
            raise ConfigError(f"--peer takes NAME=HOST:PORT, got {p!r}")
        peer_map[n] = addr
    tls = {"cert": tls_cert, "key": tls_key, "ca": tls_ca, "client_cert": tls_client_cert,
           "client_key": tls_client_key, "names": tls_names}
    if not dirs and not address_book:
        raise ConfigError("give at least one database directory (DIR...) to serve")
    home = home or str(Path(dirs[0] if dirs else address_book).absolute().parent / f"docserver-{name}")
    info = start_docserver(Path(home), list(dirs), name, listen, replicators=replicators, peers=peer_map,
                           address_book=address_book, tls=tls, metrics=metrics, couch_listen=couch_listen,
                           couch_cors_origins=couch_cors_origins)
    console.print(f"document server {name} started: pid {info['pid']}, listening on {info['listen']}, "
                  f"home {home}, log {info['log']}"
                  + (f", metrics on port {info['metrics_port']}" if info.get("metrics_port") else "")
                  + (f", CouchDB endpoints on port {info['couch_port']}" if info.get("couch_port") else ""))


@docserver.command("stop")
@click.argument("home", type=click.Path(exists=True, file_okay=False))
def docserver_stop(home: str) -> None:
    """Stop the document server whose home is HOME.

    Example: multisite docserver stop /data/srvA
    """
    console.print(f"document server pid {stop_docserver(Path(home))} stopped")


@docserver.command("status")
@click.argument("home", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def docserver_status(home: str, as_json: bool) -> None:
    """Databases served, replicators busy, sessions done.

    Example: multisite docserver status /data/srvA --json
    """
    st = call(Path(home), "status")
    if as_json:
        print_json(st)
        return
    console.print(f"document server {st['name']} (pid {st['pid']}) on {st['listen']}: {st['replicators']} "
                  f"replicator(s), {len(st['active'])} busy, {st['queued']} queued, {st['sessions_done']} sessions done")
    table("databases", ["title", "replica ID", "database ID", "change no", "path"],
          [(d["title"], d["replica_id"], d["db_id"], d["changeno"], d["path"]) for d in st["databases"]],
          whole=["replica ID", "database ID", "path"])


def _print_report(rep: dict, as_json: bool) -> None:
    if as_json:
        print_json(rep)
        return
    t = rep["totals"]
    console.print(f"{rep['mode']} {rep['server']} ⇄ {rep['peer']}: {t['new']} new, {t['updated']} updated, "
                  f"{t['deleted']} deleted, {t['conflicts']} conflicts, {t['merged']} merged "
                  f"({t['unchanged']} unchanged) in {rep.get('seconds', 0):.3f} s")
    rows = []
    for d in rep["dbs"]:
        for way, refused in (("pulled", _refused(d, "pull")), ("pushed", _refused(d, "push"))):
            s = summary(Counter(d[way]))
            rows.append((d["title"], way, s["new"], s["updated"], s["deleted"], s["conflicts"], s["merged"],
                         "; ".join(refused)))
    if rows:
        table("databases", ["database", "way", "new", "updated", "deleted", "conflicts", "merged", "refused"], rows,
              whole=["database"])
    else:
        console.print("no database in common (matching replica ID) that both servers may replicate")


def _refused(d: dict, way: str) -> list[str]:
    """What was refused of ``way`` (pull, push) for the database of report row ``d``."""
    if "refused_ways" not in d:  # a report from a server before the ways were told apart
        return d["refused"] if way == "pull" else []
    return d["refused_ways"].get(way, [])


def _exit_if_refused(rep: dict) -> None:
    """A session that ran but had a direction refused is not a success: REPLICATION_REFUSED (exit 3),
    naming each refused direction, its databases and the first reason."""
    parts = []
    for way in rep.get("refused_ways", []):
        dbs = [d for d in rep["dbs"] if _refused(d, way)]
        parts.append(f"{way} {'from' if way == 'pull' else 'to'} {rep['peer']} refused for "
                     f"{', '.join(d['title'] for d in dbs)} ({_refused(dbs[0], way)[0]})")
    if parts:
        raise ReplicationRefused("; ".join(parts) + ". The report above shows what did replicate")


def _verb(mode: Mode, name: str, doc_: str):
    @click.command(name, help=doc_)
    @click.argument("server")
    @click.argument("database", required=False)
    @click.option("--on", "home", required=True, type=click.Path(exists=True, file_okay=False),
                  help="HOME of the local document server whose Replicator runs the session.")
    @click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
    def verb(server: str, database: str | None, home: str, as_json: bool) -> None:
        peers = known_peers(Path(home))
        if peers is not None:
            resolve_peer(server, peers, f"of {home}")  # an unknown name: said so, with the names it knows
        try:
            rep = call(Path(home), "replicate", server=server, db=database, mode=mode.value)
        except ConfigError as e:
            if peers is None and ":" not in server:  # the server took it for an address
                raise ConfigError(f"{server!r} is not a known peer of the document server of {home} (its "
                                  f"peers are the --peer NAME=HOST:PORT it was started with); give a peer's "
                                  f"name or HOST:PORT ({e.message})") from None
            raise
        _print_report(rep, as_json)
        _exit_if_refused(rep)
    return verb


_EXIT_STATUS = """

Exit status: 0 when every direction asked for replicated; 3 (REPLICATION_REFUSED) when the session ran
but a direction was refused for some database (an ACL; the report names each); 1 for any other error."""


replicate_cmd = _verb(Mode.PULL_PUSH, "replicate", """Pull then push every database in common with SERVER
(HOST:PORT or a --peer name), or only DATABASE (title or replica ID).

Example: multisite replicate 127.0.0.1:7301 Profiles --on /data/srvA""" + _EXIT_STATUS)
pull_cmd = _verb(Mode.PULL_ONLY, "pull", """Pull from SERVER what changed there (one way).

Example: multisite pull B --on /data/srvA""" + _EXIT_STATUS)
push_cmd = _verb(Mode.PUSH_ONLY, "push", """Push to SERVER what changed here (one way).

Example: multisite push B --on /data/srvA""" + _EXIT_STATUS)


@click.group()
def connections() -> None:
    """Connection documents: replication schedules kept in the address book.

    Example: multisite connections list --on /data/srvA
    """


@connections.command("list")
@click.option("--on", "home", required=True, type=click.Path(exists=True, file_okay=False),
              help="HOME of the document server whose address book to read.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def connections_list(home: str, as_json: bool) -> None:
    """Each connection document with its schedule, last and next run, and last result.

    Example: multisite connections list --on /data/srvA --json
    """
    rows = call(Path(home), "connections")
    if as_json:
        print_json(rows)
        return

    def when(t):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"

    table("connections", ["unid", "source → destination", "mode", "databases", "schedule", "enabled", "last run",
                          "next run", "last result"],
          [(r["unid"], f"{r.get('source')} → {r.get('destination')}", r.get("mode"), r.get("databases"),
            r.get("at") or f"{r.get('range')} every {r.get('interval_s')} s", r.get("enabled"),
            when(r.get("last_run")), when(r.get("next_run")), r.get("last_result") or r.get("error") or "-")
           for r in rows], whole=["unid", "source → destination"])


def register(cli: click.Group) -> None:
    for c in (db, doc, docserver, replicate_cmd, pull_cmd, push_cmd, connections):
        cli.add_command(c)
