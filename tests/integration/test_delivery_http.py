"""Delivery over http with real agent processes: a peer that is down makes messages wait in the
sender's outbox folder; once the peer's agent serves its endpoint, the next poll delivers them."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import multisite.engine as engine
from multisite.testing.ports import free_port
from multisite.testing.delivery import FIELD, REGION, agent_process, make_topology, rows, run_agent


def test_undeliverable_messages_wait_in_the_outbox_and_are_retried(tmp_path):
    port = free_port()
    top = make_topology(tmp_path / "t", {"P": "fr"}, addresses={"P": f"http://127.0.0.1:{port}"})
    with engine.open(top.hq) as db:
        for i in range(30):
            db.set(REGION, ("hq", i), {FIELD: "fr", "n": i})
    assert run_agent(top.hq, "--once").returncode == 0  # P is down: the message waits at HQ
    spool = top.hq / "delivery" / "outbox" / "P"
    assert len(list(spool.glob("*.msg"))) == 1
    with engine.open(top.hq) as db:
        db.set(REGION, ("hq", 30), {FIELD: "fr", "n": 30})
    assert run_agent(top.hq, "--once").returncode == 0  # still down: queued behind the first
    assert len(list(spool.glob("*.msg"))) == 2
    p = agent_process(top.remotes["P"], "--interval", "0.1", "--json", "--listen-http", f"127.0.0.1:{port}",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # its endpoint is up
        assert run_agent(top.hq, "--once").returncode == 0  # the retry delivers both, oldest first
        assert not list(spool.glob("*.msg"))
        deadline = time.monotonic() + 30
        applied = 0
        while applied < 31 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if line.startswith("{"):
                applied += json.loads(line)["applied_transactions"]
        assert applied == 31
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
        p.stdout.close()
        p.stderr.close()
    assert sorted(rows(top.remotes["P"])) == [("hq", i) for i in range(31)]
