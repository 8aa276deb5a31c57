"""protocol.admission without sockets: which accepted connections may wait to log in, for how long,
and what is counted. Tokens are plain strings, the clock a number."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError, TooManyConnections
from multisite.protocol.admission import REFUSED_REASONS, AdmissionGate, AdmissionPolicy

SMALL = AdmissionPolicy(connections_max=10, unauthenticated_total_max=6, unauthenticated_per_address_max=3,
                        login_deadline_s=5.0)


def test_the_defaults_are_named_and_leave_room_for_clients_that_logged_in():
    p = AdmissionPolicy()
    assert p.unauthenticated_per_address_max < p.unauthenticated_total_max < p.connections_max
    assert p.login_deadline_s <= 5.0


@pytest.mark.parametrize("kw", [dict(unauthenticated_per_address_max=0),
                                dict(unauthenticated_per_address_max=200),
                                dict(unauthenticated_total_max=256),
                                dict(login_deadline_s=0)])
def test_limits_that_cannot_work_are_refused(kw):
    with pytest.raises(ConfigError, match="client admission"):
        AdmissionPolicy(**kw)


def test_one_address_holds_at_most_its_share_of_waiting_slots_and_another_still_gets_in():
    g = AdmissionGate(SMALL)
    for i in range(3):
        assert g.admit(f"a{i}", "10.0.0.1", 0.0, i).admitted
    d = g.admit("a3", "10.0.0.1", 0.0, 3)
    assert not d.admitted and d.reason == "per_address" and isinstance(d.error, TooManyConnections)
    assert "10.0.0.1 has 3 connections that have not logged in" in d.error.message
    assert g.admit("b0", "10.0.0.2", 0.0, 3).admitted
    assert g.waiting == 4 and g.waiting_from("10.0.0.1") == 3
    assert g.status()["refused"] == {"connections": 0, "unauthenticated_total": 0, "per_address": 1}


def test_ipv6_addresses_of_one_64_share_one_share():
    g = AdmissionGate(SMALL)
    for i in range(3):
        assert g.admit(i, f"2001:db8::{i + 1}", 0.0, i).admitted
    assert g.admit(9, "2001:db8::ff", 0.0, 3).reason == "per_address"
    assert g.admit(10, "2001:db8:0:1::1", 0.0, 3).admitted  # another /64


def test_logging_in_frees_the_waiting_slot_but_the_connection_still_counts():
    g = AdmissionGate(SMALL)
    for i in range(3):
        g.admit(i, "10.0.0.1", 0.0, i)
    g.logged_in(0)
    assert g.waiting_from("10.0.0.1") == 2 and g.logins == 1
    assert g.admit(3, "10.0.0.1", 0.0, 3).admitted  # a fourth from that address: only three wait
    d = g.admit(4, "10.0.0.9", 0.0, 10)  # but all connections, logged in or not, are bounded
    assert d.reason == "connections" and "10 client connections open" in d.error.message
    g.logged_in(0)  # twice, or a token that never waited: nothing
    g.logged_in("unknown")
    assert g.logins == 1


def test_the_deadline_closes_the_oldest_first_and_counts_them():
    g = AdmissionGate(SMALL)
    assert g.admit("a", "10.0.0.1", 0.0, 0).deadline == 5.0
    g.admit("b", "10.0.0.2", 1.0, 1)
    g.admit("c", "10.0.0.3", 2.0, 2)
    g.logged_in("b")
    assert g.next_deadline() == 5.0
    assert g.due(4.9) == []
    assert g.due(6.5) == ["a"]  # b logged in; c is due at 7
    g.timed_out("a")
    assert g.next_deadline() == 7.0 and g.timeouts == 1
    g.closed("c")  # the client went away first: not a timeout
    assert g.due(100.0) == [] and g.next_deadline() is None and g.timeouts == 1


def test_a_full_waiting_room_makes_room_from_the_address_holding_the_most():
    g = AdmissionGate(SMALL)
    for i in range(3):
        g.admit(f"x{i}", "10.0.0.1", float(i), i)
    for i in range(3):
        g.admit(f"y{i}", "10.0.0.2", 3.0 + i, 3 + i)
    d = g.admit("new", "10.0.0.3", 10.0, 6)
    assert d.admitted and d.evict == "x0"  # the oldest of an address holding the most (3 vs 0)
    assert g.evicted == 1 and g.waiting == 6 and g.waiting_from("10.0.0.1") == 2
    assert g.due(100.0)[0] == "x1"  # the evicted one is gone from the deadlines
    # 10.0.0.2 holds 3, 10.0.0.3 holds 1: one more from .3 still takes from .2 (3 >= 1 + 2) ...
    assert g.admit("new2", "10.0.0.3", 11.0, 6).evict == "y0"
    # ... but now every address holds 2: a swap would not be fairer, so a newcomer is refused
    d = g.admit("new3", "10.0.0.3", 12.0, 6)
    assert d.reason == "unauthenticated_total" and "6 connections are waiting to log in" in d.error.message
    assert g.status()["refused"]["unauthenticated_total"] == 1


def test_status_is_plain_numbers_with_the_limits():
    g = AdmissionGate(SMALL)
    g.admit("a", "10.0.0.1", 0.0, 0)
    st = g.status()
    assert st == {"waiting": 1, "logins": 0, "refused": dict.fromkeys(REFUSED_REASONS, 0), "evicted": 0,
                  "timeouts": 0, "limits": {"connections_max": 10, "unauthenticated_total_max": 6,
                                            "unauthenticated_per_address_max": 3, "login_deadline_s": 5.0}}


def test_a_flood_from_one_address_never_holds_more_than_its_share():
    """1,000 connects from one address, none logging in, each closed at its deadline: at no time more than
    its share wait, and a client from elsewhere is admitted throughout."""
    p = AdmissionPolicy()
    g = AdmissionGate(p)
    now, refused = 0.0, 0
    for i in range(1000):
        now += 0.01
        for t in g.due(now):
            g.timed_out(t)
        d = g.admit(("flood", i), "127.0.0.1", now, g.waiting)
        refused += not d.admitted
        assert g.waiting_from("127.0.0.1") <= p.unauthenticated_per_address_max
        if i % 100 == 0:
            assert g.admit(("client", i), "127.0.0.2", now, g.waiting).admitted
            g.logged_in(("client", i))
    assert refused > 900 and g.refused["per_address"] == refused and g.timeouts > 0
