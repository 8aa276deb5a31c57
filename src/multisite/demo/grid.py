"""Act 5 (the grid): eight partitions on three containers, a SIGKILLed container, a refused commit.

A catalog and three containers (A, B, C) run as processes on 127.0.0.1 with a one-second heartbeat
timeout; the grid has 8 partitions, each a primary, one synchronous and one asynchronous replica,
and ``min_sync = 1``: a commit is acknowledged only once the synchronous replica journaled it and
voted to commit. A writer thread puts values through the grid client (``multisite.grid.connect``)
and remembers every acknowledged one; a live table shows the placement (per partition primary,
synchronous and asynchronous replica, epoch) and each replica's backlog from the catalog's status.

Mid-run the container holding the most primaries is SIGKILLed. The catalog notices the silence,
promotes the synchronous replicas of its primaries (new epochs), takes the asynchronous replicas
over as synchronous ones, and the client follows the new routes. The killed container restarts on
its directory and is placed again: its old shards catch up from their primaries' journals. Once the
writer stopped and every backlog is zero, all processes stop and every partition's shards are
compared key by key, and every acknowledged write is checked for its last value.

Then the processes start again and the container holding one partition's only synchronous replica
is stopped. Its primary's link to it ends, so the primary counts no current synchronous replica, and
a commit to that partition is refused at once with ``ReplicationVotedToRollback`` (min_sync 1 cannot
be met) before the catalog even notices the silence. The key is absent on the primary; the stopped
container restarts and is placed again; every process stops, and the key is absent on every shard
of the partition on disk; every process starts once more, the key is still absent, and the partition
takes commits again.

A container stop rather than a SIGSTOP: a frozen replica's vote ends by the catalog's placement
change, and a primary whose partition moves while it waits to report that vote to the catalog holds
up its container's assignments today (``grid.server.container._session`` awaits ``apply``, which
awaits the primary, which awaits a HeartbeatAck that only ``_session`` reads).

Last, the same grid runs on a 3-member etcd with two catalogs, and the leading catalog is SIGKILLed
under the writer, then a container (``grid_etcd.py``).

The live table is ``grid_board.GridBoard``; the writer and what the scenes share are in
``grid_parts.py``; here are the processes and the act's first two scenes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import grid as grid_api
from ..errors import MultisiteError, ReplicationVotedToRollback
from ..net import control
from ..grid.server.container import shard_dir
from ..grid.server.process import catalog_status, start_catalog, start_container, stop_process
from .grid_board import PHASE_TIMEOUT_S, REFRESH_S, ActFailed, GridBoard
from .grid_etcd import scene_etcd
from .grid_parts import (CONTAINERS, GRID, GRID_TOML, HEARTBEAT_TIMEOUT_S, KEYS, MAP, PARTITIONS, RATE_PER_S,
                         GridWriter, caught_up, kill, placed, promoted_without, read_shard, reap)

# The refused-commit scene's catalog: slow to count a stopped container lost, so that the primary's own
# link tells it first (a loaded machine once let a 1 s catalog re-place the partition before that).
REFUSED_HEARTBEAT_TIMEOUT_S = 6.0
KILL_AFTER_S = 3.0  # of writing before the SIGKILL ...
KILL_AFTER = 100  # ... and at least this many acknowledged commits
DOWN_MIN_S = 2.5  # the killed container stays down at least this long, so that the table shows it
AFTER_RESTART_S = 2.0  # of writing once the restarted container caught up ...
AFTER_RESTART = 50  # ... and at least this many commits
REFUSED_KEY = ("refused",)  # the commit the vote refuses


# -- the processes ------------------------------------------------------------------------------------
class GridProcesses:
    """The catalog and the containers, each in its own directory under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.toml = root / "grid.toml"
        self.toml.write_text(GRID_TOML)
        self.catalog = "127.0.0.1:0"
        self.pids: dict[str, int | None] = {}
        self.listen: dict[str, str] = {}  # a container restarts on its port: a restarted catalog knows it by it

    def dir(self, name: str) -> Path:
        return self.root / name

    def start_catalog(self, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S) -> int:
        info = start_catalog(self.dir("catalog"), self.toml, self.catalog, heartbeat_timeout_s)
        self.catalog = info["listen"]  # a restart listens on the same port: the containers know it
        self.pids["catalog"] = info["pid"]
        return info["pid"]

    def start_container(self, name: str) -> int:
        st = start_container(self.dir(name), self.catalog, self.listen.get(name, "127.0.0.1:0"), name=name)
        if not st.get("registered"):
            raise ActFailed(f"container {name} did not register with the catalog {self.catalog}")
        self.listen[name] = json.loads((self.dir(name) / "run" / "container.json").read_text())["listen"]
        self.pids[name] = st["pid"]
        return st["pid"]

    def signal(self, name: str, sig: signal.Signals) -> int:
        pid = self.pids[name]
        assert pid is not None
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            self.pids[name] = None
            reap(pid)
        return pid

    def stop(self, name: str) -> None:
        what = "catalog" if name == "catalog" else "container"
        if self.pids.get(name) is not None and control.is_running(self.dir(name)):
            stop_process(self.dir(name), what)
        self.pids[name] = None

    def stop_all(self) -> None:
        """Catalog first: containers that lose it keep their shards and the catalog's state its placement."""
        for name in ("catalog", *CONTAINERS):
            pid = self.pids.get(name)
            if pid is None:
                continue
            try:
                self.stop(name)
            except (MultisiteError, OSError):
                kill(pid)
                self.pids[name] = None

    def status(self) -> dict | None:
        try:
            return catalog_status(self.catalog, timeout=2.0)
        except MultisiteError:
            return None


