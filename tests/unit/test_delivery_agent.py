"""The Message Agent (delivery.server.agent) in this process over the file transport: both ways, forwarding,
subscribe-by, conflicts, transactions spanning several messages, and bad messages refused."""

from __future__ import annotations

import os

import pytest

import multisite.engine as engine
from multisite.delivery.server import api
from multisite.delivery.server.agent import Agent
from multisite.delivery.message import decode, encode
from multisite.errors import DeliveryConfigError
from multisite.testing.delivery import FIELD, REGION, make_topology, poll, rows, settle


def _set(path, key, value):
    with engine.open(path) as db:
        db.set(REGION, key, value)


def _expected(top, hq_rows):
    return {name: {k: v for k, v in hq_rows.items() if v[FIELD] == val} for name, val in top.values.items()}


def test_changes_flow_both_ways_and_every_site_ends_with_its_subscribed_rows(tmp_path):
    top = make_topology(tmp_path, {"P": "fr", "Q": "de", "R": "fr"})
    with engine.open(top.hq) as db:
        for i in range(30):
            db.set(REGION, ("hq", i), {FIELD: ["fr", "de", "it"][i % 3], "n": i})
    _set(top.remotes["P"], ("p", 1), {FIELD: "fr", "n": 100})  # goes to HQ, and on to R (also fr), not Q
    _set(top.remotes["Q"], ("q", 1), {FIELD: "de", "n": 200})
    settle(top)
    hq = rows(top.hq)
    assert len(hq) == 32
    for name, want in _expected(top, hq).items():
        assert rows(top.remotes[name]) == want, name
    # a row moving from fr to de is deleted at P and R and appears at Q
    _set(top.hq, ("hq", 0), {FIELD: "de", "n": 0})
    settle(top)
    hq = rows(top.hq)
    for name, want in _expected(top, hq).items():
        assert rows(top.remotes[name]) == want, name
    with engine.open(top.hq) as db:
        st = api.status(db)
    for r in st["remote_users"]:
        assert r["confirm_sent"] == r["log_sent"] and r["log_received"] == r["confirm_received"]
        assert (r["log_received"] > 0) == (r["user"] in ("P", "Q"))  # R sent nothing


