"""The client port fails closed: when a connection's authentication cannot be set up, the connection
is closed and serves nothing (real listener, real TCP on 127.0.0.1, both event loops)."""

from __future__ import annotations

import socket

import msgspec
import pytest

import multisite
from multisite.instance.users import add_user, users_path
from multisite.server import client_auth
from multisite.protocol.client import LEN, encode
from multisite.testing.checks import wait_until

LOOPS = ["asyncio", "uvloop"]


@pytest.fixture
def inst(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    add_user(root, "boss", "admin", "boss-pass")
    return root


def _ask_unauthenticated(address: str, req: list) -> object:
    """The answer to ``req`` sent first on a new connection: a reply, "closed", or "no answer"."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(encode(req))
        try:
            head = s.recv(4, socket.MSG_WAITALL)
        except TimeoutError:
            return "no answer"
        except ConnectionResetError:
            return "closed"
        if len(head) < 4:
            return "closed"
        (n,) = LEN.unpack(head)
        return msgspec.msgpack.decode(s.recv(n, socket.MSG_WAITALL))


@pytest.mark.parametrize("loop", LOOPS)
def test_a_users_file_turned_unreadable_keeps_the_last_good_users_for_new_connections(inst, monkeypatch, loop):
    """Reading users.json raised OSError (EACCES: `sudo multisite user add` leaves a root-owned 0600 file
    that the server's user cannot read; EISDIR; EIO), which only InstanceFileCorrupt was caught for: the
    next connection got no gate, and on the asyncio loop its requests ran without authentication (a
    region created by a client that never said hello); on uvloop it hung, holding a connection slot."""
    monkeypatch.setenv("MULTISITE_CLIENT_LOOP", loop)
    with multisite.serve(inst, listen="127.0.0.1:0") as srv:
        path = users_path(inst)
        path.unlink()
        path.mkdir()  # unreadable as a file, whoever the server runs as (the tests run as root)
        got = _ask_unauthenticated(srv.address, [1, "create_region", {"name": "intruder"}])
        assert isinstance(got, list) and got[:2] == [1, False] and got[2][0] == "AUTHENTICATION_REQUIRED", got
        assert "intruder" not in srv.db.regions()
    assert "cannot be read" in (inst / "log" / "server.log").read_text()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_whose_gate_cannot_be_made_is_closed_and_serves_nothing(inst, monkeypatch, loop):
    """Whatever fails while a connection's gate is made (here a fault injected into ClientAuth.gate),
    the listener ran the connection's requests without a gate, that is without authentication."""
    monkeypatch.setenv("MULTISITE_CLIENT_LOOP", loop)

    def broken(self, addr, cert_name):
        raise RuntimeError("injected fault")

    with multisite.serve(inst, listen="127.0.0.1:0") as srv:
        monkeypatch.setattr(client_auth.ClientAuth, "gate", broken)
        assert _ask_unauthenticated(srv.address, [1, "create_region", {"name": "intruder"}]) == "closed"
        assert "intruder" not in srv.db.regions()
        wait_until(lambda: srv.clients == 0, timeout_s=5, what="the connection slot given back")
