"""``multisite pipeline …``: the Spark jobs (export, snapshot, seed, verify, fold), thin over the API.

pyspark is imported only when a command runs, so ``multisite --help`` stays fast.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from .output import Seconds, console, print_json, table

def _verbose(ctx, param, value):
    if value:  # read by pipeline.env.session: Spark's own logs and the JVM's start-up lines on stderr
        import os

        os.environ["MULTISITE_SPARK_VERBOSE"] = "1"


_spark_options = [
    click.option("--verbose", is_flag=True, expose_value=False, callback=_verbose,
                 help="Show Spark's own start-up lines and logs (kept off the terminal by default)."),
    click.option("--master", default=None, help="Spark master (default local[*], or MULTISITE_SPARK_MASTER)."),
    click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting (repeatable)."),
    click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable shape)."),
]


def spark_options(fn):
    for opt in reversed(_spark_options):
        fn = opt(fn)
    return fn


class Progress:
    """A one-line status with elapsed time for people; silent with --json."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.t0 = time.time()
        self.status = None if quiet else console.status("starting")
        if self.status:
            self.status.start()

    def __call__(self, msg: str) -> None:
        if self.status:
            self.status.update(f"[{time.time() - self.t0:6.1f}s] {msg}")
            console.log(msg)

    def close(self) -> None:
        if self.status:
            self.status.stop()


def _session(master, confs, progress):
    from ..errors import ConfigError
    from ..pipeline.env import session

    conf = {}
    for c in confs:
        if "=" not in c:
            raise ConfigError(f"--conf takes KEY=VALUE, got {c!r}")
        k, v = c.split("=", 1)
        conf[k] = v
    progress("starting Spark")
    return session(master, conf=conf)


def _instance(path: str) -> None:
    """Refuse a directory that is not an instance now, not after Spark took its seconds to start."""
    from ..instance.layout import Layout

    Layout.existing(path)


def _instance_not_archive(path: str, why: str) -> None:
    """A job that needs the instance directory itself: an archive given in its place is named as such."""
    from ..errors import ConfigError
    from ..pipeline.archive import is_archive

    if is_archive(path):
        raise ConfigError(f"{path} is a journal archive: {why}; give the instance directory, with the archive "
                          f"as --archive {path}")
    _instance(path)


def _instance_or_snapshot(path: str) -> None:
    if not (Path(path) / "snapshot.json").exists():
        _instance_or_archive(path)


def _instance_or_archive(path: str) -> None:
    """An instance directory, or a journal archive (an s3:// URL, or a directory holding one)."""
    from ..pipeline.archive import is_archive

    if not is_archive(path):
        _instance(path)


def _run_following(as_json: bool, master, confs, job):
    """``_run`` for a job that may run until Ctrl-C (export --follow, stream): None when interrupted or
    when the report was printed as JSON, else the report for the command to print."""
    try:
        rep = _run(as_json, master, confs, job)
    except KeyboardInterrupt:
        return None
    if as_json:
        print_json(rep.to_dict())
        return None
    return rep


def _run(as_json: bool, master, confs, job):
    progress = Progress(as_json)
    try:
        spark = _session(master, confs, progress)
        return job(spark, progress)
    finally:
        progress.close()


@click.group()
def pipeline() -> None:
    """Bulk and analytical jobs over journals and state, on Spark (local[*] or a cluster)."""


@pipeline.command("export")
@click.argument("instance")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False), help="Export directory.")
@click.option("--archive", "archive", default=None,
              help="The instance's journal archive (multisite journal archive): seqnos it holds are read from it.")
@click.option("--follow", is_flag=True, help="Keep exporting new transactions until interrupted.")
@click.option("--interval", type=Seconds(positive=False), default=1.0, show_default=True,
              help="Seconds between --follow runs.")
@spark_options
def export_cmd(instance, to, archive, follow, interval, master, confs, as_json):
    """Export an instance (or its journal archive) to an analytics replica in Parquet (changes + current state).

    Incremental: each run adds the transactions since the last one; transactions that a rollback
    took off the instance are retracted from both tables. INSTANCE is a directory or an archive URL.
    Example: multisite pipeline export /data/A --to /lake/A --archive s3://lake/journals/A --follow
    """
    from ..pipeline.analytics import export

    _instance_or_archive(instance)
    if archive:
        _instance_or_archive(archive)

    def job(spark, progress):
        return export(instance, to, follow=follow, interval_s=interval, spark=spark, progress=progress,
                      archive=archive)

    rep = _run_following(as_json, master, confs, job)
    if rep is None:
        return
    if rep.retracted_from is not None:
        console.print(f"rollback: retracted {rep.retracted_transactions} transaction(s) after seqno "
                      f"{rep.retracted_from}")
    console.print(f"exported {rep.instance} seqnos {rep.from_seqno}..{rep.to_seqno}: {rep.transactions} "
                  f"transaction(s), {rep.updates} update(s) in {rep.seconds:.1f}s -> {rep.path}")


