"""``multisite.connect``: the engine's API over the client protocol, against a real instance server.

What a client writes must be exactly what an embedded ``multisite.open`` sees afterwards.
"""

from __future__ import annotations

import threading

import pytest

import multisite
from multisite import engine as database


@pytest.fixture
def server(cluster):
    a = cluster.instance("A")
    return cluster, a


def test_set_get_items_kill_zkill_and_transaction(server):
    cluster, a = server
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        db.create_region("acct")  # idempotent
        assert db.seqno == 0
        s1 = db.set("acct", ("alice",), {"balance": 10, "tags": ["x"]})
        s2 = db.set("acct", ("alice", "card", 1), "visa")
        s3 = db.set("acct", ("bob",), 5)
        assert (s1, s2, s3) == (1, 2, 3) and db.seqno == 3
        assert db.get("acct", ("alice",)) == {"balance": 10, "tags": ["x"]}
        assert db.get("acct", ("nobody",)) is None

        with db.transaction() as tx:
            tx.set("acct", ("carol",), 1)
            tx.set("acct", ("dave",), 2)
            tx.zkill("acct", ("bob",))
        assert tx.seqno == 4  # one transaction, one seqno
        assert db.get("acct", ("bob",)) is None and db.get("acct", ("dave",)) == 2

        assert db.zkill("acct", ("alice",)) == 5  # the node only: its subtree stays
        assert db.get("acct", ("alice",)) is None and db.get("acct", ("alice", "card", 1)) == "visa"
        db.set("acct", ("alice",), 1)
        assert db.kill("acct", ("alice",)) == 7  # the node and its subtree
        assert db.get("acct", ("alice", "card", 1)) is None

        for i in range(25):
            db.set("acct", ("n", i), i)
        rows = list(db.items("acct", batch=7))  # several pages
        assert [k for k, _ in rows] == sorted(k for k, _ in rows)
        assert len(rows) == 27 and rows[0] == (("carol",), 1)
        part = list(db.items("acct", start=("n", 5), stop=("n", 9), batch=2))  # stop is exclusive
        assert [k for k, _ in part] == [("n", i) for i in range(5, 9)]
        final = db.seqno

    a.stop()
    with database.open(a.root) as emb:
        assert emb.seqno == final
        assert list(emb.items("acct")) == rows


def test_a_failed_transaction_sends_nothing(server):
    cluster, a = server
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
        with pytest.raises(RuntimeError):
            with db.transaction() as tx:
                tx.set("acct", ("x",), 1)
                raise RuntimeError("application changed its mind")
        assert db.seqno == 0 and db.get("acct", ("x",)) is None
        with pytest.raises(multisite.RegionNotFound):
            with db.transaction() as tx:
                tx.set("acct", ("y",), 1)
                tx.set("missing", ("y",), 1)
        assert db.seqno == 0 and db.get("acct", ("y",)) is None  # all or nothing
        with pytest.raises(multisite.TransactionError):
            with db.transaction():
                with db.transaction():
                    pass


def test_errors_come_back_as_the_same_classes(server):
    cluster, a = server
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        with pytest.raises(multisite.RegionNotFound) as ei:
            db.get("missing", ("k",))
        assert ei.value.code == "REGION_NOT_FOUND" and "create_region" in str(ei.value)
        db.create_region("acct")
        with pytest.raises(multisite.KeyTypeError):
            db.set("acct", "not-a-tuple", 1)
        with pytest.raises(multisite.ValueEncodeError):
            db.set("acct", ("k",), {1, 2})
        assert db.seqno == 0
        db.set("acct", ("k",), 1)  # the connection is still usable
        assert db.get("acct", ("k",)) == 1


def test_connect_to_nothing_is_connection_lost():
    with pytest.raises(multisite.ConnectionLost, match="cannot connect"):
        multisite.connect("127.0.0.1:1", timeout=5)


def test_concurrent_clients_each_get_their_own_seqnos(server):
    cluster, a = server
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        db.create_region("acct")
    seqnos: list[int] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
            for i in range(50):
                s = db.set("acct", (c, i), i)
                with lock:
                    seqnos.append(s)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seqnos) == list(range(1, 201))
    with multisite.connect(f"127.0.0.1:{a.client_port}") as db:
        assert len(list(db.items("acct"))) == 200
