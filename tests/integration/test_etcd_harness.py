"""The etcd harness (testing/etcd.py) with the asyncio client (ha/etcd_client.py), on real etcd processes:
keys, transactions on revisions, leases that end, watches, health, and members lost, paused or unreachable."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import pytest

from multisite.errors import ConfigError, CoordinatorError, CoordinatorUnavailable
from multisite.ha.etcd_client import EtcdClient
from multisite.ha.etcd_values import Delete, Put, absent, created_at, modified_at, value_is
from multisite.testing.etcd import EtcdCluster
from multisite.testing.ports import free_port

LEASE_TTL_S = 1
LEASE_END_BOUND_S = 4.0  # a 1 s lease is gone well within this after its last keepalive
LOST_QUORUM_BOUND_S = 5.0  # a write without a majority fails within this


def run(coro):
    return asyncio.run(coro)


def test_the_cluster_has_three_members_logs_and_an_endpoint_string(etcd_cluster):
    assert len(etcd_cluster.client_urls) == 3
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+(,http://127\.0\.0\.1:\d+){2}", etcd_cluster.endpoints)
    assert all((etcd_cluster.dir / f"{m.name}.log").exists() for m in etcd_cluster.members)
    health = run(EtcdClient(etcd_cluster.endpoints).health())
    assert [h.url for h in health] == etcd_cluster.client_urls and all(h.healthy for h in health)
    assert len({h.leader_id for h in health}) == 1 and health[0].leader_id != 0


def test_put_get_prefix_and_delete(etcd_cluster):
    async def scenario(c: EtcdClient):
        await c.put("kv/a", "1")
        await c.put("kv/b", b"\x00\xff")
        await c.put("kw/other", "x")
        assert (await c.get("kv/a")).value == b"1"
        assert await c.get("kv/none") is None
        assert [(kv.key, kv.value) for kv in await c.get_prefix("kv/")] == [("kv/a", b"1"), ("kv/b", b"\x00\xff")]
        assert await c.delete("kv/a") == 1
        assert await c.delete("kv/", prefix=True) == 1
        assert await c.get_prefix("kv/") == [] and (await c.get("kw/other")).value == b"x"
        with pytest.raises(CoordinatorError, match=f"etcd at {c.current_url} refused.*lease not found"):
            await c.put("kv/c", "1", lease=12345)  # an answer, not a lost member: no other member is asked
    run(scenario(EtcdClient(etcd_cluster.client_urls)))


def test_a_transaction_on_an_old_revision_fails(etcd_cluster):
    async def scenario(c: EtcdClient):
        assert (await c.put_if_absent("txn/leader", "a")).succeeded
        assert not (await c.put_if_absent("txn/leader", "b")).succeeded
        kv = await c.get("txn/leader")
        assert (await c.put_if_revision("txn/leader", "a2", kv.mod_revision)).succeeded
        assert not (await c.put_if_revision("txn/leader", "a3", kv.mod_revision)).succeeded  # old revision
        assert not (await c.delete_if_revision("txn/leader", kv.mod_revision)).succeeded
        assert (await c.get("txn/leader")).value == b"a2"
        res = await c.txn([created_at("txn/leader", kv.create_revision), value_is("txn/leader", "a2")],
                          [Put("txn/term", "2"), Delete("txn/leader")], [Put("txn/lost", "1")])
        assert res.succeeded and await c.get("txn/leader") is None and await c.get("txn/lost") is None
        res = await c.txn([absent("txn/term")], [Put("txn/x", "1")], [Put("txn/lost", "1")])
        assert not res.succeeded and (await c.get("txn/lost")).value == b"1"
        assert not (await c.txn([modified_at("txn/term", 1)], [Put("txn/x", "1")])).succeeded
    run(scenario(EtcdClient(etcd_cluster.endpoints)))


def test_a_lease_keeps_its_key_while_kept_alive_and_ends_after_its_ttl_without(etcd_cluster):
    async def scenario(c: EtcdClient):
        lease = await c.lease_grant(LEASE_TTL_S)
        assert lease.ttl_s >= LEASE_TTL_S
        assert (await c.put_if_absent("lease/leader", "a", lease.id)).succeeded
        for _ in range(8):  # 2 s: twice the TTL, kept alive every 250 ms
            assert await c.lease_keepalive_once(lease.id) > 0
            await asyncio.sleep(0.25)
        assert (await c.get("lease/leader")).lease == lease.id
        t0 = time.monotonic()
        while await c.get("lease/leader") is not None:
            assert time.monotonic() - t0 < LEASE_END_BOUND_S, "the key outlived its lease"
            await asyncio.sleep(0.05)
        assert await c.lease_keepalive_once(lease.id) == 0  # an ended lease cannot be renewed
        await c.lease_revoke(lease.id)  # nor revoked, which is no error
        other = await c.lease_grant(30)
        await c.put("lease/k", "v", other.id)
        await c.lease_revoke(other.id)
        assert await c.get("lease/k") is None
    run(scenario(EtcdClient(etcd_cluster.endpoints)))


def test_a_watch_from_a_read_revision_sees_every_later_change_in_order(etcd_cluster):
    async def scenario(c: EtcdClient):
        await c.put("w/before", "0")
        read = await c.read_prefix("w/")
        await c.put("w/a", "1")  # after the read, before the watch: still seen
        async with c.watch_prefix("w/", read.revision + 1) as events:
            await c.put("w/a", "2")
            await c.delete("w/a")
            await c.put("x/elsewhere", "no")
            got = [await asyncio.wait_for(anext(events), 5) for _ in range(3)]
        assert [(e.kind, e.kv.key, e.kv.value) for e in got] == [("put", "w/a", b"1"), ("put", "w/a", b"2"),
                                                                 ("delete", "w/a", b"")]
        assert events.last_revision == got[-1].kv.mod_revision
    run(scenario(EtcdClient(etcd_cluster.endpoints)))


def test_one_member_lost_still_writable_two_lost_writes_fail_clearly(tmp_path):
    with EtcdCluster(tmp_path) as etcd:
        c = EtcdClient(etcd.endpoints)
        etcd.kill(0)
        etcd.wait_healthy(members=[1, 2])  # if it led etcd, the others elect a leader first (~0.5 s): a
        assert run(c.put_if_absent("q/k", "1")).succeeded  # transaction sent meanwhile has an unknown outcome
        assert [h.healthy for h in run(c.health())] == [False, True, True]
        etcd.kill(1)
        t0 = time.monotonic()
        with pytest.raises(CoordinatorUnavailable) as e:
            run(c.put("q/k", "2"))
        assert time.monotonic() - t0 < LOST_QUORUM_BOUND_S
        assert all(u in str(e.value) for u in etcd.client_urls)
        assert not any(h.healthy for h in run(c.health()))
        etcd.restart(0)  # a majority again: writable
        etcd.wait_healthy(members=[0, 2])
        assert run(c.put("q/k", "3")) > 0


def test_a_paused_member_is_passed_over_and_a_watch_ends_with_its_member(tmp_path):
    with EtcdCluster(tmp_path) as etcd:
        c = EtcdClient(etcd.endpoints)

        async def watch_then_kill():
            async with c.watch_prefix("p/") as events:
                i = etcd.client_urls.index(events.url)
                await c.put("p/a", "1")
                assert (await asyncio.wait_for(anext(events), 5)).kv.key == "p/a"
                etcd.kill(i)
                with pytest.raises(CoordinatorUnavailable, match="read again and watch from revision"):
                    await asyncio.wait_for(anext(events), 5)
            return i
        killed = run(watch_then_kill())
        etcd.restart(killed)  # two of three again once one is paused
        paused = c.urls.index(c.current_url)  # the next call tries it first
        etcd.pause(paused)
        try:
            t0 = time.monotonic()
            for _ in range(3):
                run(c.put("p/b", "2"))  # a paused member accepts connections and says nothing: next one
            assert time.monotonic() - t0 < 3 * c.timeout_s + 2
        finally:
            etcd.resume(paused)


def test_unreachable_urls_are_named_and_malformed_ones_refused():
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    c = EtcdClient(urls)
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as e:
        run(c.get("k"))
    assert all(u in str(e.value) for u in urls) and time.monotonic() - t0 < 2
    with pytest.raises(CoordinatorUnavailable, match=re.escape(urls[0])):
        run(c.txn([absent("k")], [Put("k", "v")]))
    with pytest.raises(CoordinatorUnavailable, match="no etcd member accepted a watch"):
        run(anext(c.watch_prefix("k/")))
    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        EtcdClient("127.0.0.1:2379")


def test_a_watch_opened_while_the_first_member_is_paused_starts_on_another(tmp_path):
    """A paused member accepts the connection and never answers: the watch's opening request waited for
    its answer without a deadline, and ``async with watch_prefix(...)`` never returned. Once open, the
    stream waits for events as long as it stays quiet (the opening's deadline is lifted)."""
    with EtcdCluster(tmp_path) as etcd:
        health = run(EtcdClient(etcd.endpoints).health())
        lead = next(h.leader_id for h in health if h.healthy)
        paused = next(i for i, h in enumerate(health) if h.member_id != lead)  # no election follows
        urls = etcd.client_urls
        c = EtcdClient([urls[paused]] + [u for i, u in enumerate(urls) if i != paused])  # tried first
        run(c.put("w/a", "1"))
        etcd.pause(paused)
        try:
            async def watch():
                t0 = time.monotonic()
                async with c.watch_prefix("w/") as events:
                    took = time.monotonic() - t0
                    await asyncio.sleep(2 * c.timeout_s + 0.5)
                    writer = EtcdClient(events.url, timeout_s=10.0)  # the event's source, not under test: patient
                    await asyncio.to_thread(lambda: asyncio.run(writer.put("w/b", "2")))
                    return events.url, took, (await asyncio.wait_for(anext(events), 5)).kv.key
            url, took, key = run(asyncio.wait_for(watch(), 3 * c.timeout_s + 15))  # the put's 10 s included
            assert url != urls[paused] and key == "w/b"
            assert took < 2 * c.timeout_s + 1, took
        finally:
            etcd.resume(paused)


def test_calls_do_not_wait_behind_work_in_the_event_loops_default_executor(etcd_cluster):
    """A grid container hardens its commits and reads its journal in the loop's default executor; an
    etcd call queued behind them (a currency report a commit waits for) waited as long as the disk."""
    c = EtcdClient(etcd_cluster.endpoints)
    release = threading.Event()

    async def go():
        loop = asyncio.get_running_loop()
        blockers = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]  # more than its threads
        try:
            t0 = time.monotonic()
            await asyncio.wait_for(c.put("busy/x", "1"), 5)
            return time.monotonic() - t0
        finally:
            release.set()
            await asyncio.gather(*blockers)
    assert run(go()) < 5