@pipeline.command("stream")
@click.argument("instance")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False), help="Change table directory.")
@click.option("--checkpoint", default=None, type=click.Path(file_okay=False),
              help="Spark checkpoint directory (default TO/_checkpoint).")
@click.option("--consumer", default="changes", show_default=True,
              help="Name of the journal position this stream keeps (journal prune honours it).")
@click.option("--max-transactions-per-batch", type=click.IntRange(min=1), default=None,
              help="Cap a micro-batch (a stream starting far behind).")
@click.option("--available-now", is_flag=True, help="Write what the journal holds now, then stop.")
@click.option("--seconds", "seconds_s", type=Seconds(positive=True), default=None,
              help="Stop after this many seconds (default: until interrupted).")
@spark_options
def stream_cmd(instance, to, checkpoint, consumer, max_transactions_per_batch, available_now, seconds_s, master,
               confs, as_json):
    """Keep a Parquet change table current from a live instance, a micro-batch or two behind.

    Micro-batches back to back, each written as one Parquet file TO/batch=N/part-00000.parquet
    (complete when it appears); a restart goes on from the checkpoint, each transaction once. A stream
    whose query dies (or ends by itself) ends the command with `error: PIPELINE: …` naming the cause
    and exit status 1.
    Example: multisite pipeline stream /data/A --to /lake/A-changes
    """
    from ..pipeline.stream_sink import stream_changes

    _instance_not_archive(instance, "a stream follows a live instance")

    def job(spark, progress):
        return stream_changes(instance, to, checkpoint=checkpoint, consumer=consumer,
                              max_transactions_per_batch=max_transactions_per_batch, available_now=available_now,
                              seconds_s=seconds_s, spark=spark, progress=progress)

    rep = _run_following(as_json, master, confs, job)
    if rep is None:
        return
    console.print(f"streamed {rep.instance}: {rep.batches} batch(es), {rep.rows} row(s) in {rep.seconds:.1f}s "
                  f"-> {rep.table}")


@pipeline.command("snapshot")
@click.argument("instance")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False), help="New snapshot directory.")
@click.option("--at", "at", type=click.IntRange(min=0), default=None,
              help="Seqno of the state (default: the journal's end).")
@click.option("--archive", "archive", default=None,
              help="The instance's journal archive (multisite journal archive): seqnos pruned from the "
                   "instance are read from it.")
@spark_options
def snapshot_cmd(instance, to, at, archive, master, confs, as_json):
    """Write a consistent checkpoint of an instance's replicated state at a seqno as Parquet.

    Keys of unreplicated regions are local to the instance and are left out (their definitions are kept).
    A state before the store's seqno is folded from the journal: give --archive when it was pruned.

    Example: multisite pipeline snapshot /data/A --to /snap/A --at 1000000 --archive s3://lake/journals/A
    """
    from ..errors import InstanceExists
    from ..pipeline.seeding import snapshot

    _instance_not_archive(instance, "a snapshot (to seed a replica from) carries the instance's history")
    if archive:
        _instance_or_archive(archive)
    dest = Path(to).absolute()
    if dest.exists() and any(dest.iterdir()):  # as snapshot() checks, before Spark starts
        raise InstanceExists(f"snapshot destination {dest} exists and is not empty; choose a new directory")
    rep = _run(as_json, master, confs, lambda spark, p: snapshot(instance, to, at=at, spark=spark, progress=p,
                                                                 archive=archive))
    if as_json:
        print_json(rep.__dict__)
    else:
        console.print(f"snapshot of {rep.instance} at seqno {rep.seqno}: {rep.keys} key(s) in {rep.seconds:.1f}s "
                      f"-> {rep.path}")


