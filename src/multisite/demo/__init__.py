"""The main job (``multisite demo``): scenarios that show the system working end to end.

One act per module; each is a function ``act_…(console, root) -> bool`` that creates its instances
under ``root``, tells its story on ``console`` and returns whether its checks passed. ``run`` plays
them in order, every act even after a failure, and passes only if all of them do.

- Act 1, ``crash_recovery``: journaled commits, a SIGKILLed writer, recovery.
- Act 2, ``log_shipping``: a primary and two secondaries (one cascading) as server processes, a live
  workload, a secondary SIGKILLed mid-run that catches up from journal files, a key-by-key check.
- Act 3, ``failover``: the primary dies, its secondary is promoted, the old primary rolls back its
  unreplicated transactions into a lost-transaction file and rejoins as a secondary.
- Act 4, ``rolling_upgrade``: a value-shape change carried across a switchover by filters: B's
  receiver upgrades A's old shapes on the way in; after the switchover A, still on the old
  version, catches up through B's source's out-filter that turns new shapes back into old ones.
- Act 5, ``grid``: a catalog and three containers as processes, 8 partitions with ``min_sync = 1``, a
  writer through the grid client with a live table of placement and backlog, a container SIGKILLed
  mid-run (promotion, new epochs, the container placed again), every partition's shards compared key
  by key; then a commit refused with ``ReplicationVotedToRollback`` with the only synchronous replica
  stopped, visible nowhere, also after every process restarts; last, the same grid on a 3-member
  etcd with two catalogs: the leading catalog SIGKILLed under the writer (the other one takes over,
  the writer goes on), then a container (``grid_etcd``).
- Act 6, ``delivery``: guaranteed message delivery: a consolidated instance and three remote sites
  exchange changes both ways through the file transport, one remote's messages delayed, duplicated
  and reordered, another offline for a while; every site ends with exactly its subscribed rows.
- Act 7, ``multimaster``: two document servers write to replicas of one database and reconcile: new
  documents both ways, a field merge, a conflict document, a deletion, a scheduled connection.
- Act 9, ``ha``: automatic failover through etcd: three members under HA managers, the primary's
  host lost under a writer (detection, election, promotion, the writer going on), the old primary
  rejoining by rollback, a switchover back; every acknowledged commit checked.
- Act 8, ``pipeline``: act 2's A and B verified key by key, A exported through Spark to Parquet, a
  rollback on A retracted from the export, a small table of the analytics replica (skipped, saying
  so, only without Java).

The helpers the acts share (a workload thread, the live status board, the comparison of instances)
live beside them in ``workload``, ``board`` and ``compare``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from .crash_recovery import act_crash_recovery
from .delivery import act_delivery
from .failover import act_failover
from .grid import act_grid
from .ha import act_ha
from .log_shipping import act_log_shipping
from .multimaster import act_multimaster
from .pipeline import act_pipeline
from .rolling_upgrade import act_rolling_upgrade

Act = Callable[[Console, Path], bool]
ACTS: tuple[Act, ...] = (act_crash_recovery, act_log_shipping, act_failover, act_rolling_upgrade, act_grid,
                         act_delivery, act_multimaster, act_pipeline, act_ha)

__all__ = ["ACTS", "act_crash_recovery", "act_delivery", "act_failover", "act_grid", "act_ha", "act_log_shipping",
           "act_multimaster", "act_pipeline", "act_rolling_upgrade", "run"]


def run(console: Console | None = None, workdir: str | None = None) -> bool:
    console = console or Console()
    root = Path(workdir or tempfile.mkdtemp(prefix="multisite-demo-"))
    console.print(f"demo instances in {root}")
    t0 = time.perf_counter()
    results = []
    for act in ACTS:
        t = time.perf_counter()
        ok = act(console, root)
        results.append(ok)
        console.print(f"{act.__name__}: {'OK' if ok else 'FAILED'} in {time.perf_counter() - t:.1f} s")
    ok = all(results)
    console.print(f"demo finished in {time.perf_counter() - t0:.1f} s: {'OK' if ok else 'FAILED'}")
    return ok