def test_a_call_that_outlives_its_deadline_is_unavailable(monkeypatch):
    """Whatever holds a call's thread past every member's timeouts, its await ends at the deadline."""
    c = EtcdClient("http://127.0.0.1:9", timeout_s=0.05)
    release = threading.Event()
    monkeypatch.setattr(c, "_call", lambda fn, idempotent=True: release.wait(10))
    t0 = time.monotonic()
    try:
        with pytest.raises(CoordinatorUnavailable, match="did not answer within"):
            run(c.get("k"))
    finally:
        release.set()
    assert time.monotonic() - t0 < c.call_deadline_s + 1.5


def test_health_checks_in_flight_do_not_hold_up_calls(etcd_cluster, monkeypatch):
    """A catalog answers each status with every member's health; asked in a loop while a member is slow,
    those checks must not take the threads its own coordination calls (the leader's writes) run in."""
    c = EtcdClient(etcd_cluster.endpoints)
    release = threading.Event()
    monkeypatch.setattr(c, "_member_health", lambda i: release.wait(30))  # a paused member, say

    async def go():
        checks = [asyncio.create_task(c.health()) for _ in range(10)]
        await asyncio.sleep(0.2)
        try:
            t0 = time.monotonic()
            await asyncio.wait_for(c.put("busy/h", "1"), 5)
            return time.monotonic() - t0
        finally:
            release.set()
            await asyncio.gather(*checks)
    assert run(go()) < 5


def test_a_member_whose_port_another_process_took_makes_the_start_begin_again_on_new_ports(tmp_path):
    etcd = EtcdCluster(tmp_path)
    taken = etcd.members[0].peer_port
    with socket.socket() as squatter:  # the race a fresh-clone run lost: the port found free is bound first
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with etcd:
            assert etcd.members[0].peer_port != taken
            assert all(etcd.healthy(i) for i in range(3))
    assert b"address already in use" in (etcd.dir / "m0.log").read_bytes()
