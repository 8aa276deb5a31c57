"""The grid's coordination through etcd, sans-IO (grid/coordination.py): the mirror of the keys, the
leader's decisions and the conditions of its writes, a container's registration and currency reports,
and the commit deadline. An in-memory etcd (revisions, create/mod revisions, conditions) runs the
writes, so the races the conditions exist for are played out here, step by step."""

from __future__ import annotations

import json

import pytest

from multisite.errors import ConfigError
from multisite.grid.coordination import (CONTAINERS, CURRENCY, EPOCHS, LEADER, STATE, ContainerRecord, Entry,
                                         GridKeys, Leader, commit_deadline, currency_write, deposed, epoch_value,
                                         may_commit, registration_write, report_value)
from multisite.grid.policy import GridPolicy, MapPolicy

POLICY = GridPolicy("orders", 4, min_sync=1, max_sync=1, max_async=1, maps=(MapPolicy("m"),))


class FakeEtcd:
    """Keys with create and mod revisions, one revision per write, and the conditions of a transaction."""

    def __init__(self) -> None:
        self.kv: dict[str, tuple[bytes, int, int, int]] = {}  # key -> value, create, mod, lease
        self.revision = 1
        self.leases: dict[int, set[str]] = {}

    def put(self, key: str, value: str, lease: int = 0) -> int:
        self.revision += 1
        old = self.kv.get(key)
        self.kv[key] = (value.encode(), old[1] if old else self.revision, self.revision, lease)
        if lease:
            self.leases.setdefault(lease, set()).add(key)
        return self.revision

    def end_lease(self, lease: int) -> None:
        self.revision += 1
        for k in self.leases.pop(lease, ()):
            if self.kv.get(k, (0, 0, 0, 0))[3] == lease:
                del self.kv[k]

    def holds(self, c) -> bool:
        got = self.kv.get(c.key)
        if c.target == "CREATE":
            return (got[1] if got else 0) == c.value
        if c.target == "MOD":
            return (got[2] if got else 0) == c.value
        return got is not None and got[0] == c.value

    def txn(self, w, lease: int = 0) -> tuple[bool, int]:
        if not all(self.holds(c) for c in w.conds):
            return False, self.revision
        self.revision += 1
        for k, v in w.puts:
            old = self.kv.get(k)
            self.kv[k] = (v.encode(), old[1] if old else self.revision, self.revision, lease)
            if lease:
                self.leases.setdefault(lease, set()).add(k)
        return True, self.revision

    def read(self, keys: GridKeys, now: float = 0.0) -> GridKeys:
        keys.load([(k, v, c, m, le) for k, (v, c, m, le) in self.kv.items() if k.startswith(keys.prefix)],
                  self.revision, now)
        return keys

    def get(self, key: str) -> bytes | None:
        got = self.kv.get(key)
        return got[0] if got else None


class Grid:
    """A fake etcd, a leader catalog and containers registering under leases of their own."""

    def __init__(self) -> None:
        self.etcd = FakeEtcd()
        self.keys = GridKeys("orders")
        self.leases: dict[str, int] = {}
        self.etcd.put(self.keys.key(LEADER), json.dumps({"name": "cat1", "address": "a:1"}), lease=1)
        self.leader_rev = self.etcd.kv[self.keys.key(LEADER)][1]
        self.leader = Leader(POLICY, self.etcd.read(self.keys), self.leader_rev, 0.0)

    def join(self, name: str) -> None:
        lease = 100 + len(self.leases)
        self.leases[name] = lease
        rec = ContainerRecord(name, None, f"{name}:1", 1024, "orders", dir_id=name)
        w = registration_write(self.keys.prefix, rec, None, lease)
        assert self.etcd.txn(w, lease)[0]

    def decide(self, now: float = 1.0) -> bool | None:
        """One pass of the leader on a fresh read: True written, False refused by etcd, None nothing to write."""
        self.etcd.read(self.keys, now)
        w = self.leader.step(now)
        if w is None:
            return None
        ok, _ = self.etcd.txn(w)
        return ok

    def settle(self) -> None:
        for _ in range(20):
            if self.decide() is None:
                return
        raise AssertionError("the leader never settles")

    def state(self) -> dict:
        return json.loads(self.etcd.get(self.keys.key(STATE)))

    def report_all_current(self) -> None:
        """Every primary reports its synchronous replicas current (through its currency write)."""
        for p, s in enumerate(self.state()["placement"]["partitions"]):
            known = self.etcd.kv.get(self.keys.key(f"{CURRENCY}{p}"), (0, 0, 0, 0))[2]
            w = currency_write(self.keys.prefix, p, s["epoch"], s["primary"], s["sync"], known)
            assert self.etcd.txn(w)[0]


