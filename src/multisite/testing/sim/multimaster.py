"""Multi-master documents on three replicas, as one simulated world.

Three replicas of one database (A, B, C), each a real ``DocDB`` (the engine on a temp directory,
durability none: see DESIGN.md for why this family keeps real files), with clocks that skew and drift
(``DocDB``'s ``clock`` and ``rand`` are parameters already). Steps edit documents on any replica
(create, update fields, delete), and run replication sessions between any two in any mode with the
real ``multimaster.session.initiate`` and ``Responder``; a session can be cut after any request (the
initiator abandoned: what was applied stays, bookmarks stay where they were stored).

Invariants:

- ``versions-never-go-back`` (after every step): a replica's version of a document is replaced only
  by one that descends from it or wins over it (rank never decreases);
- ``replicas-converge`` (at the end, after uncut sessions until quiet): the three hold the same
  documents, conflict documents included;
- ``conflict-winners-independent-of-arrival-order`` (at the end): the replicas as they stand, copied
  twice and converged by sessions in two different orders, end with the same documents and live
  conflict documents; ``conflict-records-independent-of-arrival-order``: and the same deleted
  conflict documents (the records of dropped losers).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

from ...multimaster.conflicts import descends, winner
from ...multimaster.document import CONFLICT_FIELD
from ...multimaster.server import docdb
from ...multimaster.session import Mode, Pipeline, Responder, initiate
from .core import Clock, Stats, Step, Violation, drive, rng_for

NAMES = ("A", "B", "C")
MODES = (Mode.PULL_PUSH, Mode.PULL_ONLY, Mode.PUSH_ONLY)
FIELDS = ("a", "b", "c")
SETTLE_ROUNDS_MAX = 8


class MultiMasterWorld:
    def __init__(self, seed: int):
        cfg = rng_for(seed, "config")
        self.merge = cfg.random() < 0.5
        self.stats = Stats()
        self.now = 1_700_000_000.0
        self.tmp = Path(tempfile.mkdtemp(prefix="msim-mm-"))
        self.clocks = {n: Clock(cfg.uniform(-2, 2), 1 + cfg.uniform(-0.01, 0.01)) for n in NAMES}
        self.rand = {n: random.Random(f"{seed}:rand:{n}") for n in NAMES}
        self.dbs: dict = {}
        rid = None
        for n in NAMES:
            db = docdb.create(self.tmp / n, "sim", replica_id=rid, durability="none", clock=self._clock(n),
                              rand=lambda r=self.rand[n]: r.getrandbits(64))
            db.define_form("memo", merge=self.merge)
            rid = db.replica_id
            self.dbs[n] = db
        self.unids: list[str] = []
        self.seen: dict[tuple[str, str], object] = {}  # (replica, unid) -> the version last seen

    def _clock(self, name: str):
        return lambda: int(self.clocks[name].read(self.now) * 1_000_000)

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()
        self.dbs = {}
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- steps ---------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        kind, *a = step
        self.now += 0.001
        getattr(self, f"step_{kind}")(*a)

    def step_create(self, i: int, v: int) -> None:
        db = self.dbs[NAMES[i]]
        unid = db.create("memo", {"a": v, "b": v, "c": v})
        self.unids.append(unid)
        self.stats.txns += 1

    def _live(self, i: int, k: int):
        """Replica ``i`` and the ``k``-th known document, if that replica holds it undeleted; else None."""
        db = self.dbs[NAMES[i]]
        if not self.unids:
            return None
        unid = self.unids[k % len(self.unids)]
        cur = db.get(unid, include_deleted=True)
        return None if cur is None or cur.deleted else (db, unid)

    def step_update(self, i: int, k: int, f: int, v: int) -> None:
        if (live := self._live(i, k)) is not None:
            live[0].update(live[1], {FIELDS[f]: v})
            self.stats.txns += 1

    def step_delete(self, i: int, k: int) -> None:
        if (live := self._live(i, k)) is not None:
            live[0].delete(live[1])
            self.stats.txns += 1

    def step_session(self, i: int, j: int, mode: int, cut_after: int) -> None:
        """A session from replica i to replica j; cut after ``cut_after`` requests (0: never)."""
        if i == j:
            return
        a, b = self.dbs[NAMES[i]], self.dbs[NAMES[j]]
        gen = initiate({a.replica_id: a}, NAMES[i], MODES[mode])
        answer = Responder(NAMES[j], {b.replica_id: b}).handle
        n = 0
        try:
            req = next(gen)
            while True:
                n += 1
                if cut_after and n >= cut_after:
                    gen.close()
                    self.stats.note("sessions-cut")
                    return
                req = gen.send((answer(r) for r in req) if isinstance(req, Pipeline) else answer(req))
        except StopIteration:
            self.stats.note("sessions")

    # -- invariants ----------------------------------------------------------------------------------
    @staticmethod
    def state(db) -> dict:
        return {d.unid: (tuple(d.stamp), d.deleted, tuple(sorted(d.fields.items()))) for d in db.documents(include_deleted=True)}

    def check(self) -> None:
        for n, db in self.dbs.items():
            for d in db.documents(include_deleted=True):
                was = self.seen.get((n, d.unid))
                if was is not None and d.stamp != was.stamp and not descends(d, was) and winner(d, was) is not d:
                    raise Violation("versions-never-go-back", f"{n}'s {d.unid} went from version {tuple(was.stamp)} "
                                    f"to {tuple(d.stamp)}, which neither descends from it nor wins over it")
                self.seen[(n, d.unid)] = d

    def finish(self) -> None:
        """Copy the three replicas as they stand twice; converge the copies with sessions in two
        different orders: they must end identical (and so must the replicas themselves)."""
        try:
            for db in self.dbs.values():
                db.close()
            ends = []
            for order in ((0, 1, 2), (2, 1, 0)):
                copies = {}
                for n in NAMES:
                    shutil.copytree(self.tmp / n, self.tmp / f"{n}-{order}")
                    copies[n] = docdb.open(self.tmp / f"{n}-{order}", clock=self._clock(n),
                                           rand=lambda r=self.rand[n]: r.getrandbits(64))
                self.dbs = copies
                try:
                    ends.append(self._converge(order))
                finally:
                    for db in copies.values():
                        db.close()
            _same_ends(*ends)
        finally:
            self.dbs = {}
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _converge(self, order: tuple[int, ...]) -> dict:
        for _ in range(SETTLE_ROUNDS_MAX):
            for i in order:
                for j in order:
                    self.step_session(i, j, 0, 0)
            states = [self.state(db) for db in self.dbs.values()]
            if states[0] == states[1] == states[2]:
                return states[0]
        diff = sorted(set(states[0].items()) ^ set(states[1].items()) ^ set(states[2].items()))[:2]
        raise Violation("replicas-converge", f"after {SETTLE_ROUNDS_MAX} rounds of full sessions the replicas "
                        f"differ, e.g. {diff}")


def _same_ends(a: dict, b: dict) -> None:
    """The two orders' ends: the documents and live conflict documents first (what a reader sees), then
    the deleted conflict documents (the records CouchDB clients read as deleted leaves)."""
    def tomb(v) -> bool:
        return v is not None and v[1] and any(k == CONFLICT_FIELD for k, _ in v[2])
    def live(v) -> bool:
        return v is not None and not tomb(v)
    for what, pick in (("conflict-winners-independent-of-arrival-order", live),
                       ("conflict-records-independent-of-arrival-order", tomb)):
        bad = sorted(u for u in set(a) | set(b)
                     if (pick(a.get(u)) or pick(b.get(u))) and a.get(u) != b.get(u))
        if bad:
            raise Violation(what, f"the same replicas converged by sessions in two orders end differently "
                            f"({len(bad)} document(s), e.g. {bad[0]}: {a.get(bad[0])} vs {b.get(bad[0])})")


def generate(seed: int, n: int) -> list[Step]:
    r = rng_for(seed, "steps")
    weights = [("create", 3), ("update", 8), ("delete", 1), ("session", 5)]
    kinds = [k for k, w in weights for _ in range(w)]
    steps: list[Step] = []
    for _ in range(n):
        k = r.choice(kinds)
        if k == "create":
            steps.append(("create", r.randrange(3), r.randrange(100)))
        elif k == "update":
            steps.append(("update", r.randrange(3), r.randrange(1 << 16), r.randrange(3), r.randrange(100)))
        elif k == "delete":
            steps.append(("delete", r.randrange(3), r.randrange(1 << 16)))
        else:
            steps.append(("session", r.randrange(3), r.randrange(3), r.randrange(3),
                          r.choice((0, 0, 0, r.randint(1, 12)))))
    return steps


class MultiMaster:
    name = "multimaster"
    shrink_replays = 40  # a replay costs a second (real files): shrink less

    def generate(self, seed: int, n: int) -> list[Step]:
        return generate(seed, n)

    def replay(self, seed: int, steps: list[Step]) -> Stats:
        w = MultiMasterWorld(seed)
        try:
            return drive(w, steps)
        finally:
            w.close()
