"""``multisite journal …``: extract, prune, index, and the positions pipeline consumers keep."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import ConfigError, JournalGap
from ..instance.layout import Layout
from ..instance.maintenance import prune
from ..journal.extract import record_lines, record_to_dict
from ..journal.reader import iter_records
from .output import console, table


@click.group()
def journal() -> None:
    """Inspect and maintain an instance's journal."""


@journal.command("show")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--from", "from_seqno", type=int, default=None, help="First seqno (default: oldest kept).")
@click.option("--to", "to_seqno", type=int, default=None, help="Last seqno (default: newest).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per transaction, one per line.")
def show(dir: str, from_seqno: int | None, to_seqno: int | None, as_json: bool) -> None:
    """Extract journal records in readable form (like a journal extract).

    Example: multisite journal show /data/A --from 100 --to 120
    """
    lay = Layout.existing(dir)
    from ..instance.maintenance import recover_journal_hinted

    js = recover_journal_hinted(lay.journal, repair=False)  # the segments and the last intact seqno; changes nothing
    infos, last = js.segments, js.last_seqno
    first = infos[0].first_seqno
    for opt, v in (("--from", from_seqno), ("--to", to_seqno)):
        if v is not None and v < 1:
            raise ConfigError(f"{opt} must be a positive seqno, got {v}")
    if from_seqno is not None and to_seqno is not None and to_seqno < from_seqno:
        raise ConfigError(f"--to {to_seqno} is before --from {from_seqno}: the range is empty")
    if from_seqno is not None and from_seqno > last:
        raise ConfigError(f"--from {from_seqno} is past the end of the journal of {lay.root}: its last seqno is "
                          f"{last}" + ("" if last else " (no transaction yet)"))
    if to_seqno is not None and to_seqno < first:
        raise JournalGap(f"seqnos up to {to_seqno} are no longer in the journal at {lay.journal} (the oldest "
                         f"segment starts at {first}); they were pruned")
    start = from_seqno if from_seqno is not None else first
    out = sys.stdout
    for rec in iter_records(lay.journal, start, to_seqno, infos):
        if as_json:
            out.write(json.dumps(record_to_dict(rec), default=repr, ensure_ascii=False) + "\n")
        else:
            out.write("\n".join(record_lines(rec)) + "\n")


@journal.command("prune")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--before", type=int, required=True, help="Remove segments holding only seqnos below this.")
@click.option("--require-archived/--no-require-archived", default=None,
              help="Keep segments no journal archive holds yet (default: when an archive is recorded).")
def prune_cmd(dir: str, before: int, require_archived: bool | None) -> None:
    """Remove whole journal segments no longer needed by anyone.

    A segment goes only if all its seqnos are below --before and below what every source slot and
    pipeline consumer still needs, and (when archiving is required) a journal archive holds them.
    Example: multisite journal prune /data/A --before 1000000
    """
    rep = prune(dir, before, require_archived=require_archived)
    console.print(f"removed {len(rep.removed)} segment(s) {', '.join(rep.removed)}; journal now starts at seqno "
                  f"{rep.kept_from_seqno}; limit was seqno {rep.limit_seqno} ({rep.reason})")