# -- the act ----------------------------------------------------------------------------------------------
def act_grid(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 5: the grid: 8 partitions on 3 containers, a SIGKILLed container, a refused commit, "
                 "a SIGKILLed catalog on etcd")
    procs = GridProcesses(root / "grid")
    writer: GridWriter | None = None
    try:
        _start(console, procs)
        writer = GridWriter(procs.catalog)
        with GridBoard(console, procs, writer) as board:
            board.wait_until(lambda st: placed(st, 3), "the placement settling")
            writer.start()
            board.event(f"writer started: single puts at {RATE_PER_S}/s over {KEYS} keys through "
                        f"multisite.grid.connect({procs.catalog!r})")
            victim = _kill_and_restart(board, procs, writer)
            n, t = board.mark
            board.wait_until(lambda _: writer.committed >= n + AFTER_RESTART
                             and time.monotonic() >= t + AFTER_RESTART_S,
                             f"{AFTER_RESTART} more commits after {victim}'s restart")
            writer.stop()
            if writer.error is not None:
                raise ActFailed(f"the writer failed: {writer.error!r}")
            board.event(f"writer stopped: {writer.committed:,} acknowledged, {writer.refusals:,} refused by the "
                        f"vote, {writer.unknowns:,} with an unknown outcome")
            final = board.wait_until(lambda st: placed(st, 3) and caught_up(st), "every backlog reaching 0")
            board.event("[bold green]every replica holds every committed transaction[/]")
        procs.stop_all()
        console.print("catalog and containers stopped cleanly; comparing each partition's shards ...")
        same = _compare(console, procs, final, writer)
        refused = _refused_commit(console, procs)
    except (ActFailed, MultisiteError, OSError) as e:
        console.print(f"[bold red]grid act stopped: {escape(str(e))}[/]")
        return False
    finally:
        if writer is not None:
            writer.stop()
        procs.stop_all()
    etcd = scene_etcd(console, root)
    ok = same and refused and etcd
    console.print("[bold green]grid: every acknowledged write survived the SIGKILL on every shard of its partition, "
                  "the refused commit left no trace, and the grid on etcd lost its leading catalog without a pause[/]"
                  if ok else "[bold red]GRID CHECK FAILED[/]")
    return ok