def placed() -> Grid:
    g = Grid()
    for n in ("c1", "c2", "c3"):
        g.join(n)
    g.settle()
    g.report_all_current()
    g.settle()
    return g


# -- the mirror -------------------------------------------------------------------------------------

def test_the_mirror_applies_events_in_order_and_ignores_what_a_later_read_already_holds():
    keys = GridKeys("orders")
    k = keys.key("containers/c1")
    keys.load([(k, b'{"address":"x:1","capacity":1}', 5, 5, 9)], 10, now=1.0)
    keys.put(k, b"older", 5, 4, 9, now=2.0)  # an event older than the read: ignored
    keys.delete(k, 8)  # a delete before the read: ignored too (the read has the key)
    assert keys.containers()["c1"].address == "x:1"
    keys.put(k, b'{"address":"x:2","capacity":1}', 5, 11, 9, now=3.0)
    assert keys.containers()["c1"].address == "x:2" and keys.revision == 11
    keys.delete(k, 12)
    assert keys.containers() == {} and keys.revision == 12



def test_a_full_read_answered_before_events_already_applied_takes_none_of_them_back():
    """The mirror's read every second runs beside its watch: a read answered at revision 53 may be
    loaded after the watch brought 54 to 56. Loading it whole took them back for a second, and a
    catalog's status cached meanwhile kept a container at placement version 12 of 13 (reproduced
    under load: the settled-grid wait timed out while etcd held the container's new report)."""
    keys = GridKeys("orders")
    rep, gone, new = keys.key("reports/c3"), keys.key("reports/c9"), keys.key("reports/c4")
    read_at_53 = [(rep, b'{"applied_version": 12}', 51, 51, 7), (gone, b"{}", 40, 40, 7)]
    keys.load(read_at_53, 53, now=1.0)
    keys.put(rep, b'{"applied_version": 13}', 51, 54, 7, now=2.0)
    keys.delete(gone, 55)
    keys.put(new, b'{"applied_version": 13}', 56, 56, 8, now=2.0)
    assert keys.revision == 56
    changes = keys.changes
    keys.load(read_at_53, 53, now=3.0)  # answered before 54, loaded after 56
    assert keys.kvs["reports/c3"].value == b'{"applied_version": 13}' and keys.kvs["reports/c3"].mod_revision == 54
    assert "reports/c9" not in keys.kvs and keys.kvs["reports/c4"].mod_revision == 56
    assert keys.changes == changes and keys.revision == 56
    keys.load([(rep, b'{"applied_version": 13}', 51, 54, 7), (new, b'{"applied_version": 13}', 56, 56, 8)], 56,
              now=4.0)  # the next read agrees: nothing changes
    assert keys.changes == changes and set(keys.kvs) == {"reports/c3", "reports/c4"}
    keys.load([(gone, b"{}", 57, 57, 9)], 57, now=5.0)  # a read newer than every event is the whole truth
    assert set(keys.kvs) == {"reports/c9"} and keys.changes == changes + 1

def test_records_this_version_cannot_read_are_not_members():
    keys = GridKeys("orders")
    keys.load([(keys.key("containers/bad"), b"not json", 2, 2, 0),
               (keys.key("containers/odd"), b'{"address": "a:1"}', 3, 3, 0),
               (keys.key("currency/x"), b'{"epoch": 1}', 4, 4, 0)], 4, now=0.0)
    assert keys.containers() == {} and keys.currency() == {}


# -- the leader ------------------------------------------------------------------------------------

def test_the_first_placement_is_one_write_with_every_epoch_key():
    g = Grid()
    g.join("c1")
    assert g.decide() is True
    st = g.state()
    assert st["policy"]["name"] == "orders" and [m["name"] for m in st["members"]] == ["c1"]
    for p, s in enumerate(st["placement"]["partitions"]):
        assert s["primary"] == "c1"
        assert g.etcd.get(g.keys.key(f"{EPOCHS}{p}")) == epoch_value(s["epoch"], "c1").encode()
    assert g.decide() is None  # nothing changed: nothing written


def test_a_write_needs_the_leader_key_the_leader_created():
    g = placed()
    g.etcd.end_lease(1)  # the leader's lease ended (a pause): another catalog took the key
    g.etcd.put(g.keys.key(LEADER), json.dumps({"name": "cat2", "address": "b:1"}), lease=2)
    g.etcd.end_lease(g.leases["c3"])  # something to decide
    assert g.decide() is False  # the deposed leader's write fails instead of overwriting
    assert {m["name"]: m["up"] for m in g.state()["members"]}["c3"] is True


