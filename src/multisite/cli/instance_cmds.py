"""``multisite instance …`` and ``multisite backup``."""

from __future__ import annotations

import time

import click

from .. import engine as database
from ..journal.durability import CHOICES as DURABILITY_CHOICES, Durability
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from ..instance.maintenance import backup
from ..instance.maintenance import recover_journal_hinted
from .output import MAX_MIB, console, print_json, table


@click.group()
def instance() -> None:
    """Create and inspect instances (a directory holding one replicated database)."""


@instance.command("create")
@click.argument("dir", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Instance name, unique within the LMS group.")
@click.option("--group", default="default", show_default=True, help="LMS group the instance belongs to.")
@click.option("--supplementary", is_flag=True, help="Supplementary (SI) instance: may originate updates "
              "while receiving a stream.")
@click.option("--durability", type=click.Choice(DURABILITY_CHOICES), default=Durability.FSYNC.value, show_default=True)
@click.option("--segment-mib", type=click.IntRange(1, MAX_MIB), default=64, show_default=True,
              help="Journal segment size limit.")
@click.option("--journal-pool-mib", type=click.IntRange(1, MAX_MIB), default=64, show_default=True,
              help="Journal pool size.")
@click.option("--group-read", is_flag=True,
              help="Let the directory's group read the data (directory 0750, files 0640); by default only its "
                   "owner may (0700, 0600).")
def create_cmd(dir: str, name: str, group: str, supplementary: bool, durability: str, segment_mib: int,
               journal_pool_mib: int, group_read: bool) -> None:
    """Create an empty instance: a directory only its owner may read (0700, files 0600), or its group
    too with --group-read.

    Example: multisite instance create /data/A --name A --group bank
    """
    root = database.create(dir, name, group=group, supplementary=supplementary, durability=durability,
                           segment_bytes=segment_mib * 1024 * 1024,
                           journal_pool_bytes=journal_pool_mib * 1024 * 1024, group_read=group_read)
    click.echo(f"created instance {name} (group {group}{', supplementary' if supplementary else ''}) at {root}")


@instance.command("show")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def show_cmd(dir: str, as_json: bool) -> None:
    """Print the replication instance file: header, source slots, history records (and SI streams).

    Example: multisite instance show /data/A --json
    """
    lay = Layout.existing(dir)
    inst = ifile.load(lay.instance_file)
    js = recover_journal_hinted(lay.journal, repair=False)
    d = inst.to_dict()
    d["journal_seqno"] = js.last_seqno
    d["journal_segments"] = len(js.segments)
    if as_json:
        print_json(d)
        return
    table(f"instance {inst.name}", ["field", "value"], [
        ("name", inst.name), ("group", inst.group), ("supplementary", inst.supplementary),
        ("role", inst.role), ("journal seqno", js.last_seqno), ("segments", len(js.segments)),
        ("durability", inst.durability),
        ("created", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(inst.created))),
    ])
    table("source slots", ["name", "kind", "mode", "last sent", "last confirmed"],
          [(s.name, s.kind, s.mode, s.last_sent, s.last_confirmed) for s in inst.slots.values()], whole=["name"])
    table("history", ["start seqno", "root primary", "role", "upstream", "stream", "stream start"],
          [(h.start_seqno, h.root_primary, h.role, h.upstream or "-", h.stream, h.stream_start)
           for h in inst.history], whole=["root primary", "upstream"])
    if inst.supplementary:
        table("SI streams (0: this instance's own)", ["stream", "source group", "root primary", "last stream seqno",
                                                      "history records"],
              [(n, st.source_group, st.root_primary or "-", st.last_stream_seqno, len(st.history))
               for n, st in sorted(inst.streams.items())], whole=["source group", "root primary"])


@click.command("backup")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
def backup_cmd(dir: str, dest: str) -> None:
    """Make a consistent copy (store, journal, instance file) that opens as a working instance.

    Safe while the instance is in use. Example: multisite backup /data/A /backups/A-monday
    """
    rep = backup(dir, dest)
    console.print(f"backed up to {rep.dest}: store at seqno {rep.store_seqno}, {rep.segments} journal "
                  f"segment(s), {rep.bytes_copied:,} bytes; opening it rolls forward from the journal")
