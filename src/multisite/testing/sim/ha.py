"""Automatic failover of log shipping (the HA managers' decisions) as one simulated world.

Three members of a cluster, each with a manager taking the real ``ha.decide.decide`` on what it read
from a simulated etcd (the leader key under a lease, the members' records under theirs, the highest
term) and its own clock, which is skewed (an offset of seconds) and drifts (up to ±1%). What the
manager does with an action (``ha/manager.py``) is mirrored: CAMPAIGN creates the leader key only
if absent (an etcd transaction), a leader renews its lease (the renewal may reach etcd late), FENCE
stops commits, REJOIN cuts a member back to the leader's journal into a lost list, FOLLOW copies the
leader's journal. A primary takes a commit only before ``fence_deadline`` by its own clock (the
engine's lease check). Members crash, restart, and are cut off from etcd and from each other.

Invariants, after every step:

- ``no-two-primaries-in-overlapping-epochs``: a commit is taken only while etcd's leader key names
  the member, in its term, under a lease that has not ended (in true time): no other member can hold
  the key then;
- ``terms-never-go-back``: the highest term in etcd only grows, and a leader key's term is above
  every earlier one;
- ``acknowledged-commits-survive``: every commit taken is in some member's journal or lost list.
"""

from __future__ import annotations

from dataclasses import replace

from ...ha.decide import (
    Kind,
    Leader,
    Local,
    Member,
    Timing,
    View,
    decide,
    fence_deadline,
)
from .core import Clock, Stats, Step, Violation, drive, rng_for

NAMES = ("m1", "m2", "m3")
GROUP = "simgroup"
TTL_S = 2.0
SETTLE_STEPS_MAX = 400


class Etcd:
    """The keys the managers share, with leases in true time."""

    def __init__(self) -> None:
        self.leader: tuple[str, int, float] | None = None  # (name, term, lease expiry)
        self.members: dict[str, tuple[Member, float]] = {}
        self.last_term = 0

    def expire(self, now: float) -> None:
        if self.leader is not None and now >= self.leader[2]:
            self.leader = None
        self.members = {n: (m, exp) for n, (m, exp) in self.members.items() if now < exp}

    def view(self) -> View:
        lead = Leader(self.leader[0], self.leader[1]) if self.leader else None
        return View(True, lead, tuple(m for m, _ in sorted(self.members.values())), self.last_term)


class HaMember:
    def __init__(self, name: str, clock: Clock, primary: bool):
        self.name, self.clock = name, clock
        self.local = Local(name, "primary" if primary else "secondary", 0)
        self.journal: list[int] = []
        self.lost: list[int] = []
        self.up = True

    def seqno(self) -> int:
        return len(self.journal)


