"""The grid's synchronous vote and the catalog's promotion, as one simulated world.

One partition on three containers (a primary and two synchronous replicas, ``min_sync`` 0, 1 or 2). The
real cores decide: ``grid.voting.SyncReplicas`` / ``CommitVote`` (the vote, who is current, when a
replica counts again), ``grid.catalog.Catalog`` (membership, heartbeat loss, currency as the primary
reports it, the placement and its promotions, ``stale_currency`` for a deposed primary). What the
container processes do around them (``grid/server/primary.py``, ``replica.py``, ``lease.py``) is
mirrored in ``grid_container.py``. Messages are datagrams of a simulated network: delivered in any
order, dropped, duplicated; containers crash and restart (their journal is durable); partitions cut
a container off; each container reads its own skewed clock.

Invariants, after every step:

- ``refused-vote-visible-nowhere``: a transaction whose client was told VOTED_ROLLBACK is in no
  serving primary's journal, now or after any promotion;
- ``acknowledged-commits-on-the-primary-or-lost``: every acknowledged transaction is in the journal
  of the partition's primary once it has taken its role (with ``min_sync`` 0, a quarter of the seeds:
  on the primary or in a lost file, as the catalog's loss window says);
- ``no-two-primaries-in-overlapping-epochs``: commits are taken (a vote begun, under the lease) in
  epoch order in true time: none in an epoch after one was taken in a later epoch;
- ``journals-never-fork``: every container's journal is a prefix of, or equal to, the serving
  primary's once it has caught up (checked at the end, after healing).
"""

from __future__ import annotations

from ...grid.catalog import Catalog
from ...grid.policy import GridPolicy, MapPolicy
from ...grid.wire import GRID_WIRE_VERSION, Register
from .core import Clock, Stats, Step, Violation, drive, rng_for
from .grid_container import Container

NAMES = ("c1", "c2", "c3")
HEARTBEAT_TIMEOUT_S = 1.5
SETTLE_ROUNDS_MAX = 300