@pipeline.command("seed")
@click.argument("snapshot", type=click.Path(exists=True, file_okay=False))
@click.option("--into", "into", required=True, type=click.Path(file_okay=False), help="New instance directory.")
@click.option("--name", required=True, help="Name of the new instance.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def seed_cmd(snapshot, into, name, as_json):
    """Create a new instance from a snapshot; a Source Server then catches it up from the snapshot's seqno.

    Example: multisite pipeline seed /snap/A --into /data/C --name C
    """
    from ..pipeline.seeding import seed

    progress = Progress(as_json)
    try:
        rep = seed(snapshot, into, name=name, progress=progress)
    finally:
        progress.close()
    if as_json:
        print_json(rep.__dict__)
    else:
        console.print(f"seeded {rep.name} at {rep.path} with {rep.keys} key(s) at seqno {rep.seqno}; replicate "
                      f"to it from seqno {rep.seqno + 1}")


@pipeline.command("verify")
@click.argument("a")
@click.argument("b")
@click.option("--at", "at", type=click.IntRange(min=0), default=None,
              help="Seqno to compare at (default: the lower end).")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Write the differing keys here as Parquet.")
@click.option("--engine", type=click.Choice(["auto", "local", "spark"]), default="auto", show_default=True,
              help="auto: small inputs (under 100,000 keys) without starting Spark, the rest on Spark.")
@spark_options
def verify_cmd(a, b, at, out, engine, master, confs, as_json):
    """Compare two instances' (snapshots', journal archives') replicated states key by key at one seqno.

    The sides are compared at the lower of their ends (or --at); a side past it is reported as ahead
    by N transactions. Exit status: 0 equal at the same end, 1 different, 3 equal at the seqno compared
    but one side is ahead. Unreplicated regions are local to each instance and are not compared.

    Example: multisite pipeline verify /data/A /data/B --out /tmp/diff
    """
    from ..pipeline.compare import verify

    _instance_or_snapshot(a)
    _instance_or_snapshot(b)
    progress = Progress(as_json)
    try:
        rep = verify(a, b, at=at, out=out, engine=engine, progress=progress,
                     spark_factory=lambda: _session(master, confs, progress))
    finally:
        progress.close()
    if as_json:
        print_json(rep.to_dict())
    else:
        if rep.sample:
            table(f"differences (first {len(rep.sample)})", ["difference", "region", "key", "value in A",
                                                            "value in B"],
                  [[r["difference"], r["region"], r["key_text"], r["value_a"], r["value_b"]] for r in rep.sample],
                  whole=["key"])
        console.print(f"{rep.summary()} ({rep.seconds:.1f}s)"
                      + (f"; differences in {rep.diff_path}" if rep.diff_path else ""))
    if not rep.equal:
        sys.exit(1)
    if rep.ahead:
        sys.exit(3)


@pipeline.command("fold")
@click.argument("instance")
@click.option("--into", "into", required=True, type=click.Path(exists=True, file_okay=False),
              help="The far-behind replica (closed) to bring forward.")
@click.option("--from", "from_seqno", type=click.IntRange(min=1), default=None,
              help="First seqno (default: the replica's + 1).")
@click.option("--to", "to_seqno", type=click.IntRange(min=0), default=None,
              help="Last seqno (default: the source's end).")
@click.option("--archive", "archive", default=None,
              help="The source's journal archive (multisite journal archive): seqnos it holds are read from it.")
@spark_options
def fold_cmd(instance, into, from_seqno, to_seqno, archive, master, confs, as_json):
    """Fold a journal range into the final state per key and apply it to a far-behind replica in bulk.

    INSTANCE is the source's directory (the replica adopts its history records); seqnos pruned from it
    are read from its journal archive (--archive).

    Example: multisite pipeline fold /data/A --into /data/B --from 1000001 --to 9000000 --archive s3://lake/journals/A
    """
    from ..pipeline.catchup import fold

    _instance_not_archive(instance, "the replica adopts the source's history records, which its directory keeps")
    _instance(into)
    if archive:
        _instance_or_archive(archive)
    rep = _run(as_json, master, confs,
               lambda spark, p: fold(instance, into, from_seqno, to_seqno, spark=spark, progress=p,
                                     archive=archive))
    if as_json:
        print_json(rep.__dict__)
    else:
        console.print(f"folded seqnos {rep.from_seqno}..{rep.to_seqno} ({rep.updates_read} updates) into "
                      f"{rep.replica}: {rep.points} key(s) written, {rep.kills} kill(s) in {rep.seconds:.1f}s")


def register(cli: click.Group) -> None:
    cli.add_command(pipeline)
