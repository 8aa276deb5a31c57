"""Act 6 (guaranteed message delivery): a consolidated instance HQ and three remote sites exchange
changes both ways through the file transport. Paris's messages go through an unreliable courier that
delays, duplicates and reorders them; Oslo is offline for a few rounds (its messages pile up in its
inbox, and its own changes wait in its journal). Every site changes data every round; in round 2 HQ
and Paris change the same row (an update conflict: HQ's copy wins, and it is logged). After each round
the act prints HQ's SYSREMOTEUSER table; at the end every remote holds exactly its subscribed rows
and HQ holds everything.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

from rich.console import Console

from .. import engine
from ..delivery.server import api
from ..journal.offsets import format_offset
from ..testing.delivery import FIELD, REGION, make_topology, poll

SITES = {"paris": "fr", "berlin": "de", "oslo": "no"}
ROUNDS = 6
OFFLINE_ROUNDS = range(1, 4)  # oslo's agent does not run in these rounds


class Courier:
    """Carries the messages bound for one remote badly: each round it delivers some of what it holds
    (the rest waits, so later messages overtake earlier ones) and delivers some twice."""

    def __init__(self, inbox: Path, hold: Path, rng: random.Random):
        self.inbox, self.hold, self.rng = inbox, hold, rng
        hold.mkdir(parents=True, exist_ok=True)
        self.delayed = self.duplicated = 0

    def take(self) -> None:
        """Take what the sender just wrote out of the remote's inbox."""
        for p in self.inbox.glob("HQ(*.msg"):
            os.replace(p, self.hold / p.name)

    def deliver(self, everything: bool = False) -> None:
        for p in sorted(self.hold.glob("*.msg")):
            if not everything and self.rng.random() < 0.5:
                self.delayed += 1
                continue
            if self.rng.random() < 0.3:
                shutil.copy(p, self.inbox / (p.stem + ".again.msg"))
                self.duplicated += 1
            os.replace(p, self.inbox / p.name)


def _commit(path: Path, rows: dict) -> None:
    with engine.open(path) as db, db.transaction() as tx:
        for k, v in rows.items():
            tx.set(REGION, k, v)


def act_delivery(console: Console, root: Path) -> bool:
    """Run act 6 under ``root``: True when every remote ends with exactly its subscribed rows, HQ with
    everything, one conflict logged and kept as HQ's copy, and every sent message confirmed."""
    console.rule("[bold]Act 6: guaranteed message delivery, a consolidated instance and three remote sites")
    rng = random.Random(5)
    top = make_topology(root / "delivery", SITES)
    console.print(f"HQ publishes {REGION} subscribed by {FIELD}; remotes {', '.join(f'{n} ({v})' for n, v in SITES.items())}; "
                  f"file transport: an inbox folder per site under {top.root / 'inbox'}")
    courier = Courier(top.inbox("paris"), top.root / "courier-paris", rng)
    for rnd in range(1, ROUNDS + 1):
        _change_everywhere(top, rnd)
        _exchange(console, top, courier, rnd)
    console.print("oslo is back; the courier hands over what it still holds; agents run until nothing moves")
    _drain(top, courier)
    return _check_end(console, top, courier)


def _change_everywhere(top, rnd: int) -> None:
    """Round ``rnd``'s changes: HQ new orders for each site, each remote updates or adds its own rows; in
    round 2 HQ and Paris both change order 0 (Paris's) before the next exchange, a conflict."""
    n = (rnd - 1) * len(SITES)  # the orders of earlier rounds
    _commit(top.hq, {("o", n + i): {FIELD: v, "qty": i, "by": "HQ"} for i, v in enumerate(SITES.values())})
    for name, value in SITES.items():
        _commit(top.remotes[name], {(name, rnd): {FIELD: value, "qty": rnd, "by": name}})
    if rnd == 2:
        _commit(top.hq, {("o", 0): {FIELD: "fr", "qty": 100, "by": "HQ"}})
        _commit(top.remotes["paris"], {("o", 0): {FIELD: "fr", "qty": 7, "by": "paris"}})


def _exchange(console: Console, top, courier: Courier, rnd: int) -> None:
    """One exchange: the agents of the sites online this round run, then HQ's, the courier takes and
    delivers some of Paris's messages, and HQ's SYSREMOTEUSER table is printed."""
    online = [s for s in SITES if not (s == "oslo" and rnd in OFFLINE_ROUNDS)]
    for name in online:
        poll(top.remotes[name])
    poll(top.hq)
    courier.take()
    courier.deliver()
    note = "oslo offline" if "oslo" not in online else "all online"
    with engine.open(top.hq) as db:
        console.print(api.status_table(api.status(db), f"round {rnd} ({note}): SYSREMOTEUSER of HQ"))


def _drain(top, courier: Courier) -> None:
    """Run every agent, the courier delivering all it holds, until nothing moves (12 passes at most)."""
    for _ in range(12):
        busy = False
        for path in top.remotes.values():
            rep = poll(path)
            busy |= rep.busy or bool(rep.waiting)
        rep = poll(top.hq)
        busy |= rep.busy or bool(rep.waiting)
        courier.take()
        courier.deliver(everything=True)
        if not busy:
            break


def _check_end(console: Console, top, courier: Courier) -> bool:
    """Print and check the end state: each remote's rows against HQ's rows of its subscription, the rows
    made at the remotes, the courier's mischief, the conflict log, and every message confirmed."""
    with engine.open(top.hq) as db:
        st = api.status(db)
        conflicts = api.conflicts(db)
        hq = dict(db.items(REGION))
    console.print(api.status_table(st, "at the end: SYSREMOTEUSER of HQ"))
    ok = True
    for name, value in SITES.items():
        with engine.open(top.remotes[name]) as db:
            got = dict(db.items(REGION))
        want = {k: v for k, v in hq.items() if v[FIELD] == value}
        good = got == want
        ok &= good
        console.print(f"{name}: {len(got)} rows, exactly its subscribed rows ({FIELD}={value}): "
                      f"{'yes' if good else '[red]NO[/red]'}")
    remote_rows = sum(1 for k in hq if k[0] in SITES)
    ok &= remote_rows == len(SITES) * ROUNDS
    console.print(f"HQ: {len(hq)} rows, {remote_rows} of them made at the remotes (expected {len(SITES) * ROUNDS})")
    console.print(f"courier to paris: {courier.delayed} deliveries delayed, {courier.duplicated} duplicated "
                  f"(dropped on arrival)")
    for c in conflicts:
        console.print(f"conflict logged: {c['user']} changed {tuple(c['key'])} at offset {format_offset(c['offset'])}; "
                      f"rule {c['rule']}: HQ's copy kept")
    ok &= len(conflicts) == 1 and hq[("o", 0)]["by"] == "HQ"
    ok &= all(r["confirm_sent"] == r["log_sent"] for r in st["remote_users"])
    return ok
