"""The grid's keys in etcd and the decisions made on them, sans-IO (issue 24: no single point of failure).

With ``--etcd`` the catalogs and containers of a grid coordinate through etcd instead of through one
catalog process: any number of catalogs run, one leads, and a primary takes commits on the strength
of its container's own lease in etcd, not of a catalog's answers. The keys, under
``/multisite/grid/<grid>/`` (``grid_prefix``):

==================  ==========================================  ========================================
key                 written by                                  holds
==================  ==========================================  ========================================
``leader``          the leading catalog, under its lease; only  ``{"name", "address"}``
                    created when absent
``catalogs/<n>``    each catalog, under its lease               ``{"address"}``
``containers/<n>``  each container, under its lease             its registration (``ContainerRecord``)
``reports/<n>``     each container, under its lease             applied placement version, seqnos, loaders
``state``           the leader, by a transaction (``Leader``)   placement, members, policy, shortfalls,
                                                                the currency revisions it folded in
``epochs/<p>``      the leader, in the same transaction         ``"<epoch> <primary>"`` of partition p
``currency/<p>``    p's primary, by a transaction on            ``{"epoch", "primary", "current"}``
                    ``epochs/<p>`` (``currency_write``)
==================  ==========================================  ========================================

The rules that keep two primaries of a partition from taking commits at once (the argument is in
``DESIGN.md``):

1. A container's primaries take commits only while its lease is renewed in time (``may_commit``: the
   deadline falls before the lease can end, as in ``ha/decide.py``), and only once the container has
   applied a ``state`` read after its registration: a container whose lease ended and that registered
   again cannot go on in an epoch the leader has moved on from.
2. A container is lost only when its ``containers/<n>`` key is gone (its lease ended), and a state that
   says so is written only if that key is still absent: a container that came back in between is not
   promoted over.
3. The leader writes ``state`` only while the ``leader`` key is the one it created, on the ``state``
   revision it read, and, for every partition whose primary or epoch the write changes, on the
   ``currency/<p>`` revision it folded in: a currency report made meanwhile fails the write.
4. A primary's currency report is written only if ``epochs/<p>`` still names it at its epoch; a
   failed condition means it was deposed (its batch's outcome is unknown, as with the catalog's
   ``HeartbeatAck.stale``).

``GridKeys`` is the mirror of the prefix every process keeps (a read, then a watch); ``Leader`` feeds it
to a ``Catalog`` (``reconcile``) and says what to write (``Write``: conditions and puts, carried out by
``server/`` as one etcd transaction).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import ConfigError
from ..ha.decide import Timing, fence_deadline
from .catalog import Catalog
from .policy import GridPolicy, policy_from_dict
from .wire import GRID_WIRE_VERSION, Register

GRID_PREFIX = "/multisite/grid/"
LEADER = "leader"
STATE = "state"
CATALOGS = "catalogs/"
CONTAINERS = "containers/"
REPORTS = "reports/"
EPOCHS = "epochs/"
CURRENCY = "currency/"
LEASE_TTL_S_DEFAULT = 1.0  # a container's (and a catalog's) lease: failover in about 1.5 s
RENEW_FRACTION = 1 / 5  # renew a lease this often (of its TTL): one lost renewal does not fence
REPORT_INTERVAL_S = 0.25  # a container looks at its report this often; a new applied version goes out then
SEQNO_REPORT_INTERVAL_S = 1.0  # seqnos alone (status only: every write is a Raft round and a watch event)
STATE_FORMAT = 1


def grid_prefix(grid: str) -> str:
    """Where one grid's keys live in etcd."""
    return f"{GRID_PREFIX}{grid}/"


def renew_every_s(ttl_s: float) -> float:
    return ttl_s * RENEW_FRACTION


def commit_deadline(renewal_sent_at: float, ttl_s: float) -> float:
    """Until when a container whose lease was last renewed by a request sent at ``renewal_sent_at``
    may take commits: a quarter of the TTL before the lease can end (etcd restarts the TTL when it
    receives the renewal, after it was sent)."""
    return fence_deadline(renewal_sent_at, Timing(ttl_s=ttl_s))


