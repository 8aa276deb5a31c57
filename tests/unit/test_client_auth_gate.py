"""server.client_auth without sockets: what the listener asks of a connection's gate (who must
authenticate, frame limits, the callback on authentication, refusal counts) and the listen rule at
construction. Real instance directories and users files; the clock is injected."""

from __future__ import annotations

import logging

import pytest

from multisite.errors import AuthenticationFailed, AuthenticationRequired, ConfigError, PermissionDenied
from multisite.instance.users import add_user
from multisite.server import client_auth
from multisite.server.client_auth import ClientAuth, common_name
from multisite.protocol.auth import PacingPolicy
from multisite.protocol.client import MAX_CLIENT_FRAME_BYTES

LOG = logging.getLogger("test.client_auth")


def test_loopback_without_users_is_open_and_nothing_is_bounded(inst):
    auth = ClientAuth(inst, "127.0.0.1", LOG)
    gate = auth.gate(("127.0.0.1", 5000), None)
    assert gate.authenticated and gate.max_frame_bytes == MAX_CLIENT_FRAME_BYTES
    assert gate.admit("commit", {}) is None and gate.admit("stop", {}) is None
    st = auth.status()
    assert {k: st[k] for k in ("users", "tls", "required", "refused")} == {"users": 0, "tls": False,
                                                                        "required": False, "refused": 0}
    assert st["admission"]["waiting"] == 0  # the listener's connection slots (tests/unit/test_client_admission.py)


def test_non_loopback_without_users_is_refused_at_construction_unless_insecure(inst):
    with pytest.raises(ConfigError, match="--listen 0.0.0.0 .*--insecure"):
        ClientAuth(inst, "0.0.0.0", LOG)
    auth = ClientAuth(inst, "0.0.0.0", LOG, insecure=True)
    assert auth.gate(("10.1.1.1", 1), None).authenticated


def test_users_make_every_connection_authenticate_and_bound_it_until_then(inst):
    add_user(inst, "w", "read-write", "w-password")
    auth = ClientAuth(inst, "127.0.0.1", LOG)
    gate = auth.gate(("127.0.0.1", 5000), None)
    called = []
    gate.on_authenticated = lambda: called.append(1)
    assert not gate.authenticated and gate.max_frame_bytes == client_auth.UNAUTHENTICATED_FRAME_BYTES
    with pytest.raises(AuthenticationRequired):
        gate.admit("get", {})
    assert called == []
    assert gate.admit("hello", {"user": "w", "password": "w-password"})["role"] == "read-write"
    assert called == [1] and gate.max_frame_bytes == MAX_CLIENT_FRAME_BYTES
    with pytest.raises(PermissionDenied):
        gate.admit("stop", {})
    gate.admit("hello", {"user": "w", "password": "w-password"})
    assert called == [1]  # once


def test_users_added_after_start_apply_to_the_next_gate(inst):
    auth = ClientAuth(inst, "127.0.0.1", LOG)
    assert auth.gate(("127.0.0.1", 1), None).authenticated
    add_user(inst, "w", "read-write", "w-password")
    assert not auth.gate(("127.0.0.1", 2), None).authenticated
    assert auth.status()["required"] is True


def test_refusals_are_counted_and_logged_with_host_and_port(inst, caplog):
    add_user(inst, "w", "read-write", "w-password")
    auth = ClientAuth(inst, "127.0.0.1", LOG)
    gate = auth.gate(("127.0.0.9", 4242), None)
    with caplog.at_level(logging.INFO, logger=LOG.name), pytest.raises(AuthenticationFailed):
        gate.admit("hello", {"user": "w", "password": "wrong-password"})
    assert gate.must_close and auth.status()["refused"] == 1
    [rec] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert rec.levelno == logging.WARNING and rec.getMessage().startswith("client 127.0.0.9:4242 refused: wrong password")


def test_pacing_uses_the_injected_clock_across_connections_of_one_host(inst):
    add_user(inst, "w", "read-write", "w-password")
    now = [100.0]
    auth = ClientAuth(inst, "127.0.0.1", LOG, pacing=PacingPolicy(free_failures=1, first_delay_s=10.0),
                      clock=lambda: now[0])
    for port in (1, 2):
        with pytest.raises(AuthenticationFailed):
            auth.gate(("10.0.0.1", port), None).admit("hello", {"user": "w", "password": "wrong-password"})
    with pytest.raises(AuthenticationFailed, match="try again in 10.0 s"):
        auth.gate(("10.0.0.1", 3), None).admit("hello", {"user": "w", "password": "w-password"})
    assert auth.gate(("10.0.0.2", 1), None).admit("hello", {"user": "w", "password": "w-password"})  # another host
    now[0] += 10.0
    assert auth.gate(("10.0.0.1", 4), None).admit("hello", {"user": "w", "password": "w-password"})["user"] == "w"


def test_a_certificate_naming_a_user_authenticates_the_gate_from_the_start(inst):
    add_user(inst, "client", "read-only", None)
    gate = ClientAuth(inst, "127.0.0.1", LOG).gate(("127.0.0.1", 1), "client")
    assert gate.authenticated and gate.auth.by == "certificate"


def test_common_name_of_a_peer_certificate():
    cert = {"subject": ((("countryName", "XX"),), (("commonName", "client"),))}
    assert common_name(cert) == "client"
    assert common_name(None) is None and common_name({}) is None


def test_open_sessions_see_a_removed_user_once_the_recheck_interval_has_passed(inst):
    add_user(inst, "w", "read-write", "w-password")
    now = [0.0]
    auth = ClientAuth(inst, "127.0.0.1", LOG, clock=lambda: now[0])
    gate = auth.gate(("127.0.0.1", 1), None)
    gate.admit("hello", {"user": "w", "password": "w-password"})
    from multisite.instance.users import remove_user

    remove_user(inst, "w")
    assert gate.admit("get", {}) is None  # within the interval: not looked at yet
    now[0] += client_auth.USERS_RECHECK_S
    with pytest.raises(AuthenticationFailed, match="'w' was removed"):
        gate.admit("get", {})
    assert gate.must_close and auth.status()["refused"] == 1
