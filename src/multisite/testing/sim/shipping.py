"""Log shipping A→B→C with failovers, as one simulated world, and its invariants.

Three instances in a chain (the primary feeds the next, which feeds the last); steps commit and
harden on the primary, move bytes, cut links, time out heartbeats, partition and heal, crash an
instance (keeping a seed-chosen part of its unhardened writes) and restart it, arm ENOSPC and EIO,
and fail over to another instance (the operator's ``instance role``: the old primary demoted when it
can be reached, the new one starts a history record, the chain rebuilt from it). A former primary
that comes back rolls back to the common point into a lost file (``--autorollback``). Each instance
reads its own clock (an offset of up to 100 s, a drift of up to 2%): the heartbeat watches use it.

Invariants, after every step (``check``) unless said:

- ``seqnos-never-go-back``: an instance's hardened seqno only grows, but by a rollback, and a
  rollback's frames are in its lost file;
- ``history-tells-divergence``: for every pair of instances, their journals hold the same frames up
  to the common point their history records give (else a receiver would keep a divergent tail and
  build on it: a silent divergence);
- ``no-replica-ahead-of-its-primary``: a frame an instance receives is hardened on the instance that
  originated it (or is in that instance's lost file); checked as frames arrive, and when a crash
  takes unhardened frames off an originator, none of them may be on another instance;
- ``acknowledged-commits-survive``: every acknowledged commit is in some journal or in a lost file
  (checked after the steps that can take frames away: crash, restart, rollback), and at the end, once
  healed and settled, on the primary or in a lost file;
- ``replicas-converge``: at the end, every instance holds the primary's journal.
"""

from __future__ import annotations

import errno
from itertools import pairwise

from ...replication.history import common_point
from .core import Clock, Stats, Step, Violation, drive, rng_for
from .shipping_link import Link
from .shipping_node import Node, NodeCrashed

NAMES = ("A", "B", "C")
SETTLE_ROUNDS_MAX = 400  # rounds of connect/pump/deliver at the end before "not converged" is a finding
# server/instance.py: a group-mode primary's server starts a history record before its sources connect, so
# frames it shipped before their fdatasync and then lost (EIO, a power cut) are told from the next commits.
# False: the server before that fix (seed 1624 diverges).
RESTART_NEW_RECORD = True


