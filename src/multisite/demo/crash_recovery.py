"""Act 1 (engine): commit a workload with a progress bar; start a writer process, SIGKILL it mid-stream,
reopen, report what recovery found and check that every acknowledged transaction is there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import engine as database
from ..journal.reader import iter_records


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


def act_crash_recovery(console: Console, root: Path, *, transactions: int = 5_000) -> bool:
    console.rule("[bold]Act 1: journaled commits, a SIGKILLed writer, recovery")
    inst = root / "A"
    database.create(inst, "A", durability="group")
    db = database.open(inst)
    db.create_region("acct")
    db.create_region("scratch", replicated=False)
    with _progress(console) as prog:
        task = prog.add_task("committing transfers", total=transactions)
        rng = random.Random(7)
        for i in range(transactions):
            a, b = rng.randrange(1000), rng.randrange(1000)
            with db.transaction() as tx:
                tx.set("acct", ("acct", a), {"balance": rng.randrange(10_000), "txn": i})
                tx.set("acct", ("acct", b), {"balance": rng.randrange(10_000), "txn": i})
                tx.set("acct", ("log", i), {"from": a, "to": b})
            if i % 500 == 0:
                prog.update(task, completed=i + 1)
        prog.update(task, completed=transactions)
    console.print(f"committed {transactions:,} transactions; instance A is at seqno {db.seqno:,}")
    db.close()

    console.print("starting a writer process that reports each acknowledged commit ...")
    proc = subprocess.Popen([sys.executable, "-m", "multisite.testing.crash_writer", str(inst),
                             "--durability", "fsync"], stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, int]] = []
    kill_after = random.Random().randrange(300, 1500)
    assert proc.stdout is not None
    with _progress(console) as prog:
        task = prog.add_task("writer commits (fsync) until SIGKILL", total=kill_after)
        for line in proc.stdout:
            if line.startswith("ACK"):
                _, seqno, i = line.split()
                acked.append((int(seqno), int(i)))
                prog.update(task, completed=len(acked))
                if len(acked) >= kill_after:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
    proc.wait()
    console.print(f"[red]SIGKILLed[/red] writer pid {proc.pid} after {len(acked):,} acknowledged commits "
                  f"(last acknowledged seqno {acked[-1][0]:,})")

    db = database.open(inst)
    console.print(f"recovery: {db.recovery.summary()}")
    missing = [i for _, i in acked if db.get("crash", ("w", i)) is None or db.get("crash", ("w2", i)) != i]
    partial = [k for k, _ in db.items("crash", start=("w",), stop=("w", "")) if db.get("crash", ("w2", k[1])) is None]
    seqnos = [r.seqno for r in iter_records(inst / "journal")]
    contiguous = seqnos == list(range(1, len(seqnos) + 1))
    ok = not missing and not partial and contiguous and db.seqno >= acked[-1][0]
    console.print(f"acknowledged transactions present: {len(acked) - len(missing):,}/{len(acked):,}; "
                  f"partial transactions visible: {len(partial)}; journal seqnos 1..{seqnos[-1]:,} "
                  f"contiguous: {contiguous}")
    db.close()
    console.print("[bold green]every acknowledged transaction survived the crash[/]" if ok
                  else "[bold red]RECOVERY CHECK FAILED[/]")
    return ok

