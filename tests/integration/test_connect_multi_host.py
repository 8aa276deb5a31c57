"""``multisite.connect("h1:p1,h2:p2")``: the client follows the primary across a failover, with real servers.

Reads and requests a deposed primary refused go to the new primary; a commit whose answer was lost
raises CommitOutcomeUnknown and is never sent again.
"""

from __future__ import annotations

import threading

import pytest

import multisite
from multisite.errors import CommitOutcomeUnknown, ConfigError, ConnectionLost


@pytest.fixture
def pair(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    b.call("role", role="secondary")
    cluster.link(a, b)
    return cluster, a, b


def test_a_multi_host_string_connects_to_the_primary_whatever_the_order(pair):
    cluster, a, b = pair
    with multisite.connect(f"127.0.0.1:{b.client_port},127.0.0.1:{a.client_port}") as db:
        assert db.address == f"127.0.0.1:{a.client_port}"
        db.create_region("acct")
        assert db.set("acct", ("k",), 1) == 1


def test_after_a_failover_a_lost_commit_is_unknown_and_the_next_goes_to_the_new_primary(pair):
    cluster, a, b = pair
    addrs = f"127.0.0.1:{a.client_port},127.0.0.1:{b.client_port}"
    with multisite.connect(addrs, failover_timeout_s=20) as db:
        db.create_region("acct")
        for i in range(10):
            db.set("acct", (i,), i)
        cluster.wait_caught_up(a, b)
        a.kill()
        promoted = threading.Event()

        def promote():
            b.call("receiver.stop")
            b.call("role", role="primary")
            promoted.set()
        threading.Timer(0.3, promote).start()
        with pytest.raises(CommitOutcomeUnknown, match="not sent again"):
            db.set("acct", ("lost?",), 1)
        assert db.get("acct", (9,)) == 9  # a read waits for the new primary and is answered there
        assert promoted.is_set() and db.address == f"127.0.0.1:{b.client_port}"
        assert db.set("acct", ("after",), 2) == 11
    with multisite.connect(f"127.0.0.1:{b.client_port}") as one:
        assert one.get("acct", ("lost?",)) is None  # never re-sent


def test_a_multi_host_string_without_a_primary_names_what_each_member_answered(pair):
    cluster, a, b = pair
    a.kill()
    with pytest.raises(ConnectionLost, match=r"no primary among .* within 0.5 s: .*secondary"):
        multisite.connect(f"127.0.0.1:{a.client_port},127.0.0.1:{b.client_port}", failover_timeout_s=0.5)


def test_an_empty_or_malformed_address_list_is_refused():
    with pytest.raises(ConfigError):
        multisite.connect(",")
    with pytest.raises(ConfigError):
        multisite.connect("127.0.0.1:1,nonsense")


def test_aconnect_follows_the_primary_across_a_failover(pair):
    import asyncio

    cluster, a, b = pair

    async def main():
        db = await multisite.aconnect(f"127.0.0.1:{b.client_port},127.0.0.1:{a.client_port}",
                                      failover_timeout_s=20)
        assert db.address == f"127.0.0.1:{a.client_port}"
        await db.create_region("acct")
        seqnos = await asyncio.gather(*(db.set("acct", (i,), i) for i in range(20)))
        assert sorted(seqnos) == list(range(1, 21))
        cluster.wait_caught_up(a, b)
        a.kill()
        b.call("receiver.stop")
        b.call("role", role="primary")
        with pytest.raises(CommitOutcomeUnknown):
            await db.set("acct", ("lost?",), 1)
        assert await db.get("acct", (19,)) == 19
        assert db.address == f"127.0.0.1:{b.client_port}" and await db.set("acct", ("after",), 1) == 21
        await db.close()
    asyncio.run(main())


def test_a_fenced_primary_is_passed_by_for_the_one_that_takes_commits(cluster):
    """An old primary cut off from etcd keeps its role but is fenced (its lease ended): it answers
    NOT_PRIMARY, so a client that kept choosing it by its role never reached the new primary."""
    a, b = cluster.instance("A"), cluster.instance("B")  # both primaries by role, as across a partition
    a.call("lease", until=0.0)
    for client in (multisite.connect, _aconnect_sync):
        with client(f"127.0.0.1:{a.client_port},127.0.0.1:{b.client_port}") as db:
            assert db.address == f"127.0.0.1:{b.client_port}"
            db.create_region("acct")
            db.set("acct", ("k",), 1)


class _aconnect_sync:
    """``multisite.aconnect`` driven from a test thread, with the blocking client's shape."""

    def __init__(self, addresses: str):
        import asyncio

        self._loop = asyncio.new_event_loop()
        self._db = self._loop.run_until_complete(multisite.aconnect(addresses))

    @property
    def address(self) -> str:
        return self._db.address

    def create_region(self, name: str) -> None:
        self._loop.run_until_complete(self._db.create_region(name))

    def set(self, region: str, key: tuple, value) -> int:
        return self._loop.run_until_complete(self._db.set(region, key, value))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._loop.run_until_complete(self._db.close())
        self._loop.close()


def test_a_paused_member_is_passed_by_within_the_connect_timeout(cluster):
    """A SIGSTOPped server's kernel still accepts connections, and nothing answers: the role probe of
    a multi-host client waited its whole request timeout for it (the blocking one), or for ever (the
    asyncio one), before trying the next member."""
    import os
    import signal
    import time

    from multisite.server.client import CONNECT_TIMEOUT_S
    from multisite.testing.cluster import pause, thread_states

    a, b = cluster.instance("A"), cluster.instance("B")  # two primaries by role; A, listed first, paused
    pause(a.pid)
    try:
        for client in (multisite.connect, _aconnect_sync):
            t0 = time.monotonic()
            with client(f"127.0.0.1:{a.client_port},127.0.0.1:{b.client_port}") as db:
                assert db.address == f"127.0.0.1:{b.client_port}", \
                    f"the paused A answered; its threads' states now {thread_states(a.pid)!r}"
            assert time.monotonic() - t0 < CONNECT_TIMEOUT_S + 3
    finally:
        os.kill(a.pid, signal.SIGCONT)
