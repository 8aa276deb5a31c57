"""Delivery through a real message broker: Mosquitto (started by the test on a free port, with
persistence), MQTT QoS 1 and persistent sessions, real agent processes, an encrypted link. A remote
away while the broker itself restarts still gets every message once it is back."""

from __future__ import annotations

import json
import os

import pytest

import multisite.engine as engine
from multisite.testing.broker import Broker
from multisite.testing.delivery import FIELD, REGION, make_topology, rows, run_agent

pytestmark = pytest.mark.skipif(not Broker.available(), reason="mosquitto is not installed (make setup installs it)")


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "broker").start()
    yield b
    b.stop()


def _polls(res):
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]


def test_messages_cross_a_restarted_broker_both_ways_encrypted_to_a_remote_that_was_away(tmp_path, broker):
    key = os.urandom(32).hex()
    top = make_topology(tmp_path / "t", {"P": "fr"}, key=key,
                        addresses={"HQ": broker.address("multisite/HQ"), "P": broker.address("multisite/P")})
    listen = {"HQ": ("--listen-mqtt", broker.address("multisite/HQ")),
              "P": ("--listen-mqtt", broker.address("multisite/P"))}
    p = top.remotes["P"]
    _polls(run_agent(p, "--json", "--once", *listen["P"]))  # P's persistent session exists from now on
    for k in range(3):  # P is away: the broker keeps HQ's messages for it
        with engine.open(top.hq) as db:
            for i in range(20):
                db.set(REGION, ("hq", k * 20 + i), {FIELD: "fr", "n": i})
        assert sum(x["sent_messages"] for x in _polls(run_agent(top.hq, "--json", "--once", *listen["HQ"]))) == 1
    assert not list(top.inbox("P").glob("*.msg"))  # nothing reached P's folder: it waits at the broker
    broker.stop()
    broker.start()  # same port and persistence folder: the queued messages survive
    with engine.open(p) as db:
        db.set(REGION, ("p", 1), {FIELD: "fr", "n": 1})
    polls = _polls(run_agent(p, "--json", "--until-idle", "--interval", "0", *listen["P"]))
    assert sum(x["applied_transactions"] for x in polls) == 60
    polls = _polls(run_agent(top.hq, "--json", "--until-idle", "--interval", "0", *listen["HQ"]))
    assert sum(x["applied_transactions"] for x in polls) == 1
    assert sorted(rows(p)) == sorted(rows(top.hq)) and len(rows(p)) == 61
    with engine.open(top.hq) as db:
        out = db.get("sysremoteuser", ("P", "out"))
    assert out["confirm_sent"] == out["log_sent"]


def test_a_receiving_agent_killed_while_it_takes_messages_off_the_broker_loses_none(tmp_path, broker):
    import random
    import signal
    import subprocess
    import time

    from multisite.testing.delivery import agent_process

    top = make_topology(tmp_path / "t", {"P": "fr"},
                        addresses={"HQ": broker.address("multisite/HQ"), "P": broker.address("multisite/P")})
    p = top.remotes["P"]
    listen_p = ("--listen-mqtt", broker.address("multisite/P"))
    _polls(run_agent(p, "--json", "--once", *listen_p))  # P's persistent session
    with engine.open(top.hq) as db:
        for i in range(400):
            db.set(REGION, ("hq", i), {FIELD: "fr", "n": i})
    polls = _polls(run_agent(top.hq, "--json", "--once", "--message-bytes", "1024"))
    assert sum(x["sent_messages"] for x in polls) > 20
    rng = random.Random(7)
    for _ in range(2):  # P's agent SIGKILLed at random moments while it drains the broker and applies
        proc = agent_process(p, "--interval", "0", *listen_p, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.4, 1.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _polls(run_agent(p, "--json", "--until-idle", "--interval", "0", *listen_p))
    for _ in range(2):  # any gap is resent
        _polls(run_agent(top.hq, "--json", "--until-idle", "--interval", "0", "--listen-mqtt",
                         broker.address("multisite/HQ")))
        _polls(run_agent(p, "--json", "--until-idle", "--interval", "0", *listen_p))
    assert sorted(rows(p)) == [("hq", i) for i in range(400)]
