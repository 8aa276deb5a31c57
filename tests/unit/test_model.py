"""A model-based test: random updates, transactions and reopens against a plain dict model.

After every step: each region's items equal the model's in key order, the seqno counts exactly the
transactions that touched a replicated region, and the journal holds seqnos 1..seqno with no gap.
Each transaction's journal record carries the before-images the model predicts.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import multisite
from multisite.journal.reader import iter_records
from multisite.journal.records import KILL, SET, ZKILL

REPLICATED = ("acct", "bank")
UNREPLICATED = ("scratch",)
REGIONS = REPLICATED + UNREPLICATED

# A small universe of subscripts, so that keys collide and are often each other's prefixes.
SUBSCRIPT = st.sampled_from(["a", "b", "", "a\x00", 1, 2, -1, 2**40])
KEYS = st.lists(SUBSCRIPT, min_size=1, max_size=3).map(tuple)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=4), st.none(),
                   st.dictionaries(st.sampled_from(["n", "s"]), st.integers(0, 9), max_size=2),
                   st.lists(st.booleans(), max_size=2))
OPS = st.tuples(st.sampled_from([SET, KILL, ZKILL]), st.sampled_from(REGIONS), KEYS, VALUES)


def order(key: tuple) -> tuple:
    return tuple((0, p) if type(p) is int else (1, p) for p in key)


def enc(v) -> bytes:
    return msgspec.msgpack.encode(v)


class Engine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="msmodel-"))
        self.root = multisite.create(self.tmp / "A", name="A", durability="none", segment_bytes=4096)
        self.db = multisite.open(self.root)
        for r in REPLICATED:
            self.db.create_region(r)
        for r in UNREPLICATED:
            self.db.create_region(r, replicated=False)
        self.model: dict[str, dict[tuple, object]] = {r: {} for r in REGIONS}
        self.seqno = 0
        self.reopens = 0

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the model -------------------------------------------------------------------------------
    def _apply(self, op: int, region: str, key: tuple, value) -> object:
        """Apply to the model; return what the journal should record as this update's before-image."""
        m = self.model[region]
        if op == SET:
            before = enc(m[key]) if key in m else None
            m[key] = value
            return (SET, key, enc(value), before)
        if op == ZKILL:
            had, before = key in m, m.pop(key, None)
            return (ZKILL, key, None, enc(before) if had else None)
        gone = sorted((k for k in m if k[: len(key)] == key), key=order)
        killed = [(k, enc(m.pop(k))) for k in gone]
        return (KILL, key, killed)

    def _commit_ops(self, ops) -> list:
        expected = []
        for op, region, key, value in ops:
            exp = self._apply(op, region, key, value)
            if region in REPLICATED:
                expected.append((region, exp))
        if expected:
            self.seqno += 1
        return expected

    def _check_record(self, expected: list) -> None:
        if not expected:
            return
        (rec,) = list(iter_records(self.db.layout.journal, self.seqno, self.seqno))
        got = []
        for u in rec.updates:
            if u.op == KILL:
                got.append((u.region, (KILL, tuple(u.key), [(tuple(k), v) for k, v in u.killed])))
            else:
                got.append((u.region, (u.op, tuple(u.key), u.value, u.before)))
        assert got == expected

    # -- rules -----------------------------------------------------------------------------------
    @rule(op=OPS)
    def single(self, op):
        code, region, key, value = op
        if code == SET:
            self.db.set(region, key, value)
        elif code == KILL:
            self.db.kill(region, key)
        else:
            self.db.zkill(region, key)
        self._check_record(self._commit_ops([op]))

    @rule(ops=st.lists(OPS, min_size=0, max_size=8))
    def transaction(self, ops):
        with self.db.transaction() as tx:
            for code, region, key, value in ops:
                if code == SET:
                    tx.set(region, key, value)
                elif code == KILL:
                    tx.kill(region, key)
                else:
                    tx.zkill(region, key)
        expected = self._commit_ops(ops)
        assert tx.seqno == (self.seqno if expected else 0)
        self._check_record(expected)

    @rule(ops=st.lists(OPS, min_size=1, max_size=4))
    def aborted_transaction(self, ops):
        try:
            with self.db.transaction() as tx:
                for code, region, key, value in ops:
                    if code == SET:
                        tx.set(region, key, value)
                    else:
                        tx.kill(region, key)
                raise KeyboardInterrupt  # any exception aborts; this one is not an Exception
        except KeyboardInterrupt:
            pass

    @rule()
    def flush(self):
        self.db.flush()

    @precondition(lambda self: self.reopens < 6)
    @rule()
    def reopen(self):
        self.db.close()
        self.db = multisite.open(self.root)
        self.reopens += 1
        assert self.db.recovery.torn_bytes == 0

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def items_equal_the_model_in_key_order(self):
        for region in REGIONS:
            want = sorted(self.model[region].items(), key=lambda kv: order(kv[0]))
            assert list(self.db.items(region)) == want, region

    @invariant()
    def seqno_counts_replicated_transactions(self):
        assert self.db.seqno == self.seqno

    @invariant()
    def journal_seqnos_are_contiguous(self):
        assert [r.seqno for r in iter_records(self.db.layout.journal)] == list(range(1, self.seqno + 1))


Engine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
TestEngine = Engine.TestCase