@journal.command("repair")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--yes", is_flag=True, help="Make the cut (without it: only show what it would drop).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def repair_cmd(dir: str, yes: bool, as_json: bool) -> None:
    """Cut the newest journal segment at damage a power loss left, when nothing proves it acknowledged.

    An instance whose newest segment has a damaged record with intact records after it does not
    open (JOURNAL_CORRUPT). After a power loss those records may never have been acknowledged (group
    commit writes the next batch while the previous one is being hardened). This shows the damage,
    the records after it and who confirmed them; with --yes it saves those records to a lost file
    (lost/) and cuts the journal at the damage. Refused when the store proves the damaged records
    were acknowledged. Example: multisite journal repair /data/A --yes
    """
    from ..instance import repair as jr

    p = jr.repair(dir) if yes else jr.plan(dir)
    if as_json:
        print(json.dumps(None if p is None else p.to_dict()))
        return
    if p is None:
        console.print("the newest journal segment has no damage to cut: the instance opens as it is")
        return
    after = p.intact_after
    table("journal damage", ["segment", "offset", "last intact seqno", "damaged bytes", "intact records after",
                             "store seqno"],
          [(Path(p.segment).name, p.offset, p.last_intact_seqno, p.damaged_bytes,
            f"{len(after)} (seqnos {after[0]}..{after[-1]})", p.store_seqno)], whole=["segment"])
    for name, seqno in p.confirmed.items():
        console.print(f"secondary {name} confirmed up to seqno {seqno}: after the cut it is ahead, and rolls back "
                      f"to {p.last_intact_seqno} when it next connects (multisite rollback --fetchresync)")
    if p.refused:
        console.print(f"[red]will not cut:[/] {p.refused}")
    elif yes:
        console.print(f"cut the journal at offset {p.offset}: it ends at seqno {p.last_intact_seqno}; the "
                      f"{len(after)} intact records after the damage are in {p.lost_file}")
    else:
        console.print(f"run again with --yes to cut the journal at seqno {p.last_intact_seqno}, keeping the "
                      f"{len(after)} records after the damage in a lost file")


@journal.command("index")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--jobs", type=click.IntRange(1, 1024), default=None,
              help="Worker processes (default: the usable cores, at most 8, as many as the free memory holds).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable shape).")
def index_cmd(dir: str, jobs: int | None, as_json: bool) -> None:
    """Write the journal index: columnar copies of journal frames that Spark reads instead of decoding.

    Only what is missing is written (sealed segments, and runs of 8 MiB or more of the open one); the
    Spark source also writes it as it reads, so this only saves the first reader the work. Needs
    pyarrow. Example: multisite journal index /data/A --jobs 4
    """
    from ..pipeline.journal_frames import index_journal
    from .output import print_json

    rep = index_journal(dir, jobs=jobs)
    for note in rep.notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        print_json(rep.to_dict())
    else:
        console.print(f"indexed {rep.frames:,} transaction(s), {rep.rows:,} update(s) of {rep.instance} into "
                      f"{rep.pieces_written} piece(s) in {rep.seconds:.1f} s with {rep.jobs} process(es)")


@journal.command("consumers")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--forget", "forget_name", default=None, metavar="NAME",
              help="Release the position of consumer NAME (a stream that is gone), so prune may go past it.")
