"""Model-based: 3-5 replicas of one document database, random creates, updates and deletes on each,
random sessions in random modes between random pairs; then full-mesh pull-push sessions until one
round moves nothing. Every replica then holds the same documents, conflict documents included, and
no version made anywhere is lost: it is an ancestor of the final document (itself or merged in), or
of a version kept in a conflict document, or the document ended deleted (Domino's deletion rule; likewise a deletion beaten by a
newer update is undone).

The replicas are real document databases (engine instances, durability none for speed), replicated
by the real session code in the same process (``run_local``); clock and randomness come from the seed.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings, strategies as st

import multisite.documents as documents
from multisite.multimaster.conflicts import knows
from multisite.multimaster.document import REF_FIELD
from multisite.multimaster.session import Mode, run_local

FIELDS = ("a", "b", "c")
op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 4), st.sampled_from(["M", "P"])),
    st.tuples(st.just("update"), st.integers(0, 4), st.integers(0, 50), st.sampled_from(FIELDS), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("session"), st.integers(0, 4), st.integers(0, 4), st.sampled_from(list(Mode))),
)


def _state(db) -> list:
    return sorted(d.to_value() for d in db.documents(include_deleted=True))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(n=st.integers(3, 5), ops=st.lists(op, min_size=5, max_size=40), seed=st.integers(0, 2**32))
def test_replicas_converge_and_lose_no_update(tmp_path_factory, n, ops, seed):
    root = tmp_path_factory.mktemp("mm")
    rng = random.Random(seed)
    tick = [1_000_000]

    def clock():
        tick[0] += rng.choice([0, 1, 5])  # collisions on purpose: same-µs edits on two replicas
        return tick[0]

    first = documents.create(root / "r0", "T", durability="none", clock=clock, rand=lambda: rng.getrandbits(64))
    first.define_form("M", merge=True)
    dbs = [first] + [documents.create(root / f"r{i}", "T", replica_id=first.replica_id, durability="none",
                                      clock=clock, rand=lambda: rng.getrandbits(64)) for i in range(1, n)]
    seen = {}  # every version that ever existed anywhere: (unid, time, origin) -> Doc

    def observe():
        for db in dbs:
            for d in db.documents(include_deleted=True):
                seen[(d.unid, d.time_us, d.origin)] = d

    try:
        for o in ops:
            if o[0] == "create":
                dbs[o[1] % n].create(o[2], {f: 0 for f in FIELDS})
            elif o[0] in ("update", "delete"):
                db = dbs[o[1] % n]
                live = [d.unid for d in db.documents() if not d.is_conflict]
                if not live:
                    continue
                unid = live[o[2] % len(live)]
                if o[0] == "update":
                    db.update(unid, {o[3]: o[4]})
                else:
                    db.delete(unid)
            else:
                i, j = o[1] % n, o[2] % n
                if i != j:
                    run_local(dbs[i], dbs[j], o[3])
            observe()
        for _round in range(8):
            moved = 0
            for i in range(n):
                for j in range(n):
                    if i != j:
                        t = run_local(dbs[i], dbs[j], Mode.PULL_PUSH).totals()
                        moved += sum(v for k, v in t.items() if k != "unchanged")
            observe()
            if moved == 0:
                break
        assert moved == 0, "full-mesh sessions did not settle"
        states = [_state(db) for db in dbs]
        assert all(s == states[0] for s in states), "replicas differ after the full mesh"
        final = {d.unid: d for d in dbs[0].documents(include_deleted=True)}
        kept = {}  # unid -> versions kept in conflict documents
        for d in final.values():
            if d.is_conflict and not d.deleted:  # (a deleted one records a dropped version)
                loser = seen.get((d.fields[REF_FIELD], d.time_us, d.origin))
                assert loser is not None, f"conflict document {d.unid} names no version that existed"
                kept.setdefault(loser.unid, []).append(loser)
        stubs = {}
        for v in seen.values():
            if v.deleted:
                stubs.setdefault(v.unid, []).append(v)
        for (unid, _t, _o), v in seen.items():
            if v.is_conflict or v.deleted:  # a deletion beaten by a newer update is undone (Domino's rule)
                continue
            doc = final.get(unid)
            assert doc is not None, f"document {unid} vanished"
            if doc.deleted or knows(doc, v.stamp):
                continue
            if any(knows(d, v.stamp) for d in stubs.get(unid, [])):
                continue  # its own line deleted it later (and that deletion may have lost to a newer update)
            assert any(knows(k, v.stamp) for k in kept.get(unid, [])), f"version {v.stamp} of {unid} was lost"
    finally:
        for db in dbs:
            db.close()