def may_commit(now: float, deadline: float, registered_revision: int, applied_revision: int) -> bool:
    """Rule 1: the lease holds, and the state applied was read after this registration."""
    return registered_revision > 0 and applied_revision >= registered_revision and now < deadline


# -- what a transaction is made of ---------------------------------------------------------------------
@dataclass(frozen=True)
class Cond:
    """One condition of a write: ``target`` CREATE, MOD or VALUE of ``key`` equals ``value``."""

    key: str
    target: str
    value: int | bytes


def absent(key: str) -> Cond:
    return Cond(key, "CREATE", 0)


def created_at(key: str, revision: int) -> Cond:
    return Cond(key, "CREATE", revision)


def modified_at(key: str, revision: int) -> Cond:
    """The key is as read at ``revision`` (0: absent)."""
    return Cond(key, "MOD", revision) if revision else absent(key)


def value_is(key: str, value: str) -> Cond:
    return Cond(key, "VALUE", value.encode())


@dataclass(frozen=True)
class Write:
    """One etcd transaction: if every condition holds, every put (full keys; values as text)."""

    conds: tuple[Cond, ...]
    puts: tuple[tuple[str, str], ...]
    why: str = ""


def canonical(value: Any) -> str:
    """The one text form of a JSON value in etcd (two equal values are equal texts)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def epoch_value(epoch: int, primary: str | None) -> str:
    return f"{epoch} {primary or ''}"


# -- the mirror -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One key as the mirror holds it; ``seen_at``: the caller's clock when the mirror saw it change."""

    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0
    seen_at: float = 0.0


@dataclass(frozen=True)
class ContainerRecord:
    """A container's registration: what ``Register`` carries, and ``dir_id`` (its DIR's identity: a
    container restarted on the same DIR replaces its own record instead of waiting for its lease)."""

    name: str
    zone: str | None
    address: str
    capacity: int
    grid: str
    dir_id: str = ""
    version: int = GRID_WIRE_VERSION
    create_revision: int = 0

    def to_json(self) -> str:
        return canonical({"version": self.version, "grid": self.grid, "zone": self.zone, "address": self.address,
                          "capacity": self.capacity, "dir_id": self.dir_id})

    def register(self) -> Register:
        return Register(self.version, self.grid, self.name, self.zone, self.address, self.capacity)


@dataclass(frozen=True)
class Currency:
    """A primary's last currency report for one partition."""

    epoch: int
    primary: str
    current: tuple[str, ...]
    mod_revision: int


