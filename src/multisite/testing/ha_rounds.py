"""Seeded fault rounds on an HA cluster under a writer, with the checks after each (issue 25).

    totals = Totals()
    for seed in seeds:                          # rounds of one --min-confirm setting share a cluster
        run_round(cluster, etcd, plan(seed), totals)
    print(totals.summary())

A round's seed decides everything the round does: whether the cluster runs with ``--min-confirm 1``
(odd seeds) or without (even seeds), one fault at the primary (its host SIGKILLed, its processes
SIGSTOPped until another member is primary and has taken a commit, a switchover to a secondary, or none) and one elsewhere (an etcd member
SIGKILLed, a secondary's host SIGKILLed, or none; at least one of the two), which member or etcd
member it hits, and the pauses between the steps. Targets are named by role (the primary, the n-th
secondary in name order) and each round starts from a healthy cluster (one primary, every other member
streaming from it, all identical), so a round replays on a fresh cluster from its seed alone. (The
secondary a round picks is picked at its start: after a switchover to it, losing "a secondary" loses
the new primary, right after its promotion.)

Each round: a writer (a multi-host client) commits keys tagged with the seed; the faults strike; the
writer goes on until a primary acknowledges a commit after them; then everything is healed (hosts and
etcd members restarted, paused processes resumed) and the writer stops. Checked, once the members are
identical again:

- with ``--min-confirm 1``: every acknowledged commit of the round is on the final primary;
- without: every acknowledged commit is on the final primary or in a lost-transaction file (none
  silently lost), and a commit the writer saw refused is nowhere;
- never two primaries at once (``ha_checks.check_one_primary_at_a_time``, from the journals and lost
  files of every member);
- all members identical (``HACluster.wait_identical``);
- the writer's history (its commits, and reads of keys it was acknowledged) through
  ``ha_checks.history_report``: no lost write, phantom, key journaled twice or stale read after its own
  write (``testing/history``).

With ``--min-confirm 1`` the primary's host is never lost together with a secondary's: the one member
left could confirm nothing, and every commit would wait out MIN_CONFIRM_TIMEOUT until one returns.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..errors import CoordinatorUnavailable
from ..ha.coordinator import Coordinator
from .etcd import EtcdCluster
from .ha import REGION, HACluster, Writer
from .ha_checks import (check_one_primary_at_a_time, history_report, journal_updates, leadership_periods,
                        unacknowledged_loss)

PRIMARY_FAULTS = ("kill_primary", "pause_primary", "switchover", None)
OTHER_FAULTS = ("kill_etcd", "kill_secondary", None)
FAILOVER_TIMEOUT_S = 30.0  # a new primary acknowledges a commit within this after a primary fault
HEAL_TIMEOUT_S = 60.0  # every member streaming from the primary again after the heal
SWITCHOVER_REQUEST_TTL_S = 30.0
WARMUP_S = (0.2, 0.6)  # the writer commits this long (uniform) before the first fault
BETWEEN_S = (0.0, 0.5)  # and this long between two faults, and after the last before the heal


@dataclass(frozen=True)
class Plan:
    seed: int
    min_confirm: int
    primary_fault: str | None
    other_fault: str | None
    secondary_index: int  # which secondary (in name order) a switchover or a secondary's loss takes
    etcd_index: int
    primary_first: bool  # which of the two faults strikes first
    warmup_s: float
    between_s: float

    @property
    def faults(self) -> list[str]:
        both = [self.primary_fault, self.other_fault] if self.primary_first else [self.other_fault, self.primary_fault]
        return [f for f in both if f]


def plan(seed: int) -> Plan:
    """What the round of ``seed`` does (see the module docstring)."""
    rng = random.Random(seed)
    min_confirm = seed % 2
    while True:
        p, o = rng.choice(PRIMARY_FAULTS), rng.choice(OTHER_FAULTS)
        if p is None and o is None:
            continue
        if min_confirm and o == "kill_secondary" and p in ("kill_primary", "pause_primary"):
            continue
        break
    return Plan(seed, min_confirm, p, o, rng.randrange(2), rng.randrange(3), rng.random() < 0.5,
                rng.uniform(*WARMUP_S), rng.uniform(*BETWEEN_S))


@dataclass
class Totals:
    """Over every round run: what the bench and the test print."""

    rounds: int = 0
    faults: Counter = field(default_factory=Counter)
    acknowledged: int = 0
    acknowledged_min_confirm: int = 0
    lost_min_confirm: int = 0  # acknowledged under --min-confirm 1 and not on the final primary: must stay 0
    in_lost_files: int = 0  # acknowledged without --min-confirm, not on the primary, in a lost file
    silently_lost: int = 0  # acknowledged, on the primary in no form, in no lost file: must stay 0
    unknown: int = 0
    refused: int = 0
    seconds: float = 0.0
    smallest_gap_s: float | None = None  # between two leaders' commits, over all rounds
    history_ops: int = 0  # the writers' calls checked by the history checker (commits and reads)
    reads: int = 0
    anomalies: Counter = field(default_factory=Counter)  # by kind: must stay empty
    excused: int = 0  # acknowledged without --min-confirm, in a lost file (and reads that missed them)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        return (f"{self.rounds} rounds in {self.seconds:.0f} s: {sum(self.faults.values())} faults ({kinds}); "
                f"{self.acknowledged} commits acknowledged ({self.acknowledged_min_confirm} under --min-confirm 1, "
                f"of which lost: {self.lost_min_confirm}); without it {self.in_lost_files} in lost files, "
                f"{self.silently_lost} silently lost; {self.unknown} outcomes unknown, {self.refused} refused; "
                f"smallest gap between two primaries' commits "
                + (f"{self.smallest_gap_s:.3f} s" if self.smallest_gap_s is not None else "(one primary only)")
                + f"; history: {self.history_ops} operations ({self.reads} reads), anomalies "
                  f"{dict(self.anomalies) or 'none'}, {self.excused} excused")


class _Round:
    """One round's state: what was struck, so that the heal undoes exactly that."""

    def __init__(self, c: HACluster, etcd: EtcdCluster, p: Plan, log: Callable[[str], None]):
        self.c, self.etcd, self.p, self.log = c, etcd, p, log
        self.lost_hosts: list[str] = []
        self.paused: list[str] = []
        self.etcd_down: list[int] = []
        self.old_primary = c.wait_primary()  # a 1 s lease that lapsed under load leaves none for a moment
        self.secondaries = sorted(n for n in c.names if n != self.old_primary)

    def strike(self, fault: str) -> None:
        c, p = self.c, self.p
        target = self.secondaries[p.secondary_index]  # after a switchover to it, the primary: so be it
        self.log(f"seed {p.seed}: {fault}" + (f" ({self.old_primary})" if "primary" in fault else
                                             f" (etcd m{p.etcd_index})" if fault == "kill_etcd" else f" ({target})"))
        if fault == "kill_primary":
            c.lose_host(self.old_primary)
            self.lost_hosts.append(self.old_primary)
        elif fault == "pause_primary":
            c.pause_host(self.old_primary)
            self.paused.append(self.old_primary)
        elif fault == "switchover":
            to = next(n for n in [target, *self.secondaries] if n not in self.lost_hosts)
            _request_switchover(c, to)
        elif fault == "kill_secondary":
            c.lose_host(target)
            self.lost_hosts.append(target)
        elif fault == "kill_etcd":
            self.etcd.kill(p.etcd_index)
            self.etcd_down.append(p.etcd_index)
        else:
            raise ValueError(fault)

    def heal(self) -> None:
        for i in self.etcd_down:
            self.etcd.restart(i)
        for n in self.paused:
            self.c.resume_host(n)
        for n in self.lost_hosts:
            self.c.restart_host(n)


