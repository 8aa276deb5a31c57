"""A session opened while the instance had no users (loopback, or --insecure: no authentication, every
right) once users are added: authentication is on, for it too (server.client_auth's gate, no sockets)."""

from __future__ import annotations

import logging

import pytest

from multisite.errors import AuthenticationFailed
from multisite.instance.users import add_user
from multisite.server.client_auth import USERS_RECHECK_S, ClientAuth

LOG = logging.getLogger("test.client_auth")


@pytest.mark.parametrize("host,insecure", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_an_open_session_ends_when_the_first_user_is_added(inst, host, insecure):
    """Changes to the users reach open sessions (a removed user's, a replaced password's), but a
    session opened before there were users kept its open admin rights after the first ``user add``:
    exactly the moment an operator turns authentication on."""
    now = [100.0]
    auth = ClientAuth(inst, host, LOG, insecure=insecure, clock=lambda: now[0])
    gate = auth.gate(("127.0.0.1", 5000), None)
    assert gate.admit("commit", {}) is None  # open: no users yet
    add_user(inst, "w", "read-only", "w-password")
    now[0] += 2 * USERS_RECHECK_S
    with pytest.raises(AuthenticationFailed, match="authenticate"):
        gate.admit("commit", {})
    assert gate.must_close