class HaWorld:
    def __init__(self, seed: int):
        cfg = rng_for(seed, "config")
        self.timing = Timing(ttl_s=TTL_S, settle_s=cfg.choice((0.1, 0.3)))
        self.stats = Stats()
        self.now = 0.0
        self.etcd = Etcd()
        self.isolated: set[str] = set()
        self.members = {n: HaMember(n, Clock(cfg.uniform(-50, 50), 1 + cfg.uniform(-0.01, 0.01)), False)
                        for n in NAMES}
        self.taken: set[int] = set()
        self._cid = 0

    def local_now(self, m: HaMember) -> float:
        return m.clock.read(self.now)

    def reaches_etcd(self, m: HaMember) -> bool:
        return m.up and m.name not in self.isolated

    # -- steps ---------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        kind, *a = step
        getattr(self, f"step_{kind}")(*a)

    def step_tick(self, ms: int) -> None:
        self.now += ms / 1000
        self.etcd.expire(self.now)

    def step_manage(self, i: int) -> None:
        """One pass of member i's manager: its record, a view, ``decide``, and the action."""
        m = self.members[NAMES[i]]
        if not m.up:
            return
        now = self.local_now(m)
        reach = self.reaches_etcd(m)
        if reach:
            rec = Member(m.name, GROUP, f"{m.name}:1", f"{m.name}:2", m.seqno(), m.local.role)
            self.etcd.members[m.name] = (rec, self.now + TTL_S)
            view = self.etcd.view()
        else:
            view = View(False)
        if reach and view.leader is None and m.local.leader_gone_since is None:
            m.local = replace(m.local, leader_gone_since=now)
        elif view.leader is not None:
            m.local = replace(m.local, leader_gone_since=None)
        self.act(m, decide(view, replace(m.local, seqno=m.seqno()), now, self.timing), now)

    def act(self, m: HaMember, a, now: float) -> None:
        self.stats.note(f"action:{a.kind.value}")
        if a.kind is Kind.FENCE:
            m.local = replace(m.local, leading_term=None, renewed_sent_at=None)
            if self.reaches_etcd(m) and self.etcd.leader and self.etcd.leader[0] == m.name:
                self.etcd.leader = None  # gives the key up
        elif a.kind is Kind.CAMPAIGN and self.reaches_etcd(m):
            if self.etcd.leader is None and a.term > self.etcd.last_term:
                self.etcd.leader = (m.name, a.term, self.now + TTL_S)
                self.etcd.last_term = a.term
                m.local = replace(m.local, leading_term=a.term, renewed_sent_at=now)
                self.stats.note("elections")
        elif a.kind is Kind.PROMOTE:
            m.local = replace(m.local, role="primary", following=None)
        elif a.kind is Kind.REJOIN:
            leader = self.members[a.leader]
            if self.talk(m, leader):
                self.rejoin(m, leader, a.term)
        elif a.kind is Kind.FOLLOW:
            m.local = replace(m.local, following=a.leader)

    def talk(self, a: HaMember, b: HaMember) -> bool:
        return a.up and b.up and a.name not in self.isolated and b.name not in self.isolated

    def rejoin(self, m: HaMember, leader: HaMember, term: int) -> None:
        """fetchresync against the leader: cut back to the common prefix into the lost list."""
        common = 0
        while common < min(len(m.journal), len(leader.journal)) and m.journal[common] == leader.journal[common]:
            common += 1
        if common < len(m.journal):
            m.lost += m.journal[common:]
            del m.journal[common:]
            self.stats.note("rollbacks")
        m.local = replace(m.local, role="secondary", rejoined_term=term, following=leader.name, leading_term=None)

    def step_renew(self, i: int, late_ms: int) -> None:
        """A leader's lease renewal, sent ``late_ms`` ago, reaches etcd now."""
        m = self.members[NAMES[i]]
        lt = m.local.leading_term
        if lt is None or not self.reaches_etcd(m):
            return
        lead = self.etcd.leader
        if lead is not None and lead[0] == m.name and lead[1] == lt:
            self.etcd.leader = (m.name, lt, self.now + TTL_S)
            sent = m.clock.read(self.now - late_ms / 1000)
            m.local = replace(m.local, renewed_sent_at=max(m.local.renewed_sent_at or sent, sent))

    def step_commit(self, i: int) -> None:
        m = self.members[NAMES[i]]
        me = m.local
        if not (m.up and me.role == "primary" and me.leading_term is not None and me.renewed_sent_at is not None):
            return
        if self.local_now(m) >= fence_deadline(me.renewed_sent_at, self.timing):
            return  # the engine refuses: the lease's deadline passed
        lead = self.etcd.leader
        if lead is None or lead[0] != m.name or lead[1] != me.leading_term or self.now >= lead[2]:
            raise Violation("no-two-primaries-in-overlapping-epochs",
                            f"{m.name} took a commit in term {me.leading_term} at t={self.now:.3f} while etcd's "
                            f"leader key is {lead}")
        self._cid += 1
        m.journal.append(self._cid)
        self.taken.add(self._cid)
        self.stats.txns += 1

    def step_replicate(self, i: int) -> None:
        """A follower's receiver takes what its leader has (log shipping, asynchronous)."""
        m = self.members[NAMES[i]]
        src = self.members.get(m.local.following or "")
        if src is None or not self.talk(m, src) or m.local.role != "secondary":
            return
        if src.journal[:len(m.journal)] == m.journal:
            m.journal = list(src.journal)

    def step_crash(self, i: int) -> None:
        m = self.members[NAMES[i]]
        if m.up:
            m.up = False
            self.stats.note("crashes")

    def step_restart(self, i: int) -> None:
        m = self.members[NAMES[i]]
        if not m.up:
            m.up = True
            m.local = Local(m.name, m.local.role, m.seqno())  # a manager starts knowing nothing

    def step_partition(self, i: int) -> None:
        self.isolated.add(NAMES[i])

    def step_heal(self) -> None:
        self.isolated.clear()

    # -- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        lt = self.etcd.last_term
        if lt < getattr(self, "_last_term", 0):
            raise Violation("terms-never-go-back", f"etcd's highest term went from {self._last_term} to {lt}")
        self._last_term = lt
        held = set()
        for m in self.members.values():
            held.update(m.journal)
            held.update(m.lost)
        if not self.taken <= held:
            raise Violation("acknowledged-commits-survive", f"commit #{min(self.taken - held)} is in no journal "
                            f"and no lost list")

    def finish(self) -> None:
        """Heal and restart; managers run until one member leads and the others follow it."""
        self.step_heal()
        for i in range(3):
            self.step_restart(i)
        for k in range(SETTLE_STEPS_MAX):
            for i in range(3):
                self.step_manage(i)
                self.step_renew(i, 0)
                self.step_replicate(i)
            self.step_tick(100)
            self.check()
            lead = self.etcd.leader
            if lead and all(m.local.following == lead[0] or m.name == lead[0] for m in self.members.values()) \
                    and self.members[lead[0]].local.role == "primary":
                return
        raise Violation("a-leader-is-elected", f"no settled leader after healing (etcd leader {self.etcd.leader})")


def generate(seed: int, n: int) -> list[Step]:
    r = rng_for(seed, "steps")
    weights = [("manage", 30), ("renew", 12), ("commit", 20), ("replicate", 10), ("tick", 20), ("crash", 1),
               ("restart", 3), ("partition", 1), ("heal", 3)]
    kinds = [k for k, w in weights for _ in range(w)]
    steps: list[Step] = []
    for _ in range(n):
        k = r.choice(kinds)
        if k == "renew":
            steps.append(("renew", r.randrange(3), r.choice((0, 0, 50, 400, 1200))))
        elif k == "tick":
            steps.append(("tick", r.choice((50, 200, 600))))
        elif k == "heal":
            steps.append(("heal",))
        else:
            steps.append((k, r.randrange(3)))
    return steps


class HaDecisions:
    name = "ha"

    def generate(self, seed: int, n: int) -> list[Step]:
        return generate(seed, n)

    def replay(self, seed: int, steps: list[Step]) -> Stats:
        return drive(HaWorld(seed), steps)