class ShippingWorld:
    def __init__(self, seed: int):
        cfg = rng_for(seed, "config")
        self.compress_level = cfg.choice((0, 0, 3))
        self.batch_txns = cfg.choice((1, 4, 16))
        # group: the journal pool takes a batch before its fdatasync, so sources may ship unhardened frames
        self.durability = cfg.choice(("fsync", "fsync", "group"))
        self.stats = Stats()
        self.now = 0.0
        self._uid = seed * 1_000_003 + 1
        self._fid = 0
        self.fid_of: dict[bytes, int] = {}
        self.origin: dict[int, str] = {}
        self.acked: set[int] = set()
        self.shipped: set[int] = set()
        self.isolated: set[str] = set()
        self.nodes = [Node(n, "primary" if n == "A" else "secondary", self.uid()) for n in NAMES]
        for n in self.nodes:
            n.clock = Clock(cfg.uniform(-100, 100), 1 + cfg.uniform(-0.02, 0.02))
        self.primary = self.nodes[0]
        self.floor = {n.name: 0 for n in self.nodes}
        self.links: list[Link] = []
        self.chain(self.nodes)

    # -- identities ----------------------------------------------------------------------------------
    def uid(self) -> int:
        self._uid = (self._uid * 6364136223846793005 + 1442695040888963407) % (1 << 62)
        return self._uid

    def new_fid(self) -> int:
        self._fid += 1
        return self._fid

    def frame_id(self, frame: bytes, at: Node, seqno: int) -> int:
        """The number of a frame ``at`` receives at ``seqno``: one some instance made (no phantom),
        hardened on its originator at that seqno or in its lost file."""
        fid = self.fid_of.get(frame)
        if fid is None:
            raise Violation("no-phantom-frames", f"{at.name} received a frame at seqno {seqno} nobody committed")
        o = self.node(self.origin[fid])
        self.shipped.add(fid)
        if self.durability == "group":  # shipped before hardened, by design: the history must tell them apart
            return fid
        held = seqno <= o.journal.durable_seqno and o.ids[seqno - 1] == fid if seqno <= len(o.ids) else False
        if not held and not any(fid in lost for lost in o.lost_ids):
            raise Violation("no-replica-ahead-of-its-primary",
                            f"{at.name} received seqno {seqno} (commit #{fid}) that its originator {o.name} does not "
                            f"hold hardened (it is at {o.journal.durable_seqno}) nor in a lost file")
        return fid

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # -- topology ------------------------------------------------------------------------------------
    def chain(self, order: list[Node]) -> None:
        for link in self.links:
            link.close()
        self.links = [Link(self, a, b) for a, b in pairwise(order)]

    def kick_sources(self, node: Node) -> None:
        for link in self.links:
            if link.src is node:
                link.close()

    def cut_all(self, node: Node) -> None:
        for link in self.links:
            if node in (link.src, link.dst):
                link.close()

    # -- what steps do -------------------------------------------------------------------------------
    def crash(self, node: Node, keep_permille: int) -> None:
        if not node.up:
            return
        self.cut_all(node)
        node.crash(keep_permille)
        self.stats.note("crashes")

    def restart(self, node: Node) -> None:
        if node.up:
            return
        before = list(node.ids)
        try:
            torn = node.restart(self.fid_of)
        except OSError:  # EIO while recovery cut a torn tail: the start fails, the instance stays down
            node.up = False
            self.stats.note("restart-failed")
            return
        if torn:
            self.stats.note("torn-writes-cut")
        survived = set(node.ids)
        for fid in (before if self.durability == "fsync" else ()):
            if fid not in survived and fid in self.shipped and self.origin[fid] == node.name:
                raise Violation("no-replica-ahead-of-its-primary",
                                f"{node.name} lost commit #{fid} in a crash (never hardened) but a replica holds it")
        if node is not self.primary and node.info.role == "primary":
            self.demote(node)  # the operator starts a deposed primary again as a secondary
        elif node.info.role == "primary" and self.durability == "group" and RESTART_NEW_RECORD:
            node.info.add_history(node.journal.seqno + 1, node.name, "originating", uid=self.uid(), created=self.now)
            self._save(node)
        self.check_acked("restart")

    def demote(self, node: Node) -> None:
        node.info.role = "secondary"
        self._save(node)
        self.kick_sources(node)

    def rollback(self, node: Node, to_seqno: int) -> None:
        try:
            gone = node.rollback(to_seqno, self.uid())
        except NodeCrashed:
            self.crash(node, 0)
            return
        self.kick_sources(node)
        self.stats.note("rollbacks")
        self.stats.note("rolled-back-txns", len(gone))
        self.floor[node.name] = node.journal.durable_seqno
        self.check_acked("rollback")

    def _save(self, node: Node) -> None:
        try:
            node.save_info()
        except OSError:
            self.crash(node, 0)

    def failover(self, new: Node) -> None:
        """The operator's failover to ``new``: demote the old primary if it can be reached, promote
        ``new`` (a history record of its own), rebuild the chain from it."""
        old = self.primary
        if new is old or not new.up or new.name in self.isolated:
            return
        if old.up and old.name not in self.isolated:
            self.demote(old)
        new.info.role = "primary"
        new.info.add_history(new.journal.seqno + 1, new.name, "originating", uid=self.uid(), created=self.now)
        self._save(new)
        self.primary = new
        self.chain([new] + [n for n in self.nodes if n is not new])
        self.stats.note("failovers")

    def commit(self, node: Node, n: int) -> None:
        if not node.up or node.info.role != "primary":
            return
        try:
            ids = node.commit(self.fid_of, n, self.now, self.new_fid)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self.stats.note("enospc")
            return
        for fid in ids:
            self.origin[fid] = node.name

    def harden(self, node: Node) -> None:
        if not node.up:
            return
        try:
            done = node.harden()
        except NodeCrashed:
            self.stats.note("eio")
            self.crash(node, 0)
            return
        self.acked.update(done)
        self.stats.txns += len(done)

    # -- steps ---------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        kind, *a = step
        getattr(self, f"step_{kind}")(*a)

    def _pick(self, i: int) -> Node:
        return self.primary if i < 0 else self.nodes[i]

    def step_commit(self, i: int, n: int) -> None:
        self.commit(self._pick(i), n)

    def step_sync(self, i: int) -> None:
        self.harden(self._pick(i))

    def step_connect(self, li: int) -> None:
        self.links[li].connect()

    def step_pump(self, li: int) -> None:
        self.links[li].pump(self.batch_txns)

    def step_deliver(self, li: int, to_dst: bool, permille: int) -> None:
        self.links[li].deliver(to_dst, permille)

    def step_cut(self, li: int) -> None:
        self.links[li].close()

    def step_tick(self, ms: int) -> None:
        self.now += ms / 1000
        for link in self.links:
            link.heartbeat()
            link.timeouts()

    def step_crash(self, i: int, keep_permille: int) -> None:
        self.crash(self._pick(i), keep_permille)
        self.check_acked("crash")

    def step_restart(self, i: int) -> None:
        self.restart(self.nodes[i])

    def step_partition(self, i: int) -> None:
        self.isolated.add(self.nodes[i].name)

    def step_heal(self) -> None:
        self.isolated.clear()
        for n in self.nodes:  # the operator demotes a deposed primary it can reach again
            if n.up and n is not self.primary and n.info.role == "primary":
                self.demote(n)

    def step_failover(self, i: int) -> None:
        self.failover(self.nodes[i])

    def step_fault(self, i: int, what: str) -> None:
        disk = self.nodes[i].disk
        if what == "enospc":
            disk.free_bytes = 0
        elif what == "eio":
            disk.eio_fsyncs = 1
        else:
            disk.free_bytes, disk.eio_fsyncs = None, 0

    # -- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        for n in self.nodes:
            d = n.journal.durable_seqno
            if d < self.floor[n.name]:
                raise Violation("seqnos-never-go-back", f"{n.name}'s hardened seqno went from "
                                f"{self.floor[n.name]} to {d} without a rollback")
            self.floor[n.name] = d
        nodes = self.nodes
        for x in range(len(nodes)):
            for y in range(x + 1, len(nodes)):
                self._history_pair(nodes[x], nodes[y])

    def _history_pair(self, a: Node, b: Node) -> None:
        ea, eb = a.entries(), b.entries()
        if a.ids_key == b.ids_key:  # the same records: common_point is the lower seqno (checked by a unit test)
            cp = min(a.journal.seqno, b.journal.seqno)
        else:
            cp = common_point(ea, a.journal.seqno, eb, b.journal.seqno)
        if a.chain[cp] != b.chain[cp]:
            first = next(s for s in range(1, cp + 1) if a.ids[s - 1] != b.ids[s - 1])
            raise Violation("history-tells-divergence",
                            f"{a.name} and {b.name} share history up to seqno {cp} but differ from seqno {first} "
                            f"(commit #{a.ids[first - 1]} vs #{b.ids[first - 1]})")

    def check_acked(self, after: str, *, final: bool = False) -> None:
        held: set[int] = set()
        for n in ([self.primary] if final else self.nodes):
            held.update(n.ids[:n.journal.durable_seqno] if n.up or final else n.ids)
        for n in self.nodes:
            for lost in n.lost_ids:
                held.update(lost)
        missing = self.acked - held
        if missing:
            fid = min(missing)
            raise Violation("acknowledged-commits-survive",
                            f"after {after}: {len(missing)} acknowledged commit(s) on no "
                            f"{'primary' if final else 'instance'} and in no lost file (first: #{fid}, committed "
                            f"on {self.origin[fid]})")

    # -- the end -------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Heal, restart, clear the faults, then replicate until quiet: every instance must hold the
        primary's journal, and every acknowledged commit be on the primary or in a lost file."""
        self.step_heal()
        for i, n in enumerate(self.nodes):
            self.step_fault(i, "clear")
            self.restart(n)
        self.harden(self.primary)
        for _ in range(SETTLE_ROUNDS_MAX):
            moved = 0
            for link in self.links:
                link.connect()
                moved += link.pump(64)
                for to_dst in (True, False):
                    buf = link.to_dst if to_dst else link.to_src
                    moved += len(buf)
                    link.deliver(to_dst, 1000)
            self.check()
            if not moved and all(link.open and link.streaming for link in self.links):
                break
        p = self.primary
        for n in self.nodes:
            if n.chain[-1] != p.chain[-1] or len(n.ids) != len(p.ids):
                raise Violation("replicas-converge", f"after healing, {n.name} is at seqno {len(n.ids)} and the "
                                f"primary {p.name} at {len(p.ids)}, journals {'equal' if n.chain[-1] == p.chain[-1] else 'differ'}")
        self.check_acked("settling", final=True)


