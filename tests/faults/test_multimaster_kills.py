"""Seeded fault rounds for multi-master replication, under a live writer: each round starts a
pull-push session from B with A (through a fault proxy) and then SIGKILLs A (the writer's server
and the session's responder), SIGKILLs B (the initiator, mid-apply), or cuts the link, at a seeded
moment. After the rounds and two clean sessions the checker asks: every write A acknowledged is on
both servers (no acknowledged write lost), the replicas are identical version for version, there is
no conflict document (a single writer: a session applied twice, or out of order, would show up as a
divergence) and each document's entry in the change feed appears once. The writer's history
(``testing/history``: each create and update with its invocation and outcome, ok / fail / unknown) is
checked on both servers' final documents: no lost write, no phantom (a document or a value of a call
that never reached A), no document created twice.

A failing round replays from its seed: ``MULTIMASTER_FAULT_SEED=<seed> pytest ...``.
"""

from __future__ import annotations

import os
import random
import threading
import time

from multisite.errors import MultisiteError
from multisite.multimaster.server.process import call
from multisite.testing.docservers import DocCluster, call_outcome, doc_state
from multisite.testing.faultproxy import ProxyProcess
from multisite.testing.history import FAIL, WRITE, Recorder, check

ROUNDS = 20
DOCS_PER_CREATE = 50
SEED = int(os.environ.get("MULTIMASTER_FAULT_SEED", "12"))


class Writer(threading.Thread):
    """Creates and updates documents on A through its server; records what A acknowledged, and every
    call in ``history``: the ``j``-th document of create ``w`` carries ``w`` and ``j`` in its fields."""

    def __init__(self, node, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.node, self.rng = node, rng
        self.acked_new: set[str] = set()
        self.acked_v: dict[str, int] = {}
        self.stop = threading.Event()
        self.errors = 0
        self.history = Recorder()

    def run(self) -> None:
        v = w = 0
        while not self.stop.is_set():
            if self.acked_new and self.rng.random() < 0.4:
                v += 1
                self._update(self.rng.choice(sorted(self.acked_new)), v)
            else:
                w += 1
                self._create(w)

    def _create(self, w: int) -> None:
        ops = [self.history.invoke("mm-writer", WRITE, ("new", w, j), (w, j)) for j in range(DOCS_PER_CREATE)]
        try:
            us = call(self.node.home, "doc.create_many", timeout=5, db="P", form="F",
                      docs=[{"v": 0, "w": w, "j": j, "pad": "x" * 64} for j in range(DOCS_PER_CREATE)])
        except MultisiteError as e:
            self._failed(ops, e)
            return
        for op in ops:
            self.history.ok(op)
        self.acked_new.update(us)

    def _update(self, u: str, v: int) -> None:
        op = self.history.invoke("mm-writer", WRITE, ("v", u), v)
        try:
            call(self.node.home, "doc.update", timeout=5, db="P", unid=u, fields={"v": v})
        except MultisiteError as e:
            self._failed([op], e)
            return
        self.history.ok(op)
        self.acked_v[u] = v

    def _failed(self, ops: list[int], e: MultisiteError) -> None:
        """A is down or restarting: not acknowledged (sent and unanswered: its outcome is unknown)."""
        self.errors += 1
        outcome = call_outcome(e)
        for op in ops:
            (self.history.fail if outcome == FAIL else self.history.unknown)(op)
        time.sleep(0.02)


def _docs(node):
    return {d["unid"]: d for d in call(node.home, "doc.list", db="P")}


def test_kills_and_cuts_during_sessions_lose_nothing_and_apply_nothing_twice(tmp_path):
    rng = random.Random(SEED)
    dc = DocCluster(tmp_path, durability="fsync")
    a = dc.server("A", ["P"])
    b = dc.server("B", ["P"], replica_of=a)
    with ProxyProcess("127.0.0.1", int(a.address.rsplit(":", 1)[1])) as proxy:
        writer = Writer(a, random.Random(SEED + 1))
        writer.start()
        kinds = []
        cut_short = 0  # rounds whose session the fault interrupted (not over before it)
        try:
            for rnd in range(ROUNDS):
                time.sleep(rng.uniform(0.05, 0.2))  # let the writer make a backlog
                kind = rng.choice(["kill-A", "kill-B", "cut"])
                kinds.append(kind)
                result: list = []
                t = threading.Thread(target=lambda out=result: out.append(_try(dc, b, proxy.address)), daemon=True)
                t.start()
                time.sleep(rng.uniform(0.0, 0.06))
                if kind == "kill-A":
                    dc.kill(a)
                elif kind == "kill-B":
                    dc.kill(b)
                else:
                    proxy.cut()
                t.join(30)
                cut_short += bool(result) and isinstance(result[0], MultisiteError)
                assert not t.is_alive(), f"round {rnd} ({kind}, seed {SEED}): the session hung"
                for n in (a, b):
                    if n.process.poll() is not None:
                        dc.start(n)  # same port: the proxy still points at A
        finally:
            writer.stop.set()
            writer.join(10)
        for _ in range(2):
            dc.replicate(b, a, "pull-push")
        da, db_ = _docs(a), _docs(b)
        assert set(kinds) == {"kill-A", "kill-B", "cut"}
        assert cut_short >= ROUNDS // 2, f"only {cut_short} of {ROUNDS} sessions were interrupted: the faults came late"
        lost = [u for u in writer.acked_new if u not in da or u not in db_]
        assert not lost, f"seed {SEED}: {len(lost)} acknowledged documents lost"
        for u, v in writer.acked_v.items():
            assert da[u]["fields"]["v"] >= v and db_[u]["fields"]["v"] >= v, f"seed {SEED}: update {v} of {u} lost"
        assert da == db_, f"seed {SEED}: the replicas differ"
        assert not any(d["conflict"] for d in da.values()), f"seed {SEED}: a divergence (applied twice or out of order)"
        h = writer.history.history()
        for name, docs in (("A", da), ("B", db_)):
            final, made = doc_state(docs)
            report = check(h, final, applied=made, initial={("v", u): 0 for u in docs})
            report.assert_clean(f"seed {SEED}, {name}")
        print(f"seed {SEED}: {ROUNDS} rounds ({', '.join(kinds)}); history on A and B: {report.summary()}")
        dc.stop_all()
        from multisite.multimaster.server import docdb
        for n in (a, b):
            with docdb.open(n.path("P")) as d:
                ch, _ = d.changes(0)
                assert len(ch) == len({u for u, _ in ch}) == d.count()
        assert len(writer.acked_new) > 500, "the writer hardly wrote: the rounds tested little"
    dc.stop_all()


def _try(dc, b, address):
    try:
        return call(b.home, "replicate", timeout=20, server=address, mode="pull-push")
    except MultisiteError as e:
        return e
