"""``multisite rollback``, ``multisite instance role``, ``multisite lost show`` and ``lost may-have-changed``:
failover tools.

Each works on a running instance server (through its control channel) or, when none runs, on the
instance directory directly.
"""

from __future__ import annotations

from pathlib import Path

import click

from .. import engine as database
from ..errors import ConfigError, RollbackError
from ..instance.layout import Layout
from ..net import control
from ..server.client import fetch_hello
from ..journal.lostfile import LostFile
from ..keys import key_text
from ..replication.roles import change_role, resync_instance
from .output import HostPort, KeyArg, console, print_json, table


@click.command("rollback")
@click.argument("dir", type=click.Path())  # checked by Layout.existing: one line, exit 1
@click.option("--fetchresync", type=HostPort(), default=None, metavar="HOST:PORT",
              help="Ask the primary at HOST:PORT (its client port) for the common point and roll back to it.")
@click.option("--resync", type=int, default=None, metavar="SEQNO", help="Roll back to SEQNO.")
@click.option("--tls-ca", default=None, metavar="FILE",
              help="With --fetchresync: the primary's client port takes TLS; trust its certificate if this CA signed it.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def rollback_cmd(dir: str, fetchresync: str | None, resync: int | None, tls_ca: str | None, as_json: bool) -> None:
    """Roll the instance back to a common point; rolled-off transactions go to a lost-transaction file.

    A no-op when the instance is not ahead. Example: multisite rollback /data/A --fetchresync b.example:7000
    """
    root = Layout.existing(dir).root
    if (resync is None) == (fetchresync is None):  # before contacting anyone
        raise ConfigError("give exactly one of --resync SEQNO or --fetchresync HOST:PORT")
    if resync is not None and resync < 0:  # resync_instance calls it "past the end" of the instance
        raise RollbackError(f"--resync {resync} is not a seqno (0 or more); nothing was changed")
    if tls_ca is not None:
        if fetchresync is None:
            raise ConfigError("--tls-ca goes with --fetchresync (the primary's client port)")
        tls_ca = str(Path(tls_ca).absolute())
    if control.is_running(root):
        rep = control.call(root, "rollback", resync=resync, fetchresync=fetchresync,
                           **({"fetch_tls_ca": tls_ca} if tls_ca else {}))
    else:
        primary = fetch_hello(fetchresync, tls_ca) if fetchresync else None
        with database.open(root) as db:
            rep = resync_instance(db, resync, primary, fetchresync or "").__dict__
    if as_json:
        print_json(rep)
    elif rep["rolled_back"]:
        console.print(f"{rep['instance']}: rolled back {rep['rolled_back']} transaction(s), seqno {rep['from_seqno']}"
                      f" -> {rep['to_seqno']}; lost transactions in {rep['lost_file']}")
    else:
        console.print(f"{rep['instance']} is not ahead (seqno {rep['to_seqno']}): nothing to roll back")


@click.command("role")
@click.argument("dir", type=click.Path())  # checked by Layout.existing: one line, exit 1
@click.argument("role", type=click.Choice(["primary", "secondary"]))
def role_cmd(dir: str, role: str) -> None:
    """Make the instance an originating primary or a replicating secondary.

    Refused while a receiver runs when making it primary (stop the receiver first).
    Example: multisite instance role /data/B primary
    """
    root = Layout.existing(dir).root
    if control.is_running(root):
        res = control.call(root, "role", role=role)
        console.print(f"{root.name} is now {res['role']} at seqno {res['seqno']}")
    else:
        with database.open(root) as db:
            change_role(db, role)
            console.print(f"{db.name} is now {db.info.role} at seqno {db.seqno}")


@click.group()
def lost() -> None:
    """Unreplicated Transaction Logs (lost-transaction files) written by rollbacks."""


@lost.command("show")
@click.argument("file", type=click.Path())  # checked by LostFile.read: one line, exit 1
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object: header and transactions.")
def lost_show(file: str, as_json: bool) -> None:
    """List the transactions in a lost-transaction file.

    Each has its seqno and its stream and stream seqno. On a supplementary instance the seqno is the
    instance's own and the stream seqno the one it has on its source (in the stream's numbering).

    Example: multisite lost show /data/A/lost/20260101T000000-A-99-99.mslost
    """
    lf = LostFile.read(file)
    if as_json:
        print_json({"header": lf.header, "transactions": [{k: v for k, v in t.items() if k != "payload"}
                                                          for t in lf.transactions]})
        return
    h = lf.header
    console.print(f"{lf.path.name}: {len(lf.transactions)} transaction(s) rolled off {h['instance']} "
                  f"(seqnos {h['from_seqno']}..{h['to_seqno']}, common point {h['common_seqno']}"
                  + (f" of stream {h['common_seqno_stream']}" if h.get("common_seqno_stream") else "")
                  + f"; {h['reason']})")
    num, groups = lf.numbering or {}, lf.stream_groups
    si = num.get("seqno") == "local"
    if si:
        named = ", ".join(f"{n}: {g}" for n, g in sorted(groups.items()))
        console.print(f"numbering: seqno is {h['instance']}'s own; stream seqno is the seqno on the source, "
                      f"per stream (0: {h['instance']}'s own transactions{', ' + named if named else ''})")
    rows = []
    for t in lf.transactions:
        stream = f"{t['stream']} ({groups[t['stream']]})" if t["stream"] in groups else t["stream"]
        for u in t["updates"]:
            rows.append((t["seqno"], stream, t["stream_seqno"], t["origin"], u["op"], u["region"], u["key"],
                         u.get("value", u.get("killed")), u.get("before")))
    cols = ["seqno (local)" if si else "seqno", "stream", "stream seqno (source)" if si else "stream seqno"]
    table("lost transactions", cols + ["origin", "op", "region", "key", "value", "before"], rows, whole=["key"])


@lost.command("may-have-changed")
@click.argument("file", type=click.Path())  # checked by LostFile.read: one line, exit 1
@click.argument("region")
@click.argument("key", type=KeyArg())
@click.option("--on", "on_dir", type=click.Path(), default=None, metavar="DIR",
              help="Ask GT.M's $ZQGBLMOD question of the instance at DIR (the one that went on): did it change "
                   "the key after the file's common seqno?")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON object: file, region, key, may_have_changed and the changes that say why.")
def lost_may_have_changed(file: str, region: str, key: tuple, on_dir: str | None, as_json: bool) -> None:
    """Could REGION/KEY have been changed: by the lost transactions in FILE, or (--on DIR, $ZQGBLMOD) by
    the instance that went on, after the file's common seqno?

    KEY is a JSON list of strings and integers. Prints "yes" with the updates that changed it (a set or
    zkill of the key, a kill of it or of a key above it), or "no"; the exit status is 0 either way (1 for
    a missing or damaged file or a bad key). With --on, "no" means a lost update of the key can be
    applied again without overwriting a later one.
    Example: multisite lost may-have-changed /data/A/lost/20260101T000000-A-99-99.mslost acct '["k", 42]' --on /data/B
    """
    lf = LostFile.read(file)
    changes = lf.changed_on(on_dir, region, key) if on_dir else lf.changes_to(region, key)
    where = (f"instance {on_dir} after common seqno {lf.header['common_seqno']}" if on_dir
             else f"the lost transactions in {lf.path.name}")
    if as_json:
        print_json({"file": str(lf.path), "region": region, "key": list(key), "on": on_dir,
                    "may_have_changed": bool(changes), "changes": changes})
        return
    ref = f"{region}{key_text(key)}"
    if not changes:
        console.print(f"no: {where} did not change {ref}", markup=False)
        return
    why = ", ".join(f"{c['op']} {region}{key_text(tuple(c['key']))} at seqno {c['seqno']}" for c in changes)
    console.print(f"yes: {ref} was changed by {len(changes)} update(s) of {where}: {why}", markup=False)


def register(cli: click.Group) -> None:
    cli.add_command(rollback_cmd)
    cli.add_command(lost)
    inst = cli.commands["instance"]
    inst.add_command(role_cmd)  # type: ignore[attr-defined]
