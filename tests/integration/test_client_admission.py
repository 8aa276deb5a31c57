"""The client port's connection slots under a flood (protocol/admission.py): a real instance server with
users, hundreds of connections from 127.0.0.1 that never log in, and a client from 127.0.0.2 that logs
in beside them; what status and /metrics say about it."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import TooManyConnections
from multisite.instance.users import add_user
from multisite.net import control
from multisite.protocol.admission import AdmissionPolicy
from multisite.server.process import start_server, stop_server
from multisite.testing.checks import wait_until
from multisite.testing.flood import Flood, login

from .test_metrics import one, scrape

POLICY = AdmissionPolicy()
FLOOD = 300  # more than the 256 connection slots: before the admission gate, these locked every client out


@pytest.fixture
def served(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    add_user(root, "app", "read-write", "app-password")
    info = start_server(root, "127.0.0.1:0", metrics="127.0.0.1:0")
    yield root, f"127.0.0.1:{info['client_port']}", control.call(root, "status")["metrics"].rsplit(":", 1)[1]
    stop_server(root)


def _admission(root) -> dict:
    return control.call(root, "status")["client_auth"]["admission"]


def test_a_client_logs_in_in_its_usual_time_while_one_address_floods_the_port(served):
    root, addr, metrics_port = served
    idle = statistics.median(login(addr, "app", "app-password", source="127.0.0.2") for _ in range(5))
    with Flood(addr, FLOOD, source="127.0.0.1") as flood:
        assert flood.ready.wait(30)
        wait_until(lambda: _admission(root)["refused"]["per_address"] >= FLOOD - POLICY.unauthenticated_per_address_max,
                   timeout_s=30)
        st = _admission(root)
        assert st["waiting"] == POLICY.unauthenticated_per_address_max  # the flood's share, no more
        flooded = [login(addr, "app", "app-password", source="127.0.0.2") for _ in range(5)]
        # Generous for a shared 2-core machine; bench/login_flood.py measures the ratio (within 2x).
        assert statistics.median(flooded) < max(1.0, 5 * idle), (idle, flooded)
        # a refused connection is told why, in the client protocol
        with pytest.raises(TooManyConnections, match="127.0.0.1 has 16 connections that have not logged in"):
            login(addr, "app", "app-password", source="127.0.0.1")

        res = CliRunner().invoke(cli, ["status", str(root)])
        assert res.exit_code == 0, res.output
        assert "per address" in res.output and "waiting to log in" in res.output

        # the flood's held connections are closed at the login deadline, and counted
        wait_until(lambda: _admission(root)["timeouts"] >= POLICY.unauthenticated_per_address_max,
                   timeout_s=POLICY.login_deadline_s + 10)
    st = _admission(root)
    assert st["logins"] >= 10 and st["refused"]["per_address"] >= FLOOD - POLICY.unauthenticated_per_address_max + 1
    samples = scrape(int(metrics_port))
    assert one(samples, "multisite_client_logins_refused_total", reason="per_address") == st["refused"]["per_address"]
    assert one(samples, "multisite_client_login_timeouts_total") == st["timeouts"]
    assert one(samples, "multisite_client_logins_refused_total", reason="authentication") == 0
    wait_until(lambda: one(scrape(int(metrics_port)), "multisite_client_unauthenticated") == 0, timeout_s=10)
    res = CliRunner().invoke(cli, ["status", str(root), "--json"])
    assert json.loads(res.stdout)["client_auth"]["admission"]["limits"] == POLICY.to_dict()


def test_when_the_waiting_room_is_full_the_address_holding_most_gives_up_its_oldest(tmp_path):
    """In-process listener (a real socket, the real ClientAuth) with small limits: 127.0.0.1 holds 3 of the
    4 waiting slots and 127.0.0.3 the last; a client from 127.0.0.2 gets in by closing 127.0.0.1's oldest."""
    import logging
    import socket

    from multisite.server import client_auth, clients

    root = multisite.create(tmp_path / "A", name="A", durability="none")
    add_user(root, "app", "read-write", "app-password")
    log = logging.getLogger("test.admission")
    auth = client_auth.ClientAuth(root, "127.0.0.1", log, admission=AdmissionPolicy(
        connections_max=8, unauthenticated_total_max=4, unauthenticated_per_address_max=3))
    lis = clients.ClientListener("127.0.0.1", 0, lambda op, args: op, log, auth=auth)
    addr = f"127.0.0.1:{lis.port}"
    held = []
    try:
        for source in ("127.0.0.1",) * 3 + ("127.0.0.3",):
            held.append(socket.create_connection(("127.0.0.1", lis.port), source_address=(source, 0), timeout=10))
            wait_until(lambda n=len(held): auth.admission.waiting == n)
        assert login(addr, "app", "app-password", source="127.0.0.2") < 5
        assert held[0].recv(10) == b""  # the oldest of 127.0.0.1's: closed by the server
        assert auth.admission.evicted == 1 and auth.admission.waiting_from("127.0.0.3") == 1
        held.append(socket.create_connection(("127.0.0.1", lis.port), source_address=("127.0.0.4", 0), timeout=10))
        wait_until(lambda: auth.admission.waiting == 4)
        with pytest.raises(TooManyConnections, match="4 connections are waiting to log in"):
            # full again, and 127.0.0.1 holds only 2 against 127.0.0.3's 1: a swap would be no fairer
            login(addr, "app", "app-password", source="127.0.0.3")
    finally:
        for s in held:
            s.close()
        lis.close()