@click.option("--json", "as_json", is_flag=True, help="Print the positions as JSON.")
def consumers_cmd(dir: str, forget_name: str | None, as_json: bool) -> None:
    """List the positions that pipeline consumers (Spark streams, exports) keep in the journal.

    Prune never removes a segment holding a seqno a consumer has not consumed. A stream whose
    checkpoint is gone keeps its position until it is forgotten.
    Example: multisite journal consumers /data/A --forget spark
    """
    import datetime as dt

    from ..instance import consumers
    from .output import print_json, table

    lay = Layout.existing(dir)
    if forget_name is not None:
        if not consumers.forget(lay, forget_name):
            raise ConfigError(f"no consumer named {forget_name!r} keeps a position in {dir}; "
                              f"list them with: multisite journal consumers {dir}")
        console.print(f"released consumer {forget_name}")
        return
    rows = consumers.load_all(lay)
    if as_json:
        print_json([{"name": p.name, "last_confirmed": p.last_confirmed, "updated": p.updated} for p in rows])
        return
    table(f"journal consumers of {dir}", ["consumer", "consumed up to seqno", "updated (UTC)"],
          [[p.name, f"{p.last_confirmed:,}",
            dt.datetime.fromtimestamp(p.updated, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")] for p in rows],
          whole=["consumer"])


@journal.command("archive")
@click.argument("dir", required=False, metavar="[DIR]")
@click.option("--to", "url", default=None,
              help="Archive location: a path, file://… or s3://BUCKET/PREFIX (endpoint and keys from the "
                   "environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).")
@click.option("--follow", is_flag=True, help="Keep archiving segments as they are sealed, until interrupted; an unreachable "
                                            "store is logged and tried again (backoff up to 30 s).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True,
              help="Seconds between --follow passes.")
@click.option("--rate-bytes-per-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Copy at most this many bytes per second.")
@click.option("--check", "check_only", is_flag=True,
              help="Copy nothing: re-read every archived file and name those whose CRC differs (exit 1).")
@click.option("--drop", "drop_url", default=None, metavar="URL",
              help="Forget the archive at URL (given up; stop its archiver first): prune no longer keeps segments "
                   "for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable shape).")
def archive_cmd(dir: str | None, url: str | None, follow: bool, interval_s: float, rate_bytes_per_s: float | None,
                check_only: bool, drop_url: str | None, as_json: bool) -> None:
    """Copy sealed journal segments and their index pieces to shared storage, each checked by CRC.

    Resumes where a stopped run left off; records what is archived, so that `journal prune` keeps
    every segment no archive holds yet. Spark jobs read the archive by its URL.
    `--check` reads only the archive: `multisite journal archive --check --to URL` (or `--check URL`)
    needs no instance directory.
    Example: multisite journal archive /data/A --to s3://lake/journals/A --follow
    """
    from ..pipeline.archive import archive
    from .output import print_json

    if check_only:
        if url is None and dir is not None:
            url, dir = dir, None  # --check URL: the archive is all it reads
        if dir is not None:
            Layout.existing(dir)  # given: still checked, so a typo is not silently ignored
        if url is None:
            raise ConfigError("give the archive to check: --check --to URL (no instance directory needed)")
        _check_archive(url, as_json)
        return
    if dir is None:
        raise ConfigError("give the instance directory: multisite journal archive DIR --to URL")
    lay = Layout.existing(dir)
    if drop_url is not None:
        from ..instance import archives

        if not archives.forget(lay, drop_url):
            raise ConfigError(f"no journal archive {drop_url!r} is recorded for {dir}; recorded: "
                              f"{', '.join(m.url for m in archives.load_all(lay)) or 'none'}")
        console.print(f"forgot the journal archive {drop_url}: prune no longer keeps segments for it")
        return
    if url is None:
        raise ConfigError("give the archive location: --to URL (or --drop URL to forget one)")
    progress = None if as_json else (lambda msg: console.log(msg))
    try:
        rep = archive(dir, url, follow=follow, interval_s=interval_s, rate_bytes_per_s=rate_bytes_per_s,
                      progress=progress)
    except KeyboardInterrupt:
        return
    if as_json:
        print_json(rep.to_dict())
    else:
        console.print(f"archived {len(rep.segments_copied)} segment(s) ({rep.bytes_copied:,} bytes, "
                      f"{rep.pieces_copied} index piece(s)) of {rep.instance} to {url}; it holds seqnos "
                      f"{rep.first_archived}..{rep.last_archived}")


def _check_archive(url: str, as_json: bool) -> None:
    """``journal archive --check``: re-read every archived file; exit 1 (ArchiveCorrupt) if one differs."""
    from ..errors import ArchiveCorrupt
    from ..pipeline.archive import check
    from .output import print_json

    rep = check(url)
    if as_json:
        print_json(rep.to_dict())
    else:
        if rep.damaged:
            table(f"damaged files in {url}", ["file", "problem"], [[d["path"], d["problem"]] for d in rep.damaged],
                  whole=["file"])
        console.print(f"checked {rep.files} archived file(s) of {rep.instance} (seqnos {rep.first_archived}.."
                      f"{rep.last_archived}): {len(rep.damaged)} damaged")
    if rep.damaged:
        raise ArchiveCorrupt(f"{len(rep.damaged)} archived file(s) damaged: "
                             + ", ".join(d["path"] for d in rep.damaged))