def _request_switchover(c: HACluster, to: str) -> None:
    """As ``ha switchover`` does, again while etcd has no leader (an etcd member was just killed: a
    write's outcome is then unknown, and writing the request again changes nothing)."""
    coord = Coordinator(c.cluster, c.etcd, name="(test)", ttl_s=1.0)
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while True:
        try:
            asyncio.run(coord.request_switchover(to, SWITCHOVER_REQUEST_TTL_S))
            return
        except CoordinatorUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_round(c: HACluster, etcd: EtcdCluster, p: Plan, totals: Totals,
              log: Callable[[str], None] = print) -> None:
    """One round on a healthy cluster of ``p.min_confirm``; AssertionError naming the seed if a check fails."""
    t0 = time.monotonic()
    try:
        _run(c, etcd, p, totals, log)
    except Exception as e:
        raise AssertionError(f"HA round of seed {p.seed} failed ({p}); replay it with HA_SEED={p.seed}: "
                             f"{type(e).__name__}: {e}") from e
    finally:
        totals.seconds += time.monotonic() - t0


def _run(c: HACluster, etcd: EtcdCluster, p: Plan, totals: Totals, log: Callable[[str], None]) -> None:
    assert c.min_confirm == p.min_confirm, f"seed {p.seed} runs with --min-confirm {p.min_confirm}"
    t0 = time.monotonic()
    c.wait_primary()
    c.wait_followers(timeout_s=HEAL_TIMEOUT_S)
    r = _Round(c, etcd, p, log)
    w = c.writer(tag=f"s{p.seed}")
    try:
        time.sleep(p.warmup_s)
        for i, fault in enumerate(p.faults):
            if i:
                time.sleep(p.between_s)
            t_fault = time.monotonic()
            r.strike(fault)
            totals.faults[fault] += 1
            if fault in ("kill_primary", "pause_primary", "switchover"):
                new = c.wait_primary(exclude=r.old_primary, timeout_s=FAILOVER_TIMEOUT_S)
                w.wait_commit_after(t_fault, FAILOVER_TIMEOUT_S, on=c.address(new))
        time.sleep(p.between_s)
        t_heal = time.monotonic()
        r.heal()
        c.wait_followers(timeout_s=HEAL_TIMEOUT_S)
        t_healed = time.monotonic()
        w.wait_commit_after(t_healed, FAILOVER_TIMEOUT_S)  # the healed cluster takes commits
    finally:
        w.stop()
    t_check = time.monotonic()
    _check(c, w, p, totals)
    log(f"seed {p.seed}: faults {t_heal - t0:.1f} s, heal {t_healed - t_heal:.1f} s, "
        f"checks {time.monotonic() - t_check:.1f} s; {len(w.acked)} acknowledged")


