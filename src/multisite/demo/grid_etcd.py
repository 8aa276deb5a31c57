"""Act 5's last scene: the grid without a single point of failure (issue 24).

A throwaway 3-member etcd (``testing.etcd.EtcdCluster``) and on it two catalogs (``--etcd``, one
leads through its lease in etcd) and the three containers, each holding its own lease. The writer
of the act's first scene puts through a client given both catalogs' addresses. Mid-run the leading
catalog is SIGKILLed: nothing on the commit path asks a catalog (a primary takes commits while its
container's own lease holds), so the writer goes on, and once the dead catalog's lease ends the
other one takes the leader key; the board's status, answered by the survivor, names it. Then the
container with the most primaries is SIGKILLed, as in the first scene: its lease ends, the new
leader promotes the synchronous replicas, and the writer's commits go to them. Once the writer
stopped and every backlog is zero, the processes stop and every partition's shards are compared
with each other and with what the writer was told.

The scene is short (about 15 s): no restart of the killed container, and a one-line comparison.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..errors import MultisiteError
from ..grid.server.container import shard_dir
from ..grid.server.process import catalog_status, start_catalog, start_container, stop_process
from ..net import control
from ..testing.etcd import EtcdCluster
from .grid_parts import (CONTAINERS, GRID, GRID_TOML, HEARTBEAT_TIMEOUT_S, PARTITIONS, GridWriter, caught_up, placed,
                         kill, promoted_without, read_shard, reap)
from .grid_board import ActFailed, GridBoard

CATALOGS = ("k1", "k2")
LEASE_TTL_S = 1.0  # of every catalog's and container's lease in etcd
BEFORE_KILL_S = 1.5  # of writing before the leading catalog's SIGKILL ...
BEFORE_KILL = 50  # ... and at least this many acknowledged commits
BETWEEN_KILLS_S = 1.0  # of writing once the other catalog leads, before the container's SIGKILL
AFTER_S = 1.0  # of writing once the lost primaries' successors take commits
EVENTS = ("lost: its lease", "leads grid", "no longer leads")  # the catalogs' log lines shown as events


class EtcdGridProcesses:
    """The catalogs and containers of the scene, coordinated through ``etcd``, each in a directory."""

    def __init__(self, root: Path, etcd: str) -> None:
        self.root, self.etcd = root, etcd
        root.mkdir(parents=True, exist_ok=True)
        self.toml = root / "grid.toml"  # the first placement waits for the three containers
        self.toml.write_text(GRID_TOML.replace("\n[maps.", f"initial_containers = {len(CONTAINERS)}\n\n[maps.", 1))
        self.addresses: dict[str, str] = {}
        self.pids: dict[str, int | None] = {}

    @property
    def catalog(self) -> str:
        """Every catalog's address, as the client and ``grid status`` take them."""
        return ",".join(self.addresses.values())

    def dir(self, name: str) -> Path:
        return self.root / name

    def logs(self) -> dict[str, Path]:
        return {k: self.dir(k) / "log" / "catalog.log" for k in CATALOGS}

    def start_catalog(self, name: str) -> dict:
        info = start_catalog(self.dir(name), self.toml, "127.0.0.1:0", HEARTBEAT_TIMEOUT_S, etcd=self.etcd, name=name,
                             lease_ttl_s=LEASE_TTL_S)
        self.addresses[name], self.pids[name] = info["listen"], info["pid"]
        return info

    def start_container(self, name: str) -> int:
        st = start_container(self.dir(name), None, "127.0.0.1:0", name=name, grid=GRID, etcd=self.etcd,
                             lease_ttl_s=LEASE_TTL_S)
        if not st.get("registered"):
            raise ActFailed(f"container {name} did not register in etcd")
        self.pids[name] = st["pid"]
        return st["pid"]

    def kill(self, name: str) -> int:
        pid = self.pids[name]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        reap(pid)
        self.pids[name] = None
        return pid

    def status(self) -> dict | None:
        try:
            return catalog_status(self.catalog, timeout=2.0)
        except MultisiteError:
            return None

    def stop_all(self) -> None:
        """The containers together (each gives its lease up), then the catalogs together."""
        for names in (CONTAINERS, CATALOGS):
            with ThreadPoolExecutor(len(names)) as ex:
                list(ex.map(self.stop, names))

    def stop(self, name: str) -> None:
        """A planned stop, or a SIGKILL if it does not answer."""
        pid = self.pids.get(name)
        if pid is None:
            return
        try:
            if control.is_running(self.dir(name)):
                stop_process(self.dir(name), "catalog" if name in CATALOGS else "container")
        except (MultisiteError, OSError):
            kill(pid)
        self.pids[name] = None


