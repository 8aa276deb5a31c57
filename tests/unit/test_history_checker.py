"""The history checker (testing/history, issue 28): each anomaly in a hand-made history is found, a
clean one passes, and under Hypothesis any history of a linearizable register store passes while a
fault injected into it (a write dropped, a refused one shown, one applied twice, a read served old) is
found."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.testing import history
from multisite.testing.history import (DUPLICATE, FAIL, LOST, OK, PHANTOM, READ, STALE_READ, UNKNOWN, WRITE, Op,
                                       Recorder, check)


def w(client, key, value, outcome, t0, t1):
    return Op(client, WRITE, key, value, outcome, t0, t1)


def r(client, key, value, t0, t1, outcome=OK):
    return Op(client, READ, key, value, outcome, t0, t1)


def kinds(report):
    return sorted(a.kind for a in report.anomalies)


def test_a_clean_history_passes():
    h = [w("c1", "k", 1, OK, 0, 1), w("c1", "k", 2, OK, 2, 3), r("c1", "k", 2, 4, 5),
         w("c2", "j", 7, FAIL, 0, 1), w("c2", "j", 8, UNKNOWN, 2, 3)]
    rep = check(h, {"k": 2}, applied=[("k", 1), ("k", 2)])
    assert rep.anomalies == [] and rep.ops == 5
    rep.assert_clean()


def test_an_acknowledged_write_absent_from_the_final_state_is_lost():
    rep = check([w("c1", "k", 1, OK, 0, 1)], {})
    assert kinds(rep) == [LOST]
    with pytest.raises(AssertionError, match="lost"):
        rep.assert_clean()


def test_a_final_value_older_than_an_acknowledged_write_makes_it_lost():
    rep = check([w("c1", "k", 1, OK, 0, 1), w("c1", "k", 2, OK, 2, 3)], {"k": 1})
    assert kinds(rep) == [LOST] and rep.anomalies[0].value == 2


def test_a_concurrent_or_later_unknown_write_may_overwrite_an_acknowledged_one():
    h = [w("c1", "k", 1, OK, 0, 3), w("c2", "k", 2, OK, 1, 2), w("c1", "k", 3, UNKNOWN, 4, 5)]
    assert check(h, {"k": 2}).anomalies == []  # 2 ran beside 1: either order is allowed
    assert check(h, {"k": 3}).anomalies == []  # 3 came after both, its outcome unknown


def test_an_unknown_write_that_returned_before_an_acknowledged_one_cannot_end_on_top():
    h = [w("c1", "k", 1, UNKNOWN, 0, 1), w("c1", "k", 2, OK, 2, 3)]
    assert kinds(check(h, {"k": 1})) == [LOST]


def test_an_excused_write_is_counted_not_reported():
    rep = check([w("c1", "k", 1, OK, 0, 1)], {}, excused={1})
    assert rep.anomalies == [] and rep.excused == 1


def test_a_refused_write_visible_in_the_final_state_is_a_phantom():
    rep = check([w("c1", "k", 1, FAIL, 0, 1)], {"k": 1})
    assert kinds(rep) == [PHANTOM] and "refused" in rep.anomalies[0].detail


def test_a_value_never_written_is_a_phantom_wherever_it_shows():
    assert kinds(check([], {"k": 9})) == [PHANTOM]
    assert kinds(check([], {}, applied=[("k", 9)])) == [PHANTOM]
    assert kinds(check([r("c1", "k", 9, 0, 1)], {})) == [PHANTOM]
    assert check([], {"k": 9}, initial={"k": 9}).anomalies == []


def test_a_refused_write_in_a_log_is_a_phantom():
    rep = check([w("c1", "k", 1, FAIL, 0, 1)], {}, applied=[("k", 1)])
    assert kinds(rep) == [PHANTOM]


def test_a_write_applied_twice_is_a_duplicate():
    rep = check([w("c1", "k", 1, OK, 0, 1)], {"k": 1}, applied=[("k", 1), ("k", 1)])
    assert kinds(rep) == [DUPLICATE] and "2 times" in rep.anomalies[0].detail


def test_a_read_older_than_the_clients_own_acknowledged_write_is_stale():
    h = [w("c1", "k", 1, OK, 0, 1), w("c1", "k", 2, OK, 2, 3), r("c1", "k", 1, 4, 5)]
    rep = check(h, {"k": 2})
    assert kinds(rep) == [STALE_READ]


def test_a_read_of_nothing_after_the_clients_own_acknowledged_write_is_stale():
    h = [w("c1", "k", 1, OK, 0, 1), r("c1", "k", None, 2, 3)]
    assert kinds(check(h, {"k": 1})) == [STALE_READ]


def test_reads_that_may_see_an_older_value_are_not_stale():
    h = [w("c1", "k", 1, OK, 0, 1), w("c2", "k", 2, OK, 2, 3),
         r("c1", "k", 1, 4, 5),  # c2's write is not c1's own
         w("c1", "k", 3, OK, 6, 9), r("c1", "k", 1, 7, 8),  # during c1's write of 3, before its answer
         r("c1", "k", 5, 10, 11, outcome=UNKNOWN)]  # a read that never returned
    assert check(h, {"k": 3}).anomalies == []


def test_a_stale_read_of_an_excused_write_is_counted():
    h = [w("c1", "k", 1, OK, 0, 1), r("c1", "k", None, 2, 3)]
    rep = check(h, {}, excused={1})
    assert rep.anomalies == [] and rep.excused == 2


def test_keys_limits_the_check_to_the_rounds_own_keys():
    assert check([w("c1", "k", 1, OK, 0, 1)], {"k": 1, "other": 5}, keys=["k"]).anomalies == []


def test_a_malformed_history_is_refused():
    with pytest.raises(ValueError, match="twice"):
        check([w("c1", "k", 1, OK, 0, 1), w("c2", "k", 1, OK, 0, 1)], {})
    with pytest.raises(ValueError):
        Op("c1", "append", "k", 1, OK, 0, 1)
    with pytest.raises(ValueError):
        Op("c1", WRITE, "k", 1, "maybe", 0, 1)


def test_the_recorder_keeps_invocations_outcomes_and_pending_calls():
    t = iter(range(100))
    rec = Recorder(clock=lambda: float(next(t)))
    a = rec.invoke("c1", WRITE, "k", 1)
    b = rec.invoke("c1", READ, "k")
    c = rec.invoke("c2", WRITE, "k", 2)
    rec.ok(a)
    rec.ok(b, 1, read=True)
    with pytest.raises(ValueError):
        rec.fail(a)
    h = rec.history()
    assert [(o.kind, o.value, o.outcome, o.invoke_t, o.complete_t) for o in h] == [
        (WRITE, 1, OK, 0.0, 3.0), (READ, 1, OK, 1.0, 4.0), (WRITE, 2, UNKNOWN, 2.0, float("inf"))]
    assert len(rec) == 3 and c == 2


def test_the_checker_does_no_io():
    src = Path(history.__file__).parent
    for name in ("checker.py", "model.py"):
        tree = ast.parse((src / name).read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        banned = {"time", "threading", "socket", "asyncio", "os", "pathlib", "subprocess"}
        assert not {m.split(".")[0] for m in mods} & banned, (name, mods)


# -- Hypothesis: a linearizable store's histories pass; a fault injected into one is found ----------

@st.composite
def linear_runs(draw):
    """A register store run by clients: each call takes effect (or not) at one instant between its
    invocation and completion; returns (history, final, applied log)."""
    n = draw(st.integers(1, 30))
    store, applied, ops, t, v = {}, [], [], 0.0, 0
    for _ in range(n):
        client = draw(st.sampled_from(["c1", "c2", "c3"]))
        key = draw(st.sampled_from(["a", "b"]))
        t0 = t = t + draw(st.floats(0.1, 1.0))
        t1 = t = t + draw(st.floats(0.1, 1.0))
        if draw(st.booleans()):
            v += 1
            outcome = draw(st.sampled_from([OK, OK, FAIL, UNKNOWN]))
            if outcome == OK or (outcome == UNKNOWN and draw(st.booleans())):
                store[key] = v
                applied.append((key, v))
            ops.append(w(client, key, v, outcome, t0, t1))
        else:
            ops.append(r(client, key, store.get(key), t0, t1))
    return ops, store, applied


@settings(max_examples=300, deadline=None)
@given(linear_runs())
def test_histories_of_a_linearizable_store_pass(run):
    ops, final, applied = run
    assert check(ops, final, applied=applied).anomalies == []


@settings(max_examples=300, deadline=None)
@given(linear_runs(), st.data())
def test_a_fault_injected_into_a_clean_history_is_found(run, data):
    ops, final, applied = run
    fault = data.draw(st.sampled_from([LOST, PHANTOM, DUPLICATE, STALE_READ]))
    final, applied = dict(final), list(applied)
    if fault == LOST:
        acked = [o for o in ops if o.kind == WRITE and o.outcome == OK and final.get(o.key) == o.value]
        if not acked:
            return
        del final[data.draw(st.sampled_from(acked)).key]
    elif fault == PHANTOM:
        final["a"] = -1
    elif fault == DUPLICATE:
        if not applied:
            return
        applied.append(data.draw(st.sampled_from(applied)))
    else:
        mine = [o for o in ops if o.kind == WRITE and o.outcome == OK]
        if not mine:
            return
        o = data.draw(st.sampled_from(mine))
        end = max(x.complete_t for x in ops)
        ops = ops + [r(o.client, o.key, None, end + 1, end + 2)]
    assert fault in {a.kind for a in check(ops, final, applied=applied).anomalies}
