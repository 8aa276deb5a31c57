"""Who may do what on a grid port (grid/access.py), without sockets: certificates read as peers, the
member checks before a registration or a subscription, and the --listen rule."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError
from multisite.grid.access import Peer, check_listen, member_refusal, own_certificate_refusal, peer_of


def cert(cn=None, ou=None):
    subject = []
    if cn:
        subject.append((("commonName", cn),))
    if ou:
        subject.append((("organizationalUnitName", ou),))
    return {"subject": tuple(subject)}


def test_a_certificate_is_a_member_of_the_grid_its_unit_names():
    assert peer_of(cert("c1", "orders")) == Peer("c1", "orders")
    assert peer_of(cert("c1", "orders")).member_of("orders")
    assert not peer_of(cert("c1", "other")).member_of("orders")
    assert not peer_of(cert("alice")).member_of("orders")  # a client's: a user, no grid
    assert peer_of(None) == Peer() and not Peer().member_of("orders")


def test_only_a_member_registers_or_subscribes_and_only_under_its_own_name():
    assert member_refusal(Peer("c1", "orders"), "orders", "c1", "register") is None
    assert "needs a grid member's certificate" in member_refusal(Peer(), "orders", "c1", "register")
    assert "names grid 'other'" in member_refusal(Peer("c1", "other"), "orders", "c1", "register")
    assert "names no grid" in member_refusal(Peer("alice"), "orders", "alice", "subscribe")
    assert "may not subscribe as 'c2'" in member_refusal(Peer("c1", "orders"), "orders", "c2", "subscribe")


def test_a_member_refuses_to_start_with_a_certificate_of_another_grid():
    assert own_certificate_refusal(Peer("c1", "orders"), "orders") is None
    assert own_certificate_refusal(Peer("c1", "other"), "") is None  # a new container: its grid is not known yet
    assert "names grid 'other', not 'orders'" in own_certificate_refusal(Peer("c1", "other"), "orders")


def test_a_port_other_hosts_reach_takes_tls_and_users_unless_insecure():
    check_listen("127.0.0.1", tls=False, users=0, insecure=False)
    check_listen("10.0.0.5", tls=False, users=0, insecure=True)
    check_listen("10.0.0.5", tls=True, users=2, insecure=False)
    with pytest.raises(ConfigError, match="--tls-cert"):
        check_listen("0.0.0.0", tls=False, users=2, insecure=False)
    with pytest.raises(ConfigError, match="no users"):
        check_listen("10.0.0.5", tls=True, users=0, insecure=False)