def _start(console: Console, procs: GridProcesses) -> None:
    pid = procs.start_catalog()
    toml = "; ".join(line for line in GRID_TOML.splitlines() if line)
    console.print(f"{procs.toml.name}: {escape(toml)}")
    console.print(f"catalog: pid {pid}, listening on {procs.catalog}, heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s")
    for name in CONTAINERS:
        pid = procs.start_container(name)
        console.print(f"container {name}: pid {pid}, shards under {procs.dir(name)}")


def _kill_and_restart(board: GridBoard, procs: GridProcesses, writer: GridWriter) -> str:
    started = time.monotonic()
    st = board.wait_until(lambda _: writer.committed >= KILL_AFTER and time.monotonic() >= started + KILL_AFTER_S,
                          f"{KILL_AFTER} acknowledged commits")
    victim = max(st["containers"], key=lambda c: (c["primaries"], c["name"]))["name"]
    held = [p["partition"] for p in st["partitions"] if p["primary"] == victim]
    refusals, unknowns = writer.refusals, writer.unknowns
    pid = procs.signal(victim, signal.SIGKILL)
    killed = time.monotonic()
    board.event(f"[bold red]SIGKILL[/] container {victim} (pid {pid}), primary of "
                f"{', '.join(f'p{i}' for i in held) or 'nothing'}, after {writer.committed:,} acknowledged commits")

    promoted = promoted_without(victim)

    board.wait_until(promoted, f"the catalog promoting replicas of {victim}'s primaries")
    st = board.wait_until(lambda _: all(writer.first_ack_after(i, killed) for i in held),
                          f"commits acknowledged by {victim}'s successors")
    firsts = [writer.first_ack_after(i, killed) or killed for i in held]
    board.event(f"[bold green]the new primaries take commits[/]: the first acknowledged "
                f"{max(firsts) - killed:.1f} s after the SIGKILL ({HEARTBEAT_TIMEOUT_S:g} s of it the catalog's "
                f"heartbeat timeout): "
                + ", ".join(f"p{p['partition']} on {p['primary']} epoch {p['epoch']}" for p in st["partitions"]
                            if p["partition"] in held))
    if writer.unknowns > unknowns:
        board.event(f"{writer.unknowns - unknowns} commit(s) in flight to {victim} lost their answer: "
                    f"CommitOutcomeUnknown, not retried ({escape(writer.first_unknown)})")
    if writer.refusals > refusals:
        board.event(f"{writer.refusals - refusals} commit(s) refused meanwhile, nothing committed: partitions whose "
                    f"only synchronous replica was on {victim} until the catalog made another one "
                    f"({escape(writer.first_refusal)})")
    board.wait_until(lambda _: time.monotonic() - killed >= DOWN_MIN_S, f"{victim} staying down a moment")
    pid = procs.start_container(victim)
    restarted = time.monotonic()
    board.event(f"container {victim} restarted on its directory (pid {pid}): the catalog places replicas on it again")
    st = board.wait_until(lambda s: placed(s, 3), f"{victim}'s shards placed again")
    mine = [p["partition"] for p in st["partitions"] if victim in (p["primary"], *p["sync"], *p["async"])]
    target = {p["partition"]: p["seqnos"].get(p["primary"], 0) for p in st["partitions"]}
    st = board.wait_until(lambda s: all(s["partitions"][i]["seqnos"].get(victim, -1) >= target[i] for i in mine),
                          f"{victim}'s replicas catching up")
    roles = [f"p{i} {'sync' if victim in st['partitions'][i]['sync'] else 'async'}" for i in mine]
    board.event(f"[bold green]{victim}'s replicas caught up[/] from their primaries' journals "
                f"{time.monotonic() - restarted:.1f} s after its restart: {', '.join(roles)}")
    board.mark = (writer.committed, time.monotonic())
    return victim