def test_a_lost_container_is_written_lost_only_if_it_did_not_come_back():
    g = placed()
    victim = g.state()["placement"]["partitions"][0]["primary"]
    before = g.state()["placement"]["partitions"][0]
    g.etcd.end_lease(g.leases[victim])
    g.etcd.read(g.keys, 1.0)
    w = g.leader.step(1.0)  # decided on a read where it is gone
    assert any(c.key == g.keys.key(CONTAINERS + victim) and c.target == "CREATE" and c.value == 0 for c in w.conds)
    g.join(victim)  # it registered again before the write: the promotion must not happen
    assert g.etcd.txn(w)[0] is False
    g.leader = Leader(POLICY, g.etcd.read(g.keys), g.leader_rev, 2.0)  # what the process does after a failed write
    g.settle()
    assert g.state()["placement"]["partitions"][0]["primary"] == before["primary"]


def test_a_lost_primary_is_replaced_by_its_current_sync_replica_under_a_new_epoch():
    g = placed()
    p0 = g.state()["placement"]["partitions"][0]
    g.etcd.end_lease(g.leases[p0["primary"]])
    g.settle()
    now = g.state()["placement"]["partitions"][0]
    assert now["primary"] == p0["sync"][0] and now["epoch"] == p0["epoch"] + 1
    assert g.etcd.get(g.keys.key(f"{EPOCHS}0")) == epoch_value(now["epoch"], now["primary"]).encode()
    assert {m["name"]: m["up"] for m in g.state()["members"]}[p0["primary"]] is False


def test_a_currency_report_made_after_the_leaders_read_fails_its_promotion():
    """The primary narrows its current set (its replica fell behind) while the leader decides a change of
    that partition's primary on the older set: the leader's write fails, it reads again, and does not
    promote the replica that misses acknowledged commits."""
    g = placed()
    st = g.state()
    i, part = next((i, s) for i, s in enumerate(st["placement"]["partitions"]) if s["sync"])
    g.etcd.read(g.keys, 1.0)
    # the leader is about to move the partition's primary (here: its container lost, its replica current)
    g.etcd.end_lease(g.leases[part["primary"]])
    g.etcd.read(g.keys, 1.0)
    w = g.leader.step(1.0)
    assert any(c.key == g.keys.key(f"{CURRENCY}{i}") for c in w.conds)
    # ...while the primary, still within its lease, reports its replica behind (it answered a commit without it)
    known = g.etcd.kv[g.keys.key(f"{CURRENCY}{i}")][2]
    assert g.etcd.txn(currency_write(g.keys.prefix, i, part["epoch"], part["primary"], [], known))[0]
    assert g.etcd.txn(w)[0] is False
    g.leader = Leader(POLICY, g.etcd.read(g.keys), g.leader_rev, 2.0)
    g.settle()
    now = g.state()["placement"]["partitions"][i]
    assert now["primary"] == part["primary"] and now["current"] == []  # waits for its primary: nothing lost


def test_a_deposed_primarys_report_fails_and_says_deposed():
    g = placed()
    p0 = g.state()["placement"]["partitions"][0]
    g.etcd.end_lease(g.leases[p0["primary"]])
    g.settle()
    known = g.etcd.kv[g.keys.key(f"{CURRENCY}0")][2]
    w = currency_write(g.keys.prefix, 0, p0["epoch"], p0["primary"], [], known)
    assert g.etcd.txn(w)[0] is False
    assert deposed(g.etcd.get(g.keys.key(f"{EPOCHS}0")), p0["epoch"], p0["primary"])
    assert not deposed(epoch_value(3, "c1").encode(), 3, "c1")


def test_a_report_of_an_unknown_revision_cannot_overwrite_a_newer_one():
    """A report whose answer was lost may land late: conditioned on the revision it knew, it cannot."""
    g = placed()
    p0 = g.state()["placement"]["partitions"][0]
    known = g.etcd.kv[g.keys.key(f"{CURRENCY}0")][2]
    late = currency_write(g.keys.prefix, 0, p0["epoch"], p0["primary"], p0["sync"], known)
    newer = currency_write(g.keys.prefix, 0, p0["epoch"], p0["primary"], [], known)
    assert g.etcd.txn(newer)[0]
    assert g.etcd.txn(late)[0] is False


def test_a_currency_report_is_folded_in_once():
    """A replica relocated away and back in one epoch is a new, empty replica: the primary's old report
    naming it current must not make it current again."""
    g = placed()
    g.settle()
    folded = g.state()["folded"]
    assert folded and all(int(r) > 0 for r in folded.values())
    keys = g.etcd.read(g.keys)
    leader = Leader(POLICY, keys, g.leader_rev, 3.0)  # a new leader starts from the state's folded revisions
    assert leader.folded == {int(p): r for p, r in folded.items()}