class GridKeys:
    """Every key under one grid's prefix, as etcd last showed them (``load`` a read, ``put``/``delete``
    each watch event, in order); ``revision`` is the newest revision seen. ``changes`` counts the
    changes of the keys: what a view built from them is cached by. The revision cannot be: a leading
    catalog puts its own writes here at once, ahead of events of lower revisions still on their way
    (a container's report), which then change the keys without moving the revision."""

    def __init__(self, grid: str) -> None:
        self.grid, self.prefix = grid, grid_prefix(grid)
        self.kvs: dict[str, Entry] = {}
        self.revision = 0
        self.loaded_revision = 0  # of the last full read: events up to it are in it already
        self.changes = 0
        self._deleted: dict[str, int] = {}  # rel -> revision of a delete newer than the last full read

    def key(self, rel: str) -> str:
        return self.prefix + rel

    def load(self, kvs: Iterable[tuple[str, bytes, int, int, int]], revision: int, now: float) -> None:
        """A full read: ``(key, value, create_revision, mod_revision, lease)`` per key, at ``revision``.

        The read runs beside the watch (and a leader's own writes): it may have been answered before
        events already applied here. What changed after ``revision`` stays as those events left it (a
        key written since keeps its newer entry, a key deleted since stays deleted); the rest is as read."""
        old = self.kvs
        self.kvs = {}
        for key, value, create, mod, lease in kvs:
            rel = key[len(self.prefix):]
            was = old.get(rel)
            if self._deleted.get(rel, 0) > revision or (was is not None and was.mod_revision > mod):
                continue  # deleted or written again after the read was answered
            seen = was.seen_at if was is not None and was.mod_revision == mod else now
            self.kvs[rel] = Entry(value, create, mod, lease, seen)
        for rel, was in old.items():
            if rel not in self.kvs and was.mod_revision > revision and self._deleted.get(rel, 0) < was.mod_revision:
                self.kvs[rel] = was  # written after the read was answered
        self.revision = max(self.revision, revision)
        self.loaded_revision = max(self.loaded_revision, revision)
        self._deleted = {rel: r for rel, r in self._deleted.items() if r > self.loaded_revision}
        if self.kvs != old:  # a read every second: most find nothing new
            self.changes += 1

    def put(self, key: str, value: bytes, create_revision: int, mod_revision: int, lease: int, now: float) -> None:
        rel = key[len(self.prefix):]
        old = self.kvs.get(rel)
        if mod_revision <= self.loaded_revision or (old is not None and old.mod_revision >= mod_revision):
            return  # already seen: in a later full read, or our own write applied before its event came
        self.kvs[rel] = Entry(value, create_revision, mod_revision, lease, now)
        self.revision = max(self.revision, mod_revision)
        self.changes += 1

    def delete(self, key: str, revision: int) -> None:
        rel = key[len(self.prefix):]
        old = self.kvs.get(rel)
        if revision > self.loaded_revision:
            self._deleted[rel] = max(self._deleted.get(rel, 0), revision)
        if revision > self.loaded_revision and old is not None and old.mod_revision < revision:
            del self.kvs[rel]
            self.changes += 1
        self.revision = max(self.revision, revision)

    # -- reading it -------------------------------------------------------------------------------------
    def _json(self, rel: str) -> Any:
        e = self.kvs.get(rel)
        if e is None:
            return None
        try:
            return json.loads(e.value)
        except ValueError:
            return None

    def leader(self) -> dict | None:
        """``{"name", "address", "create_revision"}`` of the leading catalog, or None."""
        d, e = self._json(LEADER), self.kvs.get(LEADER)
        if not isinstance(d, dict) or e is None:
            return None
        return {"name": d.get("name", "?"), "address": d.get("address", ""), "create_revision": e.create_revision}

    def catalogs(self) -> dict[str, dict]:
        out = {}
        for rel in self.kvs:
            if rel.startswith(CATALOGS):
                d = self._json(rel)
                out[rel[len(CATALOGS):]] = d if isinstance(d, dict) else {}
        return out

    def state(self) -> tuple[dict | None, int]:
        """The leader's last state and its revision (``None, 0`` before the first)."""
        d, e = self._json(STATE), self.kvs.get(STATE)
        if not isinstance(d, dict) or e is None:
            return None, 0
        return d, e.mod_revision

    def containers(self) -> dict[str, ContainerRecord]:
        out = {}
        for rel, e in self.kvs.items():
            if not rel.startswith(CONTAINERS):
                continue
            name, d = rel[len(CONTAINERS):], self._json(rel)
            try:
                out[name] = ContainerRecord(name, d.get("zone"), str(d["address"]), int(d["capacity"]),
                                            str(d.get("grid", "")), str(d.get("dir_id", "")),
                                            int(d.get("version", 0)), e.create_revision)
            except (AttributeError, KeyError, TypeError, ValueError):
                continue  # not a record this version reads: not a member
        return out

    def reports(self) -> dict[str, tuple[dict, float]]:
        out = {}
        for rel, e in self.kvs.items():
            if rel.startswith(REPORTS):
                d = self._json(rel)
                if isinstance(d, dict):
                    out[rel[len(REPORTS):]] = (d, e.seen_at)
        return out

    def currency(self) -> dict[int, Currency]:
        out = {}
        for rel, e in self.kvs.items():
            if not rel.startswith(CURRENCY):
                continue
            d = self._json(rel)
            try:
                out[int(rel[len(CURRENCY):])] = Currency(int(d["epoch"]), str(d["primary"]),
                                                         tuple(d["current"]), e.mod_revision)
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def currency_revision(self, partition: int) -> int:
        e = self.kvs.get(f"{CURRENCY}{partition}")
        return e.mod_revision if e is not None else 0

    def mirror(self, now: float) -> Catalog | None:
        """What the leader decided, as a ``Catalog`` that plans nothing (status, routes, assignments);
        None before the first state. The containers' reports fill in seqnos and loaders."""
        state, _ = self.state()
        if state is None:
            return None
        cat = Catalog(policy_from_dict(state["policy"], "etcd"), now=now, state=state, mirror=True)
        feed_reports(cat, self, now)
        return cat


