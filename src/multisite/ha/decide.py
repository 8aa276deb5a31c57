"""The HA manager's decisions for one member of a log-shipping cluster, without I/O.

How it works. Every member of a cluster (one LMS group) runs a manager beside its instance server.
The managers share three things through etcd, under ``/multisite/ha/<cluster>/``:

- ``group``: the LMS group the cluster replicates (written once; a member of another group is refused);
- ``members/<name>``: each member's record (addresses, role, seqno), under the member's own lease, so a
  member that stops renewing disappears;
- ``leader``: the name of the primary and its term, under the primary's lease of ``ttl_s``.

The manager reads that view and its own instance's state, and ``decide`` says what to do. The rules:

1. **Fencing first.** A leader renews its lease every ``ttl_s / 3``. The lease cannot expire before
   ``ttl_s`` after the last renewal *sent* (etcd restarts the TTL when it receives the renewal, later
   than it was sent), so a primary that stops taking commits at ``sent + ttl_s - margin_s`` has stopped
   before anyone else can hold the key: two primaries never accept commits at the same time. The
   instance server checks that deadline on its commit path too (``fence_deadline``), so a manager that
   is stalled cannot leave its primary open.
2. **One candidate.** When the leader key is gone, every member that sees etcd computes the same
   candidate from the same member records: the most advanced secondary by seqno (the seed's rule for
   failover), ties broken by the lower name. Only that member campaigns, and the key is taken by an
   etcd transaction that succeeds only if the key does not exist, so at most one wins even when views
   differ.
3. **Followers follow.** A member that is not the leader is a secondary replicating from the leader.
   If it was ahead of the new leader (an old primary returning, or a secondary that had more than the
   one promoted), it rolls back with fetchresync against the leader, into its lost-transaction file,
   and rejoins (seed 001's procedure).

``decide`` is a pure function of a ``View`` (what etcd showed), a ``Local`` (the instance's own state)
and the time; the manager (``server/``) does what it returns and feeds the results back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

LEADER_KEY = "leader"
MEMBERS_PREFIX = "members/"
GROUP_KEY = "group"
SWITCHOVER_KEY = "switchover"  # a planned handover: the name of the member to hand the leader key to
FENCE_MARGIN_FRACTION = 0.25  # of the lease: stop taking commits this long before the lease can end
RENEW_FRACTION = 1 / 3  # renew the leader lease this often (of ttl_s)
SETTLE_S_DEFAULT = 0.3  # after the leader key goes: wait for every member's fresh seqno before choosing


def cluster_prefix(cluster: str) -> str:
    """The etcd prefix of one cluster's keys."""
    return f"/multisite/ha/{cluster}/"


@dataclass(frozen=True, order=True)
class Member:
    """A member's record in etcd: where to reach it and how far its journal is."""

    name: str
    group: str = ""
    client: str = ""  # HOST:PORT of its client port
    replication: str = ""  # HOST:PORT its Receiver Server listens on
    seqno: int = 0
    role: str = "secondary"
    confirmed: bool = False  # unused: see ``links``
    # as the primary sees its secondaries: (name, lag_s, backlog, counts for --min-confirm), by name
    links: tuple[tuple[str, float, int, bool], ...] = ()
    lease_left_s: float | None = None  # as leader: how long it may still commit, as of this record


@dataclass(frozen=True)
class Leader:
    """Who holds the leader key: its name, the term it took it in, the key's etcd revision."""

    name: str
    term: int
    revision: int = 0


@dataclass(frozen=True)
class View:
    """What the manager read from etcd in one pass; ``reachable`` False when no etcd member answered."""

    reachable: bool
    leader: Leader | None = None
    members: tuple[Member, ...] = ()
    last_term: int = 0  # the highest term ever written (terms never go back)
    handover: str | None = None  # ``ha switchover --to``: the member the leader hands over to


@dataclass(frozen=True)
class Local:
    """The member's own state: its name, role and seqno, and, while it leads, its lease's renewals."""

    name: str
    role: str  # "primary" | "secondary"
    seqno: int
    leading_term: int | None = None  # the term this member leads in, or None
    renewed_sent_at: float | None = None  # monotonic time the last successful renewal was sent
    following: str | None = None  # the leader whose source this member's receiver takes
    rejoined_term: int | None = None  # the term whose leader this member has checked its history against
    leader_gone_since: float | None = None  # when this member first saw no leader key (for the settle wait)


class Kind(StrEnum):
    FENCE = "fence"  # stop taking commits now (refuse with NOT_PRIMARY) and give up the key
    CAMPAIGN = "campaign"  # try to take the leader key for ``term``, if it does not exist
    PROMOTE = "promote"  # this member holds the key: become primary, start sources to ``targets``
    SOURCES = "sources"  # as leader: start sources to members that have none (``targets``)
    REJOIN = "rejoin"  # roll back with fetchresync against ``leader`` (client address), then follow it
    FOLLOW = "follow"  # run a receiver for ``leader``'s sources (nothing to roll back)
    HANDOVER = "handover"  # as leader, switchover: stop commits, drain to ``leader`` (the target), give up the key
    WAIT = "wait"  # nothing to do yet (``reason``)


