"""Act 9 (automatic failover): three members under HA managers on a real 3-member etcd.

A writer commits through a client naming all three members. The primary's host is lost (its server
and its manager SIGKILLed): the board shows the leader key going (detection), another member taking
it (election), becoming primary (promotion) and the writer going on. The old primary comes back,
rolls back what only it had into its lost-transaction file and follows; a switchover hands the
primary role back to it with nothing lost. Every acknowledged commit is checked, and the members
compared.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from rich.console import Console

from ..errors import MultisiteError
from ..ha.coordinator import Coordinator
from ..journal.lostfile import list_lost_files
from ..testing.etcd import EtcdCluster
from ..testing.ha import HACluster

PHASE_TIMEOUT_S = 15.0


def act_ha(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 9: automatic failover through etcd (3 etcd members, 3 instances under HA managers)")
    if shutil.which("etcd") is None:
        console.print("[yellow]etcd is not installed (make setup installs it): act skipped[/]")
        return True
    base = root / "ha"
    with EtcdCluster(base) as etcd:
        c = HACluster(base, etcd.endpoints, ["A", "B", "C"], ttl_s=1.0, cluster="demo")
        try:
            c.start()
            return _story(console, c, Coordinator("demo", etcd.endpoints, "(demo)", 1.0))
        except (MultisiteError, AssertionError) as e:
            console.print(f"[bold red]HA act stopped: {e}[/]")
            return False
        finally:
            c.stop()


def _story(console: Console, c: HACluster, coord: Coordinator) -> bool:
    first = c.wait_primary()
    c.wait_followers()
    console.print(f"{first} holds the leader key and is primary; the others follow it. etcd: {c.etcd}")
    w = c.writer()
    time.sleep(1.0)
    _board(console, c, w, "before")
    t0 = time.monotonic()
    c.lose_host(first)
    console.print(f"[red]SIGKILL[/] {first}'s server and HA manager (its host is lost) at +0.00 s")
    gone = _until(lambda: (v := asyncio.run(coord.view())).reachable and v.leader is None, t0)
    console.print(f"  +{gone:.2f} s detection: {first}'s lease ended, the leader key is gone")
    taken = _until(lambda: (v := asyncio.run(coord.view())).leader is not None and v.leader.name != first, t0)
    new = asyncio.run(coord.view()).leader.name
    console.print(f"  +{taken:.2f} s election: {new} (the most advanced) took the key")
    promoted = _until(lambda: new in c.primaries(), t0)
    console.print(f"  +{promoted:.2f} s promotion: {new} is primary and streams to the others")
    committed = w.wait_commit_after(t0, PHASE_TIMEOUT_S, on=c.address(new)) - t0
    console.print(f"  +{committed:.2f} s the writer's first commit on {new}")
    time.sleep(1.0)
    _board(console, c, w, "after failover")
    c.restart_host(first)
    c.wait_followers()
    lost = list_lost_files(c.root(first) / "lost")
    console.print(f"{first} came back and rejoined as a secondary: "
                  + (f"its unreplicated transactions are in {lost[-1].name}" if lost else "it had nothing unreplicated"))
    if c.wait_primary() == first or not _switchover(c, first):
        # its leader's lease lapsed (a loaded machine) and it took the key back, before or during the ask
        console.print(f"{first} took the leader key back by itself (the leader's lease lapsed): no switchover needed")
    else:
        c.wait_primary()
        console.print(f"switchover back to {first}: done, {first} is primary, nothing went to a lost file")
    c.wait_followers()
    time.sleep(0.5)
    w.stop()
    _board(console, c, w, "end")
    c.wait_identical()
    c.check_acknowledged(w)
    console.print(f"[bold green]{len(w.acked)} commits acknowledged, each on the primary or in a lost file; "
                  f"{len(w.unknown)} outcome(s) unknown at the failover; members identical[/]")
    return True


def _until(probe, t0: float) -> float:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError("a failover phase did not happen in time")
        time.sleep(0.01)
    return time.monotonic() - t0


def _board(console: Console, c: HACluster, w, when: str) -> None:
    rows = []
    for n in c.names:
        st = c.status(n)
        rows.append(f"{n}: {'down' if st is None else st['role']} seqno {st['seqno'] if st else '-'}")
    console.print(f"[dim]{when}:[/] " + " | ".join(rows) + f" | writer: {len(w.acked)} acknowledged")


def _switchover(c: HACluster, to: str, timeout_s: float = 15.0) -> bool:
    """``ha switchover --to``, asked again while the cluster answers that a failover is under way (a
    leader's lease that lapsed on a loaded machine: no leader for a moment), as a user would. False when
    ``to`` had become the primary by itself before the ask (the same lapse, the other way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            c.cli("ha", "switchover", "--cluster", c.cluster, "--etcd", c.etcd, "--to", to)
            return True
        except MultisiteError as e:
            if "it is the primary already" in e.message:
                return False
            if "try again" not in e.message or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