def feed_reports(cat: Catalog, keys: GridKeys, now: float) -> None:
    """Each live container's report is its heartbeat (the lease in etcd is its liveness: heard now)."""
    live = keys.containers()
    for name, (rep, _) in keys.reports().items():
        if name in live:
            cat.report(name, now, int(rep.get("applied_version", -1)),
                       {int(p): int(s) for p, s in (rep.get("seqnos") or {}).items()},
                       {int(p): r for p, r in (rep.get("loaders") or {}).items()})


# -- the leader's decisions -----------------------------------------------------------------------------
def state_value(cat: Catalog, folded: Mapping[int, int]) -> dict:
    """What the leader writes to ``state``: the catalog's state file content, the policy (followers and
    containers read it), the last plan's shortfalls (for status) and the currency revisions folded in."""
    d = cat.state_dict()
    d["policy"] = cat.policy.to_dict()
    d["shortfalls"] = [s.to_dict() for s in cat.last_plan.shortfalls]
    d["ignored"] = [[c, w] for c, w in cat.last_plan.ignored]
    d["folded"] = {str(p): r for p, r in sorted(folded.items())}
    return d


class Leader:
    """The leading catalog's decisions: its ``Catalog``, fed with what etcd holds, and the ``Write`` that
    records each change. ``leader_revision`` is the create revision of the ``leader`` key it holds.

    Built anew from the mirror whenever it takes the lead or a write of it fails (someone else wrote,
    a currency report or a registration came in between): it never decides on a state etcd no longer has.
    """

    def __init__(self, policy: GridPolicy, keys: GridKeys, leader_revision: int, now: float) -> None:
        state, _ = keys.state()
        if state is not None:
            check_state(state, policy)
        self.keys, self.leader_revision = keys, leader_revision
        self.cat = Catalog(policy, now=now, state=state)
        self.folded: dict[int, int] = {int(p): int(r) for p, r in ((state or {}).get("folded") or {}).items()}

    def step(self, now: float) -> Write | None:
        """Feed the mirror into the catalog; the write that records what changed, or None."""
        reconcile(self.cat, self.keys, now, self.folded)
        return state_write(self.keys, state_value(self.cat, self.folded), self.leader_revision)

    def drain_log(self) -> list[str]:
        return self.cat.drain_log()


def check_state(state: Mapping[str, Any], policy: GridPolicy) -> None:
    """A leader whose grid.toml cannot take over this state refuses (as the catalog's state file does)."""
    if state.get("grid") != policy.name or state.get("partitions") != policy.partitions:
        raise ConfigError(f"etcd holds grid {state.get('grid')!r} with {state.get('partitions')} partitions; this "
                          f"catalog's policy says grid {policy.name!r} with {policy.partitions}: a grid's partition "
                          f"count is fixed for its life, and every catalog of a grid reads the same grid.toml")


def reconcile(cat: Catalog, keys: GridKeys, now: float, folded: dict[int, int]) -> None:
    """Make the leader's catalog agree with etcd: each currency report newer than the one folded in is
    the primary's word, a container key is a member up (registered, or registered again with new
    details), a member up without one is lost (rule 2), each report is its heartbeat.

    Currency comes first: a primary that narrowed its current set and then lost its lease may have
    acknowledged commits its dropped replica lacks, so the promotion its loss brings must see that."""
    for p, cur in sorted(keys.currency().items()):
        if cur.mod_revision > folded.get(p, 0):
            folded[p] = cur.mod_revision
            cat.currency(cur.primary, {p: (cur.epoch, list(cur.current))})
    recs = keys.containers()
    for name in sorted(recs):
        rec, m = recs[name], cat.members.get(name)
        if m is None or not m.up or (m.zone, m.address, m.capacity) != (rec.zone, rec.address, rec.capacity):
            refused = cat.register(rec.register(), now, old_connected=False)
            if refused is not None:
                cat.note(f"container {name} in etcd is not taken: {refused.code}: {refused.message}")
    for name in sorted(cat.members):
        if cat.members[name].up and name not in recs:
            cat.lost(name, now, "its lease in etcd ended")
    feed_reports(cat, keys, now)


