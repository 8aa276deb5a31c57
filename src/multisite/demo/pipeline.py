"""Act 8: the data pipeline on the log-shipping act's instances.

A and B (act 2, servers stopped) are compared key by key with ``verify`` (small: in this process,
without Spark); A is exported through Spark to an analytics replica in Parquet (changes + state); a
few transactions are committed to A, exported, then rolled back on A, and the next export retracts
them from the change table and the state; a small table of the replica is printed (keys per kind,
the newest transactions). Skipped, saying so, only when no Java that Spark can use is found.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import MultisiteError, PipelineError

ROLLED_BACK = 3  # transactions committed to A, exported, then rolled back


def act_pipeline(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 8: the pipeline: log-shipping instances exported through Spark, a rollback retracted")
    from ..pipeline.env import find_java_home

    a, b = root / "log-shipping" / "A", root / "log-shipping" / "B"
    if not (a / "journal").is_dir() or not (b / "journal").is_dir():
        console.print("[bold red]the log-shipping act left no instances A and B to export[/]")
        return False
    try:
        find_java_home()
    except PipelineError as e:
        console.print(f"[yellow]Act 8 skipped: Spark needs Java and none was found ({e.message})[/]")
        return True
    try:
        return _play(console, root, a, b)
    except MultisiteError as e:
        console.print(f"[bold red]pipeline act stopped: {e}[/]")
        return False


def _play(console: Console, root: Path, a: Path, b: Path) -> bool:
    import multisite
    from multisite import pipeline

    ok = True
    rep = pipeline.verify(str(a), str(b))
    console.print(f"verify A B ({rep.engine}, {rep.seconds:.1f} s): {rep.summary()}")
    ok &= rep.in_sync
    lake = root / "pipeline" / "lake-A"
    shutil.rmtree(lake, ignore_errors=True)
    console.print("starting Spark (local[2]) ...")
    spark = pipeline.session(master="local[2]", conf={"spark.sql.shuffle.partitions": "2",
                                                      "spark.default.parallelism": "2", "spark.driver.memory": "1g"})
    try:
        e = pipeline.export(str(a), str(lake), spark=spark)
        console.print(f"exported A seqnos {e.from_seqno}..{e.to_seqno} to Parquet: {e.transactions} transactions, "
                      f"{e.updates} updates in {e.seconds:.1f} s -> {lake}")
        with multisite.open(a) as db:
            base = db.seqno
            for i in range(ROLLED_BACK):
                with db.transaction() as tx:
                    tx.set("acct", ("rolled-back", i), {"note": "committed on A, never replicated"})
        e = pipeline.export(str(a), str(lake), spark=spark)
        seen = _count(spark, lake / "changes")
        console.print(f"committed {ROLLED_BACK} transactions to A and exported them: {seen} change row(s) of "
                      f"('rolled-back', …) in the replica")
        with multisite.open(a) as db:
            rb = db.rollback(base, reason="demo: take back what B never got")
        console.print(f"rolled A back to seqno {base}: {rb.rolled_back} transaction(s) into its lost-transaction "
                      f"file {rb.lost_file}")
        e = pipeline.export(str(a), str(lake), spark=spark)
        left, state_left = _count(spark, lake / "changes"), _count(spark, lake / "state")
        retracted = spark.read.parquet(str(lake / "retracted")).where(f"seqno > {base}").count()
        console.print(f"the next export found the rollback: retracted {e.retracted_transactions} transaction(s) after "
                      f"seqno {e.retracted_from}; ('rolled-back', …) rows now: {left} in changes, {state_left} in "
                      f"state; retracted/ lists {retracted} transaction(s)")
        ok &= (seen == ROLLED_BACK and e.retracted_from == base and e.retracted_transactions == ROLLED_BACK
               and left == 0 and state_left == 0 and retracted == ROLLED_BACK)
        _tables(console, spark, lake)
    finally:
        spark.stop()
    rep = pipeline.verify(str(a), str(b))
    console.print(f"verify A B after the rollback: {rep.summary()}")
    ok &= rep.in_sync
    console.print("[bold green]the analytics replica follows A, rollback included; A and B verify equal[/]" if ok
                  else "[bold red]PIPELINE CHECK FAILED[/]")
    return ok


def _count(spark, path: Path) -> int:
    from pyspark.sql import functions as F

    if not path.exists() or not any(path.rglob("*.parquet")):
        return 0
    return spark.read.parquet(str(path)).where(F.col("key_text").startswith('("rolled-back"')).count()


def _tables(console: Console, spark, lake: Path) -> None:
    from pyspark.sql import functions as F

    state = spark.read.parquet(str(lake / "state"))
    kinds = (state.withColumn("kind", F.col("key")[0]["s"]).groupBy("region", "kind")
             .agg(F.count(F.lit(1)).alias("keys"), F.sum("value_size").alias("bytes")).orderBy("region", "kind")
             .collect())
    t = Table(title="analytics replica of A: current state by kind of key")
    for c in ("region", "kind", "keys", "value bytes"):
        t.add_column(c)
    for r in kinds:
        t.add_row(r["region"], str(r["kind"]), f"{r['keys']:,}", f"{r['bytes']:,}")
    console.print(t)
    changes = spark.read.parquet(str(lake / "changes"))
    newest = (changes.groupBy("seqno").agg(F.min("commit_time").alias("at"), F.count(F.lit(1)).alias("updates"),
                                           F.concat_ws(" ", F.collect_list("op")).alias("ops"))
              .orderBy(F.col("seqno").desc()).limit(5).collect())
    t = Table(title="analytics replica of A: the newest transactions")
    for c in ("seqno", "committed (UTC)", "updates", "ops"):
        t.add_column(c)
    for r in newest:
        t.add_row(str(r["seqno"]), r["at"].strftime("%H:%M:%S.%f")[:-3], str(r["updates"]), r["ops"])
    console.print(t)