def test_a_leader_refuses_a_state_of_another_partition_count():
    g = placed()
    other = GridPolicy("orders", 8, min_sync=1, max_sync=1, max_async=1, maps=(MapPolicy("m"),))
    with pytest.raises(ConfigError, match="partition"):
        Leader(other, g.etcd.read(g.keys), g.leader_rev, 0.0)


def test_followers_and_containers_read_the_leaders_decisions_without_planning():
    g = placed()
    keys = g.etcd.read(GridKeys("orders"))
    cat = keys.mirror(0.0)
    assert cat.placement.to_dict() == g.state()["placement"]
    assert cat.drain_log() == []
    a = cat.assignments_for("c1")
    assert a.grid == "orders" and a.shards
    assert cat.route_table().version == g.state()["placement"]["version"]


def test_reports_fill_in_status():
    g = placed()
    g.etcd.put(g.keys.key("reports/c1"), report_value(7, {0: 12}, {}), lease=g.leases["c1"])
    cat = g.etcd.read(GridKeys("orders")).mirror(5.0)
    c1 = next(c for c in cat.status(5.0)["containers"] if c["name"] == "c1")
    assert c1["applied_version"] == 7 and c1["last_heartbeat_age_s"] == 0.0



def test_a_report_older_than_the_leaders_own_write_still_reaches_its_status():
    """The leading catalog puts its own state write in its mirror at once (revision W); a container's
    report written just before it (R < W) comes by the watch after it, and moves no revision. The status
    must show it: a view cached by the newest revision kept the report before it for as long as the
    grid stayed quiet (a fresh-clone run waited 30 s on a container "at version 10 of 11")."""
    import logging

    from multisite.grid.server.etcd_catalog import CoordinatedCatalog

    g = placed()
    cc = CoordinatedCatalog(POLICY, "cat1", ["http://127.0.0.1:9"], 1.0, logging.getLogger("test"))
    g.etcd.read(cc.keys, now=1.0)
    before = next(c for c in cc.view(1.0).status(1.0)["containers"] if c["name"] == "c1")
    assert before["applied_version"] != 7
    r = g.etcd.put(g.keys.key("reports/c1"), report_value(7, {0: 12}, {}), lease=g.leases["c1"])
    state = g.etcd.kv[g.keys.key(STATE)]
    w = g.etcd.put(g.keys.key(STATE), state[0].decode())  # the leader's write, after the report
    cc.keys.put(g.keys.key(STATE), state[0], state[1], w, 0, 2.0)  # in its mirror at once
    assert cc.view(2.0) is not None and cc.keys.revision == w
    cc.keys.put(g.keys.key("reports/c1"), report_value(7, {0: 12}, {}).encode(), r, r, g.leases["c1"], 2.5)
    assert cc.keys.revision == w  # the event moved no revision...
    c1 = next(c for c in cc.view(3.0).status(3.0)["containers"] if c["name"] == "c1")
    assert c1["applied_version"] == 7  # ...and shows


# -- a container's writes and its deadline ---------------------------------------------------------

def test_registration_takes_a_free_name_replaces_its_own_and_refuses_another_containers():
    rec = ContainerRecord("c1", None, "h:2", 10, "orders", dir_id="d1")
    prefix = GridKeys("orders").prefix
    assert registration_write(prefix, rec, None, 5).conds[0].value == 0
    mine = Entry(ContainerRecord("c1", None, "h:1", 10, "orders", dir_id="d1").to_json().encode(), 3, 4, 2)
    w = registration_write(prefix, rec, mine, 5)
    assert w.conds[0].target == "MOD" and w.conds[0].value == 4
    other = Entry(ContainerRecord("c1", None, "h:9", 10, "orders", dir_id="d9").to_json().encode(), 3, 4, 2)
    why = registration_write(prefix, rec, other, 5)
    assert isinstance(why, str) and "h:9" in why and "--name" in why


def test_commits_stop_before_the_lease_can_end_and_until_a_state_read_after_registering():
    deadline = commit_deadline(10.0, 1.0)
    assert 10.0 < deadline < 11.0  # a quarter of the TTL before etcd can end it
    assert may_commit(10.5, deadline, registered_revision=5, applied_revision=7)
    assert not may_commit(deadline, deadline, 5, 7)
    assert not may_commit(10.5, deadline, 5, 4)  # registered again: the state applied is older
    assert not may_commit(10.5, deadline, 0, 7)  # not registered