def state_write(keys: GridKeys, value: dict, leader_revision: int) -> Write | None:
    """The transaction recording ``value`` (rule 3), or None when etcd holds it already."""
    old, old_revision = keys.state()
    text = canonical(value)
    if old is not None and canonical(old) == text:
        return None
    conds = [created_at(keys.key(LEADER), leader_revision), modified_at(keys.key(STATE), old_revision)]
    puts = [(keys.key(STATE), text)]
    was_up = {m["name"]: m.get("up", False) for m in (old or {}).get("members", [])}
    recs = keys.containers()
    for m in value["members"]:
        if was_up.get(m["name"]) and not m["up"]:  # lost now: only if it did not come back meanwhile
            conds.append(absent(keys.key(CONTAINERS + m["name"])))
        elif m["up"] and not was_up.get(m["name"]) and m["name"] in recs:  # joined: that registration
            conds.append(created_at(keys.key(CONTAINERS + m["name"]), recs[m["name"]].create_revision))
    old_parts = (old or {}).get("placement", {}).get("partitions", [])
    for p, s in enumerate(value["placement"]["partitions"]):
        o = old_parts[p] if p < len(old_parts) else None
        if o is None or (o["epoch"], o["primary"]) != (s["epoch"], s["primary"]):
            conds.append(modified_at(keys.key(f"{CURRENCY}{p}"), keys.currency_revision(p)))
            puts.append((keys.key(f"{EPOCHS}{p}"), epoch_value(s["epoch"], s["primary"])))
    return Write(tuple(conds), tuple(puts), f"placement version {value['placement']['version']}")


# -- a container's writes -------------------------------------------------------------------------------
def registration_write(keys_prefix: str, record: ContainerRecord, existing: Entry | None,
                       lease: int) -> Write | str:
    """Put ``record`` under ``lease``: if no container holds the name, or if the holder is this very
    container (same DIR) from before a restart, whose lease has not ended yet. Otherwise the reason it
    is refused (another container of that name is up)."""
    key = keys_prefix + CONTAINERS + record.name
    if existing is None:
        return Write((absent(key),), ((key, record.to_json()),), "register")
    try:
        other = json.loads(existing.value)
    except ValueError:
        other = {}
    if other.get("dir_id") and other.get("dir_id") == record.dir_id:
        return Write((modified_at(key, existing.mod_revision),), ((key, record.to_json()),), "register again")
    return (f"a container named {record.name!r} at {other.get('address', '?')} is up (its lease in etcd holds); "
            f"this one is at {record.address}: give it another --name, or stop the other")


def currency_write(keys_prefix: str, partition: int, epoch: int, primary: str, current: Iterable[str],
                   known_revision: int) -> Write:
    """Rule 4: a primary's report of the synchronous replicas it counts current, written only while
    ``epochs/<p>`` names it at ``epoch``, on the report revision it knows (a report whose outcome was
    unknown, applied late, cannot overwrite a newer one)."""
    rel = f"{CURRENCY}{partition}"
    value = canonical({"epoch": epoch, "primary": primary, "current": sorted(current)})
    return Write((value_is(keys_prefix + f"{EPOCHS}{partition}", epoch_value(epoch, primary)),
                  modified_at(keys_prefix + rel, known_revision)),
                 ((keys_prefix + rel, value),), f"currency of partition {partition}")


def deposed(epoch_key_value: bytes | None, epoch: int, primary: str) -> bool:
    """After a failed currency write: whether ``epochs/<p>`` no longer names this primary at its epoch."""
    return (epoch_key_value or b"").decode(errors="replace") != epoch_value(epoch, primary)


def report_value(applied_version: int, seqnos: Mapping[int, int], loaders: Mapping[int, dict]) -> str:
    return canonical({"applied_version": applied_version, "seqnos": {str(p): s for p, s in seqnos.items()},
                      "loaders": {str(p): r for p, r in loaders.items()}})