def test_an_update_conflict_keeps_the_consolidated_copy_and_is_logged(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    _set(top.hq, ("o", 1), {FIELD: "fr", "n": 1})
    settle(top)
    _set(top.hq, ("o", 1), {FIELD: "fr", "n": 2, "by": "HQ"})  # both change the row before the exchange
    _set(top.remotes["P"], ("o", 1), {FIELD: "fr", "n": 3, "by": "P"})
    settle(top)
    assert rows(top.hq)[("o", 1)]["by"] == "HQ"
    assert rows(top.remotes["P"])[("o", 1)]["by"] == "HQ"
    with engine.open(top.hq) as db:
        conflicts = api.conflicts(db)
    assert len(conflicts) == 1
    c = conflicts[0]
    assert c["user"] == "P" and c["region"] == REGION and c["key"] == ["o", 1] and c["rule"] == "consolidated-wins"


def test_a_transaction_larger_than_the_message_limit_spans_several_messages(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    with engine.open(top.hq) as db, db.transaction() as tx:
        for i in range(300):
            tx.set(REGION, ("big", i), {FIELD: "fr", "pad": "x" * 50})
    rep = poll(top.hq, message_bytes=2048)
    assert rep.sent_messages > 5 and rep.sent_transactions == 1
    names = sorted(p.name for p in top.inbox("P").iterdir())
    assert len({n.rsplit("-", 1)[0] for n in names}) == 1  # one transaction: same gen, prev and last, seq 0..n-1
    assert sorted(int(n.rsplit("-", 1)[1].split(")")[0]) for n in names) == list(range(len(names)))
    os.replace(top.inbox("P") / names[2], tmp_path / "held")  # one part late: nothing applies meanwhile
    assert poll(top.remotes["P"]).applied_transactions == 0 and rows(top.remotes["P"]) == {}
    os.replace(tmp_path / "held", top.inbox("P") / names[2])
    rep = poll(top.remotes["P"])
    assert rep.applied_transactions == 1 and len(rows(top.remotes["P"])) == 300


def test_a_corrupt_message_is_rejected_naming_it_and_the_resend_delivers(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    _set(top.hq, ("o", 1), {FIELD: "fr"})
    poll(top.hq)
    _set(top.hq, ("o", 2), {FIELD: "fr"})
    poll(top.hq)
    first = sorted(top.inbox("P").iterdir())[0]
    first.write_bytes(first.read_bytes()[:-7])  # truncated on the way
    rep = poll(top.remotes["P"])
    assert len(rep.rejected) == 1 and first.name in rep.rejected[0] and "truncated" in rep.rejected[0]
    assert rows(top.remotes["P"]) == {}  # the second waits for the first: nothing applied out of order
    assert (top.inbox("P") / "rejected" / first.name).exists()
    settle(top, rounds=20)
    assert set(rows(top.remotes["P"])) == {("o", 1), ("o", 2)}


def test_a_message_failing_authentication_is_refused(tmp_path):
    key = os.urandom(32).hex()
    top = make_topology(tmp_path, {"P": "fr"}, key=key)
    _set(top.hq, ("o", 1), {FIELD: "fr"})
    poll(top.hq)
    msg = next(top.inbox("P").iterdir())
    data = bytearray(msg.read_bytes())
    forged = decode(bytes(data), "m", bytes.fromhex(key))  # a forger without the link's key
    forged.txs[0].updates[0].value = b"\xa6forged"
    msg.write_bytes(encode(forged, os.urandom(32)))
    rep = poll(top.remotes["P"])
    assert rep.rejected and "failed authentication" in rep.rejected[0]
    assert rows(top.remotes["P"]) == {}
    assert (top.inbox("P") / "rejected" / msg.name).exists()


def test_bad_setup_is_a_clear_error(tmp_path):
    root = engine.create(tmp_path / "A", "A")
    with engine.open(root) as db:
        with pytest.raises(DeliveryConfigError, match="no delivery setup"):
            Agent(db)
        with pytest.raises(DeliveryConfigError, match="no publication"):
            api.subscribe(db, "nope", "P", str(tmp_path / "in"))
        api.publish(db, "pub", ["t"], "f")
        with pytest.raises(DeliveryConfigError, match="give --value"):
            api.subscribe(db, "pub", "P", str(tmp_path / "in"))
        with pytest.raises(DeliveryConfigError, match="system region"):
            api.publish(db, "pub2", ["sysremoteuser"])
        with pytest.raises(DeliveryConfigError, match="64 hex digits"):
            api.subscribe(db, "pub", "P", str(tmp_path / "in"), "x", key="beef")


def test_extract_builds_a_remote_with_exactly_its_rows_that_then_keeps_up(tmp_path):
    top = make_topology(tmp_path, {"P": "fr", "Q": "de"})
    with engine.open(top.hq) as db:
        for i in range(40):
            db.set(REGION, ("o", i), {FIELD: "fr" if i % 2 else "de", "n": i})
    poll(top.hq)  # messages for the old P wait in its inbox; P itself is lost
    new_p = tmp_path / "P-new"
    with engine.open(top.hq) as db:
        out = api.extract(db, "P", new_p)
    assert out["rows"] == 20
    assert rows(new_p) == {k: v for k, v in rows(top.hq).items() if v[FIELD] == "fr"}
    assert list(top.inbox("P").glob("*.msg"))  # what was sent to the old P: in the extract, dropped on arrival
    top.remotes["P"] = new_p
    _set(top.hq, ("o", 100), {FIELD: "fr", "n": 100})
    _set(new_p, ("p", 1), {FIELD: "fr", "n": 1})
    settle(top)
    assert rows(new_p) == {k: v for k, v in rows(top.hq).items() if v[FIELD] == "fr"}
    assert ("p", 1) in rows(top.hq) and ("o", 100) in rows(new_p)


def test_a_link_that_cannot_send_is_reported_and_the_others_go_on(tmp_path):
    top = make_topology(tmp_path, {"P": "fr", "Q": "fr"}, addresses={"Q": "nope://somewhere"})
    _set(top.hq, ("o", 1), {FIELD: "fr"})
    rep = poll(top.hq)
    assert len(rep.link_errors) == 1 and rep.link_errors[0].startswith("Q: ") and "nope://" in rep.link_errors[0]
    assert rep.sent_messages == 1
    poll(top.remotes["P"])
    assert ("o", 1) in rows(top.remotes["P"])
    with engine.open(top.hq) as db:
        q = next(r for r in api.status(db)["remote_users"] if r["user"] == "Q")
    assert q["log_sent"] == q["confirm_sent"]  # nothing counted as sent to Q


def test_a_remote_moving_a_row_out_of_its_subscription_loses_it_and_the_new_subscriber_gets_it(tmp_path):
    top = make_topology(tmp_path, {"P": "fr", "Q": "de"})
    _set(top.hq, ("o", 1), {FIELD: "fr", "n": 1})
    settle(top)
    _set(top.remotes["P"], ("o", 1), {FIELD: "de", "n": 2})  # P hands the order over to Q's site
    settle(top)
    assert rows(top.hq)[("o", 1)] == {FIELD: "de", "n": 2}
    assert rows(top.remotes["Q"]) == {("o", 1): {FIELD: "de", "n": 2}}
    assert rows(top.remotes["P"]) == {}  # no longer one of P's rows: deleted there


def test_prune_keeps_the_journal_a_subscriber_has_not_confirmed(tmp_path):
    from multisite.instance.maintenance import prune
    from multisite.journal.segments import list_segments

    top = make_topology(tmp_path, {"P": "fr"}, hq_durability="none")  # no preallocation: small segments
    with engine.open(top.hq, segment_bytes=4096) as db:
        for i in range(300):
            db.set(REGION, ("o", i), {FIELD: "fr", "pad": "p" * 40})
    poll(top.hq)  # sent, not confirmed: a resend may need all of it
    first = list_segments(top.hq / "journal")[0].index
    assert len(list_segments(top.hq / "journal")) > 3
    prune(top.hq, 10**9)
    assert list_segments(top.hq / "journal")[0].index == first
    poll(top.remotes["P"])
    poll(top.hq)  # the confirmation: the mark moves to the newest segment
    rep = prune(top.hq, 10**9)
    assert list_segments(top.hq / "journal")[0].index > first, rep
    assert list_segments(top.hq / "journal")[0].index > first
    assert len(rows(top.remotes["P"])) == 300


def test_updates_outside_the_links_publication_are_not_applied(tmp_path):
    top = make_topology(tmp_path, {"P": "fr"})
    _set(top.remotes["P"], ("p", 1), {FIELD: "fr"})
    _set(top.remotes["P"], ("p", 2), {FIELD: "fr"})
    poll(top.remotes["P"])
    (f,) = top.inbox("HQ").glob("*.msg")
    msg = decode(f.read_bytes(), "m")
    msg.txs[0].updates[0].region = "secret"  # a remote writing where it does not subscribe
    f.write_bytes(encode(msg))
    rep = poll(top.hq)
    assert rep.applied_transactions == 2
    assert set(rows(top.hq)) == {("p", 2)}
    with engine.open(top.hq) as db:
        assert "secret" not in db.regions()
