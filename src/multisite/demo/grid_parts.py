"""What act 5's scenes share: the grid they run (``GRID_TOML``), the writer thread that puts through
the grid client and remembers what it was told, what "settled" means on a status, and reading a
shard from its directory. The single catalog's scenes are in ``grid.py``, the scene on etcd in
``grid_etcd.py``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from .. import grid as grid_api
from ..engine import open as open_db
from ..errors import CommitOutcomeUnknown, ReplicationVotedToRollback
from ..grid.routing import partition_of
from .grid_board import PHASE_TIMEOUT_S

GRID = "demo"
MAP = "m"
PARTITIONS = 8
GRID_TOML = f"""name = "{GRID}"
partitions = {PARTITIONS}
min_sync = 1
max_sync = 1
max_async = 1

[maps.{MAP}]
"""
CONTAINERS = ("A", "B", "C")
HEARTBEAT_TIMEOUT_S = 1.0
KEYS = 400  # first subscripts the writer spreads over the partitions
RATE_PER_S = 150  # offered by the writer: a steady story on a fast or a slow machine


def reap(pid: int) -> None:
    """Collect a killed child (the processes are ours: no zombie left for the rest of the demo)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


# -- the application ----------------------------------------------------------------------------------
class GridWriter:
    """Puts ``{"n": n}`` under ``(f"k{i}",)`` at a steady rate through the grid client, from a thread.

    It remembers the last acknowledged value of each key, and apart from them the values whose commit
    was refused by the vote (they must be nowhere) and those whose answer was lost (they may or may not
    be there, until a later acknowledged write of the same key)."""

    def __init__(self, catalog: str, *, seed: int = 5) -> None:
        self.catalog = catalog
        self.rng = random.Random(seed)
        self.acked: dict[tuple, dict] = {}
        self.unknown: dict[tuple, list[dict]] = {}  # values that may be there, since the last acked one
        self.refused: list[tuple[tuple, dict]] = []
        self.committed = self.refusals = self.unknowns = 0
        self.acked_at: dict[int, list[float]] = {}  # partition -> monotonic times of its acknowledged commits
        self.first_refusal = self.first_unknown = ""
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-grid-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 35.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            with grid_api.connect(self.catalog, timeout_s=PHASE_TIMEOUT_S) as g:
                t0 = time.monotonic()
                n = 0
                while not self._stop.wait(max(0.0, t0 + n / RATE_PER_S - time.monotonic())):
                    n += 1
                    key, value = (f"k{self.rng.randrange(KEYS)}",), {"n": n}
                    try:
                        g.put(MAP, key, value)
                    except ReplicationVotedToRollback as e:
                        self.refused.append((key, value))
                        self.refusals += 1
                        self.first_refusal = self.first_refusal or str(e)
                    except CommitOutcomeUnknown as e:
                        self.unknown.setdefault(key, []).append(value)
                        self.unknowns += 1
                        self.first_unknown = self.first_unknown or str(e)
                    else:
                        self.acked_at.setdefault(g.partition_of(key), []).append(time.monotonic())
                        self.acked[key] = value
                        self.unknown.pop(key, None)
                        self.committed += 1
        except BaseException as e:  # reported by the act, which owns the console
            self.error = e

    def first_ack_after(self, partition: int, t: float) -> float | None:
        return next((a for a in self.acked_at.get(partition, ()) if a > t), None)

    def check(self, partition: int, data: dict[tuple, Any]) -> tuple[int, int, int]:
        """Against one shard of ``partition``: (acknowledged last values missing or replaced, refused
        values present, values nobody wrote or that belong elsewhere)."""
        mine = {k: v for k, v in self.acked.items() if partition_of(k, PARTITIONS) == partition}
        wrong = sum(1 for k, v in mine.items() if data.get(k) != v and data.get(k) not in self.unknown.get(k, ()))
        refused = {v["n"] for _, v in self.refused}
        present = sum(1 for v in data.values() if isinstance(v, dict) and v.get("n") in refused)
        allowed = {k: [v, *self.unknown.get(k, ())] for k, v in mine.items()}
        for k, vs in self.unknown.items():
            if partition_of(k, PARTITIONS) == partition:
                allowed.setdefault(k, list(vs))
        strange = sum(1 for k, v in data.items() if v not in allowed.get(k, ())
                      and not (isinstance(v, dict) and v.get("n") in refused))
        return wrong, present, strange


# -- what "settled" means -------------------------------------------------------------------------------
def kill(pid: int) -> None:
    """SIGKILL ``pid`` and reap it; a process already gone is left at that."""
    try:
        os.kill(pid, signal.SIGKILL)
        reap(pid)
    except OSError:
        pass


def placed(st: dict, n_up: int) -> bool:
    """Every partition has a primary up, its synchronous replica current and, with three containers
    up, an asynchronous replica; every container up applied the placement."""
    up = {c["name"] for c in st["containers"] if c["up"]}
    if len(up) != n_up or any(c["applied_version"] != st["version"] for c in st["containers"] if c["up"]):
        return False
    for p in st["partitions"]:
        if p["primary"] not in up or not p["sync"] or set(p["sync"]) != set(p["current"]):
            return False
        if n_up >= 3 and not p["async"]:
            return False
    return True


def promoted_without(victim: str):
    """A status test: ``victim`` is down and every partition has a live primary with its synchronous
    replicas current (the replicas of the victim's primaries promoted in their place)."""
    def promoted(s: dict) -> bool:
        up = {c["name"] for c in s["containers"] if c["up"]}
        return victim not in up and all(p["primary"] in up and set(p["current"]) == set(p["sync"]) != set()
                                        for p in s["partitions"])
    return promoted


def caught_up(st: dict) -> bool:
    """Every shard at its primary's seqno."""
    for p in st["partitions"]:
        s = p["seqnos"]
        shards = [p["primary"], *p["sync"], *p["async"]]
        if any(c not in s for c in shards) or len({s[c] for c in shards}) != 1:
            return False
    return True


def read_shard(path: Path) -> tuple[int, dict[tuple, Any]]:
    db = open_db(path)
    try:
        return db.seqno, (dict(db.items(MAP)) if MAP in db.regions() else {})
    finally:
        db.close()