# -- the steps a seed means --------------------------------------------------------------------------

def generate(seed: int, n: int) -> list[Step]:
    """``n`` steps for ``seed``: mostly commits and the replication that follows them, with faults
    often enough that a run of a few hundred steps sees several (a crash, a failover, a partition)."""
    r = rng_for(seed, "steps")
    steps: list[Step] = []
    weights = [("commit", 18), ("sync", 12), ("pump", 14), ("deliver", 30), ("connect", 6), ("tick", 6),
               ("cut", 1), ("crash", 1), ("restart", 3), ("partition", 1), ("heal", 2), ("failover", 1),
               ("fault", 1)]
    kinds = [k for k, w in weights for _ in range(w)]
    for _ in range(n):
        k = r.choice(kinds)
        if k == "commit":
            steps.append(("commit", -1 if r.random() < 0.9 else r.randrange(3), r.randint(1, 4)))
        elif k == "sync":
            steps.append(("sync", -1 if r.random() < 0.9 else r.randrange(3)))
        elif k in ("pump", "connect", "cut"):
            steps.append((k, r.randrange(2)))
        elif k == "deliver":
            steps.append(("deliver", r.randrange(2), r.random() < 0.6, r.choice((1000, 1000, 500, r.randint(1, 999)))))
        elif k == "tick":
            steps.append(("tick", r.choice((10, 100, 500, 1500))))
        elif k == "crash":
            steps.append(("crash", -1 if r.random() < 0.5 else r.randrange(3), r.choice((0, 1000, r.randint(1, 999)))))
        elif k in ("restart", "partition", "failover"):
            steps.append((k, r.randrange(3)))
        elif k == "heal":
            steps.append(("heal",))
        else:
            steps.append(("fault", r.randrange(3), r.choice(("enospc", "eio", "clear", "clear"))))
    return steps


class LogShipping:
    """The family as ``core.run_seed`` drives it."""

    name = "log_shipping"

    def generate(self, seed: int, n: int) -> list[Step]:
        return generate(seed, n)

    def replay(self, seed: int, steps: list[Step]) -> Stats:
        return drive(ShippingWorld(seed), steps)