class GridWorld:
    def __init__(self, seed: int):
        cfg = rng_for(seed, "config")
        self.min_sync = cfg.choice((1, 1, 2))
        if rng_for(seed, "min_sync 0").random() < 0.25:  # a draw of its own: the other seeds keep their worlds
            self.min_sync = 0
        self.abort_tells_sync = ABORT_TELLS_SYNC
        self.stats = Stats()
        self.now = 0.0
        self.net: list[tuple[str, str, tuple]] = []
        self.isolated: set[str] = set()
        self.acked: dict[int, int] = {}  # tid -> epoch acknowledged in
        self.refused: set[int] = set()
        self.max_epoch_taken = 0
        self._tid = 0
        policy = GridPolicy(name="sim", partitions=1, min_sync=self.min_sync, max_sync=2, max_async=0,
                            maps=(MapPolicy("m"),), initial_containers=3)
        self.catalog = Catalog(policy, now=0.0, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        self.containers = {n: Container(self, n, Clock(cfg.uniform(-5, 5), 1 + cfg.uniform(-0.01, 0.01)))
                           for n in NAMES}
        for n in NAMES:
            self.register(n)
        self.push_assignments()

    # -- the catalog's side --------------------------------------------------------------------------
    def register(self, name: str) -> None:
        self.catalog.register(Register(GRID_WIRE_VERSION, "sim", name, None, f"{name}:1", 10), self.now)

    def push_assignments(self) -> None:
        for n in NAMES:
            self.send("catalog", n, ("assign", self.catalog.assignments_for(n)))

    def at_catalog(self, src: str, msg: tuple) -> None:
        kind = msg[0]
        before = self.catalog.placement.version
        if kind == "register":
            self.register(src)
        elif kind == "hb":
            _, hb, ack = msg
            refused = self.catalog.heartbeat(hb, self.now)
            if refused is not None:
                self.send("catalog", src, ("refused",))
            else:
                stale = self.catalog.stale_currency(src, hb.currency)
                self.send("catalog", src, ("hback", ack, stale))
        if self.catalog.placement.version != before or kind == "register":
            self.push_assignments()
        self.catalog.drain_log()

    # -- the network ---------------------------------------------------------------------------------
    def send(self, src: str, dst: str, msg: tuple) -> None:
        self.net.append((src, dst, msg))

    def _take(self, k: int) -> tuple[str, str, tuple] | None:
        if not self.net:
            return None
        return self.net.pop(k % len(self.net))

    def deliver(self, k: int) -> None:
        m = self._take(k)
        if m is None:
            return
        src, dst, msg = m
        if src in self.isolated or dst in self.isolated:  # the connection breaks: both ends see it
            self.stats.note("dropped-by-partition")
            self.cut(src, dst)
            return
        if dst == "catalog":
            self.at_catalog(src, msg)
        else:
            self.containers[dst].receive(src, msg)

    # -- what clients see ----------------------------------------------------------------------------
    def new_tid(self) -> int:
        self._tid += 1
        return self._tid

    def taken(self, c: Container, epoch: int) -> None:
        """A primary takes a commit (with its lease): never in an epoch older than one a commit was
        taken in already. (Its answer may come later: a vote begun before a promotion, whose voters hold
        the transaction, is acknowledged after it; ``acknowledged-commits-on-the-primary`` covers it.)"""
        if epoch < self.max_epoch_taken:
            raise Violation("no-two-primaries-in-overlapping-epochs",
                            f"{c.name} took a commit in epoch {epoch} after a commit was taken in epoch "
                            f"{self.max_epoch_taken}")
        self.max_epoch_taken = epoch

    def acknowledged(self, c: Container, tid: int, epoch: int) -> None:
        self.acked[tid] = epoch
        self.stats.txns += 1

    def voted_rollback(self, tid: int) -> None:
        self.refused.add(tid)
        self.stats.note("voted-rollback")

    # -- steps ---------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        kind, *a = step
        getattr(self, f"step_{kind}")(*a)

    def catalog_primary(self) -> str | None:
        return self.catalog.placement.partitions[0].primary

    def step_commit(self, i: int) -> None:
        name = self.catalog_primary() if i < 0 else NAMES[i]
        if name is not None:
            self.containers[name].commit()

    def step_deliver(self, k: int) -> None:
        """The next message of one channel (channels are ordered, as TCP connections are)."""
        if not self.net:
            return
        src, dst, _ = self.net[k % len(self.net)]
        i = next(i for i, (s, d, _) in enumerate(self.net) if (s, d) == (src, dst))
        self.deliver(i)

    def step_cut(self, k: int) -> None:
        """A connection cut: what is in flight on one channel is lost, and both ends see it."""
        if not self.net:
            return
        src, dst, _ = self.net[k % len(self.net)]
        self.cut(src, dst)

    def cut(self, src: str, dst: str) -> None:
        self.net = [m for m in self.net if {m[0], m[1]} != {src, dst}]
        self.stats.note("cuts")
        if "catalog" in (src, dst):
            c = self.containers[dst if src == "catalog" else src]
            if c.up:
                c.send("catalog", ("register",))
            return
        for a, b in ((src, dst), (dst, src)):
            ca, cb = self.containers[a], self.containers[b]
            if ca.up and ca.primary is not None and ca.links.get(b) is not None:
                ca.links.pop(b)
                ca.replica_dropped(ca.primary, b)
            if cb.up and cb.primary is None and cb.view is not None and cb.view.primary == a:
                cb.subscribe()

    def step_tick(self, ms: int) -> None:
        self.now += ms / 1000
        if self.catalog.tick(self.now):
            self.push_assignments()
        self.catalog.drain_log()
        for c in self.containers.values():
            c.tick()

    def step_crash(self, i: int) -> None:
        c = self.containers[NAMES[i]]
        if c.up:
            c.crash()
            self.net = [m for m in self.net if c.name not in (m[0], m[1])]
            self.stats.note("crashes")
            for o in self.containers.values():  # its connections end: the peers see them end
                if o.up and o.primary is not None and o.links.pop(c.name, None) is not None:
                    o.replica_dropped(o.primary, c.name)
                elif o.up and o.view is not None and o.view.primary == c.name:
                    o.synced = -1

    def step_restart(self, i: int) -> None:
        c = self.containers[NAMES[i]]
        if not c.up:
            c.restart()

    def step_partition(self, i: int) -> None:
        self.isolated.add(NAMES[i])

    def step_catalog_restart(self) -> None:
        """The catalog process restarts from its state file (``state_dict``): the connections to it end,
        every container registers again (``Catalog``'s restore gives each a full timeout to do so)."""
        self.catalog = Catalog(self.catalog.policy, now=self.now, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                               state=self.catalog.state_dict())
        self.catalog.drain_log()
        self.net = [m for m in self.net if "catalog" not in (m[0], m[1])]
        for c in self.containers.values():
            c.catalog_restarted()
        self.stats.note("catalog-restarts")

    def step_heal(self) -> None:
        self.isolated.clear()

    def step_fault(self, i: int, full: bool) -> None:
        self.containers[NAMES[i]].full = full

    # -- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        for c in self.containers.values():
            if c.up and c.primary is not None:
                bad = self.refused.intersection(c.journal)
                if bad:
                    raise Violation("refused-vote-visible-nowhere",
                                    f"{c.name}, primary in epoch {c.primary.epoch}, holds commit #{min(bad)} whose "
                                    f"client was told VOTED_ROLLBACK")
        s = self.catalog.placement.partitions[0]
        c = self.containers.get(s.primary) if s.primary else None
        if c is not None and c.up and c.primary is not None and c.primary.epoch == s.epoch:
            self._acked_held(c)

    def _acked_held(self, p, *, final: bool = False) -> None:
        """With min_sync >= 1 every acknowledged commit is on the primary; with 0 (no synchronous
        confirmation: a promotion may lose the lag, as the catalog's status says) on the primary or in
        a lost file, or, before the deposed primary is cut back, still in some journal."""
        missing = set(self.acked) - set(p.journal)
        if self.min_sync == 0:
            for c in self.containers.values():
                missing -= set(c.lost) if final else set(c.lost) | set(c.journal)
        if missing:
            tid = min(missing)
            raise Violation("acknowledged-commits-on-the-primary-or-lost",
                            f"{p.name}, primary in epoch {p.primary.epoch}, lacks acknowledged commit #{tid} "
                            f"(acknowledged in epoch {self.acked[tid]}, min_sync {self.min_sync})"
                            + ("" if self.min_sync else " and no lost file holds it"))

    def finish(self) -> None:
        """Heal, restart, clear faults; run until the catalog's primary serves with every replica
        current; then every journal must be the primary's."""
        self.step_heal()
        for i, n in enumerate(NAMES):
            self.step_fault(i, False)
            self.step_restart(i)
        for _ in range(SETTLE_ROUNDS_MAX):
            self.step_tick(100)
            while self.net:
                self.step_deliver(0)
            self.check()
            p = self.containers.get(self.catalog_primary() or "")
            if p is not None and p.primary is not None and len(p.primary.sr.current) == 2 and not p.primary.waiting:
                break
        else:
            raise Violation("grid-settles", f"after healing, no primary with both replicas current "
                            f"(placement {self.catalog.placement.partitions[0]})")
        p = self.containers[self.catalog_primary()]
        self._acked_held(p, final=True)
        for c in self.containers.values():
            if c.journal != p.journal:
                raise Violation("journals-never-fork", f"{c.name} holds {len(c.journal)} commits, the primary "
                                f"{p.name} {len(p.journal)}, and they differ")


# How the mirrored primary behaves where grid/server/primary.py had a bug the simulation found (see DESIGN.md):
ABORT_TELLS_SYNC = True  # a COMMIT-decided batch undone (lease lost while reporting) tells SyncReplicas.aborted


def generate(seed: int, n: int) -> list[Step]:
    r = rng_for(seed, "steps")
    weights = [("commit", 40), ("deliver", 140), ("tick", 20), ("cut", 2), ("crash", 1), ("restart", 4),
               ("partition", 1), ("heal", 3), ("fault", 1), ("catalog_restart", 1)]
    kinds = [k for k, w in weights for _ in range(w)]
    steps: list[Step] = []
    for _ in range(n):
        k = r.choice(kinds)
        if k == "commit":
            steps.append(("commit", -1 if r.random() < 0.9 else r.randrange(3)))
        elif k in ("deliver", "cut"):
            steps.append((k, r.randrange(1 << 16)))
        elif k == "tick":
            steps.append(("tick", r.choice((20, 100, 300, 800))))
        elif k in ("crash", "restart", "partition"):
            steps.append((k, r.randrange(3)))
        elif k in ("heal", "catalog_restart"):
            steps.append((k,))
        else:
            steps.append(("fault", r.randrange(3), r.random() < 0.5))
    return steps


class GridVote:
    name = "grid_vote"

    def generate(self, seed: int, n: int) -> list[Step]:
        return generate(seed, n)

    def replay(self, seed: int, steps: list[Step]) -> Stats:
        return drive(GridWorld(seed), steps)
