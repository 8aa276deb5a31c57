"""Application code in the instance server's process (``multisite.serve``) and the asyncio client.

A primary served in this test's process commits from its handle (the embedded Database, from many
threads) and from client connections (sync, asyncio, pipelined) at once; a secondary in a server
process of its own receives both through a Source Server started with the CLI against the served
instance, and holds exactly the primary's data. Then the handle closes, and the instance reopens
with everything.
"""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

import multisite
from multisite.errors import ConnectionLost, RegionNotFound, TransactionError
from multisite.testing.checks import assert_same_data, wait_until

from .test_replication_cli import instances, ms, ms_json  # noqa: F401 - instances is a fixture


def test_serve_commits_from_the_handle_and_from_clients_reach_a_secondary_started_with_the_cli(instances):
    a, b = instances["A"], instances["B"]
    ms("server", "start", b)
    port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)",
                         ms("receiver", "start", b, "--listen", "127.0.0.1:0").stdout)[1])
    with multisite.serve(a, listen="127.0.0.1:0") as srv:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", srv.address)
        db = srv.db
        assert isinstance(db, multisite.Database) and db.role == "primary"
        db.create_region("acct")
        st = ms_json("status", a)  # the CLI reaches the served instance
        assert st["state"] == "running" and st["client_port"] == int(srv.address.split(":")[1])
        ms("source", "start", a, "--secondary", "B", "--connect", f"127.0.0.1:{port}",
           "--heartbeat-interval", "0.2")

        errors: list[BaseException] = []

        def embedded(t: int) -> None:
            try:
                for i in range(100):
                    with db.transaction() as tx:
                        tx.set("acct", ("emb", t, i), i)
                        tx.set("acct", ("emb-count", t), i + 1)
            except BaseException as e:  # reported below
                errors.append(e)

        def remote(t: int) -> None:
            try:
                with multisite.connect(srv.address) as c:
                    for i in range(100):
                        c.set("acct", ("cli", t, i), {"i": i})
            except BaseException as e:
                errors.append(e)

        async def pipelined() -> None:
            c = await multisite.aconnect(srv.address)
            seqnos = await asyncio.gather(*(c.set("acct", ("async", i), i) for i in range(200)))
            assert len(set(seqnos)) == 200 and all(s > 0 for s in seqnos)
            async with c.transaction() as tx:
                tx.set("acct", ("async-tx",), "one")
                tx.zkill("acct", ("async", 0))
            assert tx.seqno > max(seqnos)
            assert await c.get("acct", ("async-tx",)) == "one" and await c.get("acct", ("async", 0)) is None
            assert await c.commit([("set", "acct", ("async-c",), 1), ("kill", "acct", ("async", 1))]) > tx.seqno
            assert len([k async for k, _ in c.items("acct", start=("async",), stop=("async-c",))]) == 198
            with pytest.raises(RegionNotFound):
                await c.set("nope", ("k",), 1)
            with pytest.raises(TransactionError, match="update is"):
                await c.commit([("put", "acct", ("k",), 1)])
            await c.close()

        ths = [threading.Thread(target=embedded, args=(t,)) for t in range(4)]
        ths += [threading.Thread(target=remote, args=(t,)) for t in range(4)]
        for th in ths:
            th.start()
        asyncio.run(pipelined())
        for th in ths:
            th.join()
        assert errors == []
        last = db.seqno
        assert last == 400 + 400 + 200 + 2
        wait_until(lambda: ms_json("source", "status", a, "--secondary", "B")["last_confirmed"] == last,
                   what="B confirms every commit, embedded and remote")
        wait_until(lambda: ms_json("status", b)["seqno"] == last, what="B applies them")
        assert srv.clients == 0
    with pytest.raises(multisite.MultisiteError):  # closed with the served instance
        db.get("acct", ("emb", 0, 0))
    ms("server", "stop", b)
    with multisite.open(a) as da, multisite.open(b) as dbb:
        assert da.seqno == dbb.seqno == last
        assert da.get("acct", ("emb-count", 3)) == 100 and dbb.get("acct", ("cli", 3, 99)) == {"i": 99}
    assert_same_data(a, b)


def test_serve_refuses_a_second_owner_and_a_bad_address_and_the_clients_see_it_close(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    with pytest.raises(multisite.ConfigError, match="HOST:PORT|port"):
        multisite.serve(root, listen="nowhere")
    with multisite.serve(root, listen="127.0.0.1:0") as srv:
        with pytest.raises(multisite.MultisiteError, match="owned by process"):
            multisite.serve(root)
        srv.db.create_region("r")
        c = multisite.connect(srv.address)
        assert c.set("r", ("k",), 1) == 1
    with pytest.raises(ConnectionLost):
        c.get("r", ("k",))
    with multisite.serve(root) as srv2:  # served again after close, without a listener
        assert srv2.address is None and srv2.db.get("r", ("k",)) == 1