# -- the key-by-key comparison ------------------------------------------------------------------------------
def _compare(console: Console, procs: GridProcesses, st: dict, writer: GridWriter) -> bool:
    table = Table(title="each partition's shards compared key by key with its primary", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for col in ("partition", "shard", "seqno", "keys", "missing", "extra", "changed", "acked wrong", "refused there",
                ""):
        table.add_column(col, justify="left" if col in ("partition", "shard", "") else "right", no_wrap=True)
    ok = True
    total = 0
    for p in st["partitions"]:
        i = p["partition"]
        shards = [("primary", p["primary"]), *(("sync", c) for c in p["sync"]), *(("async", c) for c in p["async"])]
        ref = None
        for role, c in shards:
            seqno, data = read_shard(shard_dir(procs.dir(c), GRID, i))
            if ref is None:
                ref = data
                total += len(data)
            missing = sum(1 for k in ref if k not in data)
            extra = sum(1 for k in data if k not in ref)
            changed = sum(1 for k, v in data.items() if k in ref and ref[k] != v)
            wrong, present, strange = writer.check(i, data)
            good = not (missing or extra or changed or wrong or present or strange)
            ok &= good
            table.add_row(f"p{i}" if role == "primary" else "", f"{c} {role}", f"{seqno:,}", f"{len(data):,}",
                          str(missing), str(extra), str(changed), str(wrong + strange), str(present),
                          "[bold green]OK[/]" if good else "[bold red]FAILED[/]")
    console.print(table)
    console.print(f"{len(writer.acked):,} keys with an acknowledged last value, {total:,} keys over "
                  f"{PARTITIONS} partitions; {writer.refusals:,} refused and {writer.unknowns:,} unknown-outcome "
                  f"commits accounted for: " + ("[green]OK[/]" if ok else "[bold red]FAILED[/]"))
    return ok


# -- the refused commit -----------------------------------------------------------------------------------
def _refused_commit(console: Console, procs: GridProcesses) -> bool:
    console.print(f"[bold]A commit the vote refuses[/]: the catalog (heartbeat timeout "
                  f"{REFUSED_HEARTBEAT_TIMEOUT_S:g} s, so that the primary sees its replica go before the catalog "
                  f"places another) and the containers start again on their directories")
    _restart_all(procs, REFUSED_HEARTBEAT_TIMEOUT_S)
    with GridBoard(console, procs, None) as board:
        st = board.wait_until(lambda s: placed(s, 3) and caught_up(s), "the restarted grid settling")
        with grid_api.connect(procs.catalog, timeout_s=PHASE_TIMEOUT_S) as g:
            p = g.partition_of(REFUSED_KEY)
            part = st["partitions"][p]
            primary, (sync,) = part["primary"], part["sync"]
            procs.stop(sync)
            board.event(f"[bold red]container stop[/] {sync}, which holds p{p}'s only synchronous replica "
                        f"(primary {primary}, epoch {part['epoch']}, seqno {part['seqnos'][primary]:,})")
            board.wait_until(lambda _: _current_on_primary(procs, primary, p) == [],
                             f"{primary} noticing that p{p}'s synchronous replica is gone", timeout_s=5.0)
            board.event(f"{primary}, p{p}'s primary, counts no current synchronous replica (its link to {sync} "
                        f"ended); the catalog has not noticed {sync}'s silence yet")
            t0 = time.monotonic()
            try:
                seqno = g.put(MAP, REFUSED_KEY, {"n": -1})
            except ReplicationVotedToRollback as e:
                refused: ReplicationVotedToRollback | None = e
                board.event(f"put {REFUSED_KEY!r} to p{p}: [bold]ReplicationVotedToRollback[/] in "
                            f"{(time.monotonic() - t0) * 1000:.0f} ms: {escape(str(e))}")
            else:
                refused = None
                board.event(f"[bold red]put {REFUSED_KEY!r} to p{p} was acknowledged (seqno {seqno}) without a "
                            f"synchronous replica[/]")
            absent = g.get(MAP, REFUSED_KEY) is None
            board.event(f"get {REFUSED_KEY!r} from p{p}'s primary: "
                        + ("absent [green]OK[/]" if absent else "[bold red]PRESENT[/]"))
            board.wait_until(lambda s: not _up(s, sync) and placed(s, 2), f"the catalog placing p{p} without {sync}")
            pid = procs.start_container(sync)
            board.event(f"container {sync} restarted on its directory (pid {pid})")
            board.wait_until(lambda s: placed(s, 3) and caught_up(s), f"{sync} placed again and caught up")
    procs.stop_all()
    console.print(f"all processes stopped; the shard directories of p{p} on disk:")
    nowhere = _absent_on_disk(console, procs, p)
    console.print("every process started once more:")
    _restart_all(procs)
    _wait(procs, lambda s: placed(s, 3) and caught_up(s), "the restarted grid settling")
    with grid_api.connect(procs.catalog, timeout_s=PHASE_TIMEOUT_S) as g:
        after = g.get(MAP, REFUSED_KEY) is None
        key = next((f"after{i}",) for i in range(1000) if g.partition_of((f"after{i}",)) == p)
        seqno = g.put(MAP, key, {"n": 0})
    console.print(f"get {REFUSED_KEY!r}: " + ("absent [green]OK[/]" if after else "[bold red]PRESENT[/]")
                  + f"; p{p} takes commits again (put {key!r}: seqno {seqno})")
    procs.stop_all()
    ok = refused is not None and absent and nowhere and after
    console.print("[bold green]the refused commit is visible nowhere[/]" if ok
                  else "[bold red]REFUSED-COMMIT CHECK FAILED[/]")
    return ok


def _wait(procs: GridProcesses, done: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        st = procs.status()
        if st is not None and done(st):
            return st
        if time.monotonic() > deadline:
            raise ActFailed(f"{what}: not done within {PHASE_TIMEOUT_S:.0f} s")
        time.sleep(REFRESH_S)


def _restart_all(procs: GridProcesses, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S) -> None:
    """The containers first, together (each waits for the catalog, retrying), then the catalog: a
    restarted catalog gives the containers it knew one heartbeat timeout to come back before it counts
    them lost, and all three are there by then."""
    with ThreadPoolExecutor(len(CONTAINERS)) as ex:
        started = [ex.submit(procs.start_container, name) for name in CONTAINERS]
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not all(control.is_running(procs.dir(n)) for n in CONTAINERS) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs.start_catalog(heartbeat_timeout_s)
        for f in started:
            f.result()


def _up(st: dict, name: str) -> bool:
    return any(c["name"] == name and c["up"] for c in st["containers"])


def _current_on_primary(procs: GridProcesses, container: str, p: int) -> list[str] | None:
    """The synchronous replicas ``container``'s primary of ``p`` counts current, as it says itself."""
    try:
        shard = control.call(procs.dir(container), "status", timeout=2)["shards"].get(str(p), {})
    except MultisiteError:
        return None
    return shard.get("sync", {}).get("current")


def _absent_on_disk(console: Console, procs: GridProcesses, p: int) -> bool:
    ok = True
    for c in CONTAINERS:
        d = shard_dir(procs.dir(c), GRID, p)
        if not d.exists():
            continue
        seqno, data = read_shard(d)
        there = REFUSED_KEY in data
        ok &= not there
        console.print(f"  {c}/{d.name}: seqno {seqno:,}, {len(data):,} keys, {REFUSED_KEY!r} "
                      + ("[bold red]PRESENT[/]" if there else "absent [green]OK[/]"))
    return ok