def _check(c: HACluster, w: Writer, p: Plan, totals: Totals) -> None:
    c.wait_followers(timeout_s=HEAL_TIMEOUT_S)
    c.wait_identical()
    primary = c.wait_primary()  # waited for, not read once: a lease that lapsed under load leaves none for a moment
    missing, silent = unacknowledged_loss((w.key(i) for i in w.acked), c.rows(primary), c.lost_rows())
    totals.rounds += 1
    totals.acknowledged += len(w.acked)
    totals.unknown += len(w.unknown)
    totals.refused += len(w.refused)
    if p.min_confirm:
        totals.acknowledged_min_confirm += len(w.acked)
        totals.lost_min_confirm += len(missing)
    else:
        totals.in_lost_files += len(missing) - len(silent)
    totals.silently_lost += len(silent)
    assert not silent, f"acknowledged commits silently lost: {silent[:10]} (of {len(silent)})"
    assert not (p.min_confirm and missing), (f"--min-confirm 1, yet acknowledged commits are not on the "
                                             f"primary {primary}: {missing[:10]} (of {len(missing)})")
    rows = c.rows(primary)
    present = [i for i in w.refused if w.key(i) in rows]
    assert not present, f"commits refused to the writer are on the primary: {present[:10]}"
    _check_history(c, w, p, primary, rows, totals)
    gap = check_one_primary_at_a_time(leadership_periods(c.root(n) for n in c.names))
    if gap is not None:
        totals.smallest_gap_s = gap if totals.smallest_gap_s is None else min(gap, totals.smallest_gap_s)


def _check_history(c: HACluster, w: Writer, p: Plan, primary: str, rows: dict, totals: Totals) -> None:
    """The writer's history against the final primary (``ha_checks.history_report``)."""
    h = w.history.history()
    keys = {o.key for o in h}
    report = history_report(h, keys, rows, c.lost_rows(), journal_updates(c.root(primary), REGION, keys),
                            min_confirm=bool(p.min_confirm))
    totals.history_ops += report.ops
    totals.reads += sum(n for k, n in report.counts.items() if k.startswith("read"))
    totals.anomalies.update(report.by_kind())
    totals.excused += report.excused
    report.assert_clean(f"seed {p.seed}")