def scene_etcd(console: Console, root: Path) -> bool:
    """The scene (see the module docstring); whether its checks passed (True, saying so, without etcd)."""
    console.print("[bold]No single point of failure[/]: the same grid on a 3-member etcd with 2 catalogs; the "
                  "leading catalog SIGKILLed under the writer, then a container")
    if shutil.which("etcd") is None:
        console.print("[yellow]etcd is not installed (make setup installs it): scene skipped[/]")
        return True
    t0 = time.monotonic()
    with EtcdCluster(root / "grid-etcd") as etcd:
        procs = EtcdGridProcesses(root / "grid-etcd", etcd.endpoints)
        writer: GridWriter | None = None
        try:
            _start(console, procs, etcd)
            writer = GridWriter(procs.catalog, seed=7)
            with GridBoard(console, procs, writer, logs=procs.logs(), patterns=EVENTS) as board:
                final = _story(board, procs, writer)
            procs.stop_all()
            ok = _compare(console, procs, final, writer)
        except (ActFailed, MultisiteError, OSError) as e:
            console.print(f"[bold red]etcd scene stopped: {escape(str(e))}[/]")
            return False
        finally:
            if writer is not None:
                writer.stop()
            procs.stop_all()
    console.print(f"etcd scene in {time.monotonic() - t0:.1f} s: " + (
        "[bold green]the leading catalog's SIGKILL cost no commit, the follower took over, and every acknowledged "
        "write survived the container's SIGKILL[/]" if ok else "[bold red]ETCD SCENE CHECK FAILED[/]"))
    return ok


def _start(console: Console, procs: EtcdGridProcesses, etcd: EtcdCluster) -> None:
    """Every process at once: containers on etcd need no catalog to register, and the first placement
    waits for all three."""
    console.print(f"etcd: 3 members at {etcd.endpoints}")
    with ThreadPoolExecutor(len(CATALOGS) + len(CONTAINERS)) as ex:
        cats = list(ex.map(procs.start_catalog, CATALOGS))
        pids = dict(zip(CONTAINERS, ex.map(procs.start_container, CONTAINERS)))
    for name, info in zip(CATALOGS, cats):
        console.print(f"catalog {name}: pid {info['pid']}, listening on {info['listen']}, --etcd, lease "
                      f"{LEASE_TTL_S:g} s")
    console.print("containers " + ", ".join(f"{n} (pid {p})" for n, p in pids.items()) + ": registered in etcd, "
                  "each under its own lease")


def _story(board: GridBoard, procs: EtcdGridProcesses, writer: GridWriter) -> dict:
    board.wait_until(lambda s: placed(s, 3) and (s.get("coordination") or {}).get("leader"),
                     "the placement settling under a leading catalog")
    writer.start()
    board.event(f"writer started: puts at the same rate through multisite.grid.connect({procs.catalog!r})")
    _kill_leader(board, procs, writer)
    board.mark = (writer.committed, time.monotonic())
    board.wait_until(lambda _: time.monotonic() >= board.mark[1] + BETWEEN_KILLS_S, "the writer going on")
    _kill_container(board, procs, writer)
    writer.stop()
    if writer.error is not None:
        raise ActFailed(f"the writer failed: {writer.error!r}")
    board.event(f"writer stopped: {writer.committed:,} acknowledged, {writer.refusals:,} refused by the vote, "
                f"{writer.unknowns:,} with an unknown outcome")
    return board.wait_until(lambda s: placed(s, 2) and caught_up(s), "every backlog reaching 0")


