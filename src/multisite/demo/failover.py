"""Act 3 (failover): the primary dies, its secondary takes over, the old primary rolls back and rejoins.

A replicates to B. A's last transactions never reach B (its Source Server is deactivated for them,
as when a link is down when the data center goes), then A is SIGKILLed. B is promoted: its
Receiver Server stops and it becomes an originating primary, with a new history record, and takes
the application's commits. A comes back, asks B for the common point (``rollback --fetchresync``),
rolls its unreplicated transactions off into an Unreplicated Transaction Log, whose contents the act
prints, and rejoins as B's secondary. At the end A and B are compared key by key.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from ..errors import MultisiteError
from ..journal.lostfile import LostFile
from ..testing.cluster import Cluster
from .compare import Snapshot, report

REPLICATED = 300  # transactions A commits and B receives
UNREPLICATED = 5  # A's last transactions, never sent to B
ON_B = 50  # transactions B commits once promoted
CATCH_UP_TIMEOUT_S = 60.0


def act_failover(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 3: failover A → B, rollback of A into a lost-transaction file, A rejoins")
    cluster = Cluster(root / "failover")
    try:
        a, b = cluster.instance("A"), cluster.instance("B")
        cluster.link(a, b)
        with a.client() as db:
            db.create_region("orders")
            for i in range(REPLICATED):
                db.set("orders", ("A", i), {"by": "A", "n": i})
        cluster.wait_caught_up(a, b)
        console.print(f"A committed {REPLICATED} transactions; B has them all (seqno {b.seqno()})")
        a.call("source.deactivate", secondary="B")
        with a.client() as db:
            for i in range(REPLICATED, REPLICATED + UNREPLICATED):
                db.set("orders", ("A", i), {"by": "A", "n": i, "note": "never reached B"})
        console.print(f"A's link to B is down; A commits {UNREPLICATED} more transactions (seqno {a.seqno()})")
        pid = a.pid
        a.kill()
        t0 = time.perf_counter()
        b.call("receiver.stop")
        b.call("role", role="primary")
        with b.client() as db:
            first = db.set("orders", ("B", 0), {"by": "B", "n": 0})
        took = time.perf_counter() - t0
        console.print(f"[red]SIGKILL[/] A (pid {pid}); B promoted to primary and accepting commits in {took:.2f} s "
                      f"(its first commit is seqno {first})")
        with b.client() as db:
            for i in range(1, ON_B):
                db.set("orders", ("B", i), {"by": "B", "n": i})
        a.start()
        rep = a.call("rollback", fetchresync=f"127.0.0.1:{b.client_port}")
        console.print(f"A is back (pid {a.pid}) and asks B for the common point: rolled back "
                      f"{rep['rolled_back']} transaction(s), seqno {rep['from_seqno']} → {rep['to_seqno']}")
        lost = LostFile.read(rep["lost_file"])
        _show_lost(console, lost)
        a.start_receiver()
        b.start_source(a)
        cluster.wait_caught_up(b, a, timeout=CATCH_UP_TIMEOUT_S)
        console.print(f"A rejoined as B's secondary and caught up at seqno {a.seqno()}")
        lost_ok = [t["seqno"] for t in lost.transactions] == list(range(REPLICATED + 1, REPLICATED + 1 + UNREPLICATED))
    except (TimeoutError, MultisiteError) as e:
        console.print(f"[bold red]failover act stopped: {e}[/]")
        cluster.stop_all()
        return False
    cluster.stop_all()
    same = report(console, Snapshot.of(b), [Snapshot.of(a)])
    console.print("[bold green]A and B hold the same data; A's unreplicated transactions are in its lost file[/]"
                  if same and lost_ok else "[bold red]FAILOVER CHECK FAILED[/]")
    return same and lost_ok


def _show_lost(console: Console, lost: LostFile) -> None:
    h = lost.header
    console.print(f"Unreplicated Transaction Log {lost.path.name}: seqnos {h['from_seqno']}..{h['to_seqno']} of "
                  f"{h['instance']}, common point {h['common_seqno']} ({h['reason']})")
    for t in lost.transactions:
        for u in t["updates"]:
            console.print(f"  seqno {t['seqno']} origin {t['origin']}: {u['op']} {u['region']}{tuple(u['key'])} = "
                          f"{u.get('value')} (before: {u.get('before')})")
