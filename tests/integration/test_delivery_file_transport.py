"""Delivery with real ``multisite delivery`` processes over the file transport: the commands that set
it up, a remote offline for many rounds, a resend after a lost message, a transaction spanning
several messages, and the status table and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import multisite.engine as engine
from multisite.testing.delivery import FIELD, REGION, make_topology, rows, run_agent


def ms(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from multisite.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=60)


def _commit(path, start, n, value="fr", prefix="hq"):
    with engine.open(path) as db:
        for i in range(start, start + n):
            db.set(REGION, (prefix, i), {FIELD: value, "n": i})


def test_the_commands_set_up_a_two_way_link_and_status_prints_the_table_and_json(tmp_path):
    for name in ("HQ", "P"):
        assert ms("instance", "create", str(tmp_path / name), "--name", name).returncode == 0
    hq, p, inbox = str(tmp_path / "HQ"), str(tmp_path / "P"), tmp_path / "inbox"
    r = ms("delivery", "publish", hq, "--publication", "sales", "--regions", REGION, "--subscribe-by", FIELD,
           "--inbox", str(inbox / "HQ"))
    assert r.returncode == 0, r.stderr
    r = ms("delivery", "subscribe", hq, "--publication", "sales", "--subscriber", "P", "--address", str(inbox / "P"),
           "--value", "fr")
    assert r.returncode == 0 and "P subscribed to sales" in r.stdout, r.stderr
    r = ms("delivery", "remote-setup", p, "--consolidated", "HQ", "--address", str(inbox / "HQ"), "--publication",
           "sales", "--regions", REGION, "--inbox", str(inbox / "P"))
    assert r.returncode == 0, r.stderr
    _commit(tmp_path / "HQ", 0, 5)
    _commit(tmp_path / "HQ", 5, 5, "de")
    _commit(tmp_path / "P", 0, 3, prefix="p")
    for site in (hq, p, hq, p, hq):
        assert run_agent(site, "--once").returncode == 0
    assert len(rows(tmp_path / "P")) == 8 and len(rows(tmp_path / "HQ")) == 13
    r = ms("delivery", "status", hq, "--json")
    st = json.loads(r.stdout)
    (row,) = st["remote_users"]
    assert st["role"] == "consolidated" and row["user"] == "P" and row["value"] == "fr"
    assert row["confirm_sent"] == row["log_sent"] > 0 and row["log_received"] == row["confirm_received"] > 0
    r = ms("delivery", "status", hq)
    assert "SYSREMOTEUSER of HQ" in r.stdout and f"{row['log_sent']:010d}" in r.stdout
    r = ms("delivery", "subscribe", hq, "--publication", "nope", "--subscriber", "X", "--address", "/x")
    assert r.returncode == 1 and "error: DELIVERY_CONFIG: no publication 'nope'" in r.stderr


def test_a_remote_offline_for_many_rounds_catches_up_in_order(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    for rnd in range(8):  # P's agent does not run: HQ's messages wait in its inbox
        _commit(top.hq, rnd * 50, 50)
        assert run_agent(top.hq, "--once").returncode == 0
    assert len(list(top.inbox("P").glob("*.msg"))) == 8
    r = run_agent(top.remotes["P"], "--until-idle", "--interval", "0", "--json")
    polls = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert sum(p["applied_transactions"] for p in polls) == 400
    assert run_agent(top.hq, "--once").returncode == 0  # takes the confirmation
    assert sorted(rows(top.remotes["P"])) == [("hq", i) for i in range(400)]
    with engine.open(top.hq) as db:
        out = db.get("sysremoteuser", ("P", "out"))
    assert out["confirm_sent"] == out["log_sent"]


def test_a_lost_message_is_resent_after_the_receiver_asks(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    for k in range(3):
        _commit(top.hq, k * 10, 10)
        assert run_agent(top.hq, "--once").returncode == 0
    lost = sorted(top.inbox("P").glob("*.msg"))[1]
    lost.unlink()
    for _ in range(3):  # the gap: the second poll of it asks for a resend
        assert run_agent(top.remotes["P"], "--once").returncode == 0
        assert run_agent(top.hq, "--once").returncode == 0
    log = (top.hq / "log" / "delivery-agent.log").read_text()
    assert "asked for a resend" in log and "as generation 1" in log
    assert run_agent(top.remotes["P"], "--once").returncode == 0
    assert sorted(rows(top.remotes["P"])) == [("hq", i) for i in range(30)]


def test_a_transaction_spanning_several_messages_is_applied_whole(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    with engine.open(top.hq) as db, db.transaction() as tx:
        for i in range(400):
            tx.set(REGION, ("big", i), {FIELD: "fr", "pad": "z" * 100})
    r = run_agent(top.hq, "--once", "--message-bytes", "4096", "--json")
    (poll,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert poll["sent_messages"] >= 10 and poll["sent_transactions"] == 1
    r = run_agent(top.remotes["P"], "--once", "--json")
    (poll,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert poll["applied_messages"] == 1 and poll["applied_transactions"] == 1
    assert len(rows(top.remotes["P"])) == 400


def test_keygen_an_encrypted_link_conflicts_and_extract_through_the_commands(tmp_path):
    key = ms("delivery", "keygen").stdout.strip()
    assert len(key) == 64
    top = make_topology(tmp_path / "t", {"P": "fr"}, key=key)
    _commit(top.hq, 0, 3)
    for site in (top.hq, top.remotes["P"]):
        assert run_agent(site, "--once").returncode == 0
    with engine.open(top.hq) as db:  # both sides change ("hq", 0) before the next exchange
        db.set(REGION, ("hq", 0), {FIELD: "fr", "n": 100})
    with engine.open(top.remotes["P"]) as db:
        db.set(REGION, ("hq", 0), {FIELD: "fr", "n": -1})
    for site in (top.remotes["P"], top.hq, top.remotes["P"], top.hq):
        assert run_agent(site, "--once").returncode == 0
    r = ms("delivery", "conflicts", str(top.hq), "--json")
    (c,) = json.loads(r.stdout)
    assert c["user"] == "P" and c["key"] == ["hq", 0] and c["rule"] == "consolidated-wins"
    assert rows(top.remotes["P"])[("hq", 0)]["n"] == 100  # the consolidated copy, on both sides
    r = ms("delivery", "extract", str(top.hq), "--subscriber", "P", "--to", str(tmp_path / "P2"))
    assert r.returncode == 0 and "extracted 3 rows of P" in r.stdout, r.stderr
    assert rows(tmp_path / "P2") == rows(top.hq)