def _kill_leader(board: GridBoard, procs: EtcdGridProcesses, writer: GridWriter) -> None:
    started = time.monotonic()
    st = board.wait_until(lambda _: writer.committed >= BEFORE_KILL and time.monotonic() >= started + BEFORE_KILL_S,
                          f"{BEFORE_KILL} acknowledged commits")
    lead = st["coordination"]["leader"]
    pid = procs.kill(lead)
    killed = time.monotonic()
    board.event(f"[bold red]SIGKILL[/] catalog {lead} (pid {pid}), the leader, after {writer.committed:,} acknowledged commits")
    st = board.wait_until(lambda s: s["coordination"]["leader"] not in (None, lead),
                          "the other catalog taking the leader key")
    took = time.monotonic() - killed
    board.wait_until(lambda _: all(writer.first_ack_after(i, killed) for i in range(PARTITIONS)),
                     "a commit on every partition after the kill")
    acks = sorted(t for ts in writer.acked_at.values() for t in ts if killed <= t <= killed + took)
    parts = sum(1 for ts in writer.acked_at.values() if any(killed <= t <= killed + took for t in ts))
    gap = max((b - a for a, b in zip([killed, *acks], [*acks, killed + took])), default=took)
    co = st["coordination"]
    board.event(f"[bold green]catalog {co['leader']} leads[/] {took:.1f} s after the SIGKILL (its status: leader "
                f"{co['leader']}, answered by {co['this']}); the writer went on meanwhile: "
                f"{len(acks):,} commits acknowledged on {parts} of {PARTITIONS} partitions, none more than "
                f"{gap * 1000:.0f} ms apart")


def _kill_container(board: GridBoard, procs: EtcdGridProcesses, writer: GridWriter) -> None:
    st = board.status or {}
    victim = max(st["containers"], key=lambda c: (c["primaries"], c["name"]))["name"]
    held = [p["partition"] for p in st["partitions"] if p["primary"] == victim]
    refusals, unknowns = writer.refusals, writer.unknowns
    pid = procs.kill(victim)
    killed = time.monotonic()
    board.event(f"[bold red]SIGKILL[/] container {victim} (pid {pid}), primary of "
                f"{', '.join(f'p{i}' for i in held) or 'nothing'}")

    promoted = promoted_without(victim)

    board.wait_until(promoted, f"{(st.get('coordination') or {}).get('leader')} promoting replicas of {victim}'s "
                               f"primaries once its lease ends")
    st = board.wait_until(lambda _: all(writer.first_ack_after(i, killed) for i in held),
                          f"commits acknowledged by {victim}'s successors")
    first = max((writer.first_ack_after(i, killed) or killed for i in held), default=killed)
    board.event(f"[bold green]the new primaries take commits[/] {first - killed:.1f} s after the SIGKILL (its lease "
                f"of {LEASE_TTL_S:g} s most of it): " + ", ".join(
                    f"p{p['partition']} on {p['primary']} epoch {p['epoch']}" for p in st["partitions"]
                    if p["partition"] in held))
    if writer.unknowns > unknowns or writer.refusals > refusals:
        board.event(f"meanwhile: {writer.unknowns - unknowns} commit(s) in flight to {victim} without an answer "
                    f"(CommitOutcomeUnknown), {writer.refusals - refusals} refused by the vote (their only "
                    f"synchronous replica was on {victim}); none of them acknowledged")
    t = time.monotonic()
    board.wait_until(lambda _: time.monotonic() >= t + AFTER_S, "the writer going on")


def _compare(console: Console, procs: EtcdGridProcesses, st: dict, writer: GridWriter) -> bool:
    """Every shard of every partition against its primary's and against what the writer was told, in
    one line."""
    shards = bad = keys = 0
    for p in st["partitions"]:
        ref = None
        for c in [p["primary"], *p["sync"], *p["async"]]:
            _, data = read_shard(shard_dir(procs.dir(c), GRID, p["partition"]))
            ref = data if ref is None else ref
            keys += len(data) if data is ref else 0
            shards += 1
            bad += data != ref or any(writer.check(p["partition"], data))
    console.print(f"{shards} shards of {PARTITIONS} partitions compared key by key ({keys:,} keys, "
                  f"{len(writer.acked):,} with an acknowledged last value; {writer.unknowns} unknown-outcome commits "
                  f"accounted for): " + ("[green]identical, OK[/]" if not bad else f"[bold red]{bad} FAILED[/]"))
    return not bad