@dataclass(frozen=True)
class Action:
    kind: Kind
    term: int = 0
    leader: str = ""  # a member's name
    targets: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Timing:
    """The lease and how the manager paces itself around it (seconds)."""

    ttl_s: float
    settle_s: float = SETTLE_S_DEFAULT
    margin_s: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s!r}")
        if self.margin_s < 0:
            object.__setattr__(self, "margin_s", self.ttl_s * FENCE_MARGIN_FRACTION)

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s * RENEW_FRACTION


def fence_deadline(renewed_sent_at: float, timing: Timing) -> float:
    """The monotonic time after which a leader must not take commits: before its lease can expire."""
    return renewed_sent_at + timing.ttl_s - timing.margin_s


def candidate(members: tuple[Member, ...] | list[Member], group: str | None = None) -> Member | None:
    """The member to promote: the most advanced by seqno, ties to the lower name (every member computes
    the same from the same records). Members of another group never count."""
    eligible = [m for m in members if group is None or m.group == group]
    if not eligible:
        return None
    return min(eligible, key=lambda m: (-m.seqno, m.name))


def lacking(members: tuple[Member, ...] | list[Member], name: str) -> dict[str, int]:
    """For a failover preview: the seqnos each other member has that ``name`` lacks (``seqno - its``):
    what would go to lost files if ``name`` were promoted now."""
    me = next((m for m in members if m.name == name), None)
    if me is None:
        raise KeyError(name)
    return {m.name: m.seqno - me.seqno for m in members if m.name != name and m.seqno > me.seqno}


def decide(view: View, me: Local, now: float, timing: Timing) -> Action:
    """What this member does next (see the module's docstring for the rules)."""
    if me.leading_term is not None:
        return _as_leader(view, me, now, timing)
    if not view.reachable:
        return Action(Kind.WAIT, reason="etcd unreachable: no promotion without a majority")
    if view.leader is None:
        return _leaderless(view, me, now, timing)
    if view.leader.name == me.name:
        # The key names this member but it does not lead: a former lease of its own, not yet expired
        # (it restarted). Wait for the key to go; it is never taken over blindly.
        return Action(Kind.WAIT, reason="the leader key names this member from before a restart")
    return _as_follower(view, me)


def _as_leader(view: View, me: Local, now: float, timing: Timing) -> Action:
    """A leader keeps leading while its lease is renewed in time and the key is still its own."""
    assert me.leading_term is not None
    if me.renewed_sent_at is None or now >= fence_deadline(me.renewed_sent_at, timing):
        return Action(Kind.FENCE, term=me.leading_term, reason="the leader lease was not renewed in time")
    if view.reachable and (view.leader is None or view.leader.name != me.name
                           or view.leader.term != me.leading_term):
        return Action(Kind.FENCE, term=me.leading_term, reason="the leader key is gone or another member's")
    if me.role != "primary":
        return Action(Kind.PROMOTE, term=me.leading_term, targets=_others(view, me.name))
    if view.reachable and view.handover and view.handover != me.name and _member(view, view.handover):
        return Action(Kind.HANDOVER, term=me.leading_term, leader=view.handover, reason="switchover")
    missing = tuple(m.name for m in view.members if m.name != me.name and m.role != "primary"
                    and m.replication) if view.reachable else ()
    return Action(Kind.SOURCES, term=me.leading_term, targets=missing)


def _leaderless(view: View, me: Local, now: float, timing: Timing) -> Action:
    """No leader key: after the settle wait, the one candidate campaigns; the others wait."""
    if me.leader_gone_since is None or now - me.leader_gone_since < timing.settle_s:
        return Action(Kind.WAIT, reason="leader gone: waiting for every member's seqno")
    group = next((m.group for m in view.members if m.name == me.name), None)
    best = candidate(view.members, group)
    target = _member(view, view.handover) if view.handover else None
    if target is not None and best is not None and target.seqno >= best.seqno and target.group == best.group:
        best = target  # a switchover's target, once it has everything
    if best is None or best.name != me.name:
        return Action(Kind.WAIT, reason=f"leader gone: {best.name if best else 'nobody'} is the candidate")
    return Action(Kind.CAMPAIGN, term=view.last_term + 1, targets=_others(view, me.name))


def _as_follower(view: View, me: Local) -> Action:
    """Another member leads: check this member's history against it once per term, then follow it."""
    assert view.leader is not None
    leader = view.leader
    if me.rejoined_term != leader.term or me.role == "primary":
        return Action(Kind.REJOIN, term=leader.term, leader=leader.name)
    if me.following != leader.name:
        return Action(Kind.FOLLOW, term=leader.term, leader=leader.name)
    return Action(Kind.WAIT, term=leader.term, leader=leader.name, reason="following")


def _member(view: View, name: str) -> Member | None:
    return next((m for m in view.members if m.name == name), None)


def _others(view: View, name: str) -> tuple[str, ...]:
    return tuple(sorted(m.name for m in view.members if m.name != name))
