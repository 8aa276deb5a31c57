"""Replication filters, pure part: documents, codecs, the checks of answers, rebuilt frame runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multisite
from multisite.errors import ConfigError, FilterError
from multisite.journal.reader import iter_records
from multisite.journal.records import KILL, SET, ZKILL, FrameRun, Record, Update, encode_record
from multisite.replication.filters import (JSON, MSGPACK, AnswerReader, FilterSpec, decode_run, encode_message,
                                           filter_run, function_answerer)
from multisite.testing.filters import downgrade_person, drop_updates, identity, upgrade_person
from multisite.values import encode_value

INT64 = st.integers(-(2**63), 2**63 - 1)
scalars = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
docs = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                        max_size=3), max_leaves=8)
present = docs.filter(lambda v: v is not None)
keys = st.lists(st.text(max_size=5) | st.integers(-1000, 10**12), min_size=1, max_size=3).map(tuple)
regions = st.sampled_from(["acct", "people", "r"])


def _enc(v):
    return None if v is None else encode_value(v)


updates = st.one_of(
    st.builds(lambda r, k, v, b: Update(SET, r, k, _enc(v), _enc(b)), regions, keys, present, docs),
    st.builds(lambda r, k, b: Update(ZKILL, r, k, None, _enc(b)), regions, keys, docs),
    st.builds(lambda r, k, kv: Update(KILL, r, k, None, None, [(kk, encode_value(v)) for kk, v in kv]),
              regions, keys, st.lists(st.tuples(keys, present), max_size=3)),
)


@st.composite
def runs(draw) -> tuple[list[Record], FrameRun]:
    first = draw(st.integers(1, 10**9))
    recs = [Record(first + i, draw(st.integers(0, 3)), draw(st.integers(0, 10**6)), draw(st.sampled_from("AB")),
                   draw(st.floats(0, 2e9)), draw(st.lists(updates, max_size=4)))
            for i in range(draw(st.integers(1, 6)))]
    return recs, FrameRun.of([(r.seqno, encode_record(r)) for r in recs])


def through_codec(fn, fmt: str):
    """An answerer that does what an external filter's pipes do: documents encoded, answers read back."""
    def answer(first_seqno, docs_):
        reader = AnswerReader(fmt)
        reader.expect(first_seqno)
        wire = b"".join(encode_message(fn(d), fmt) for d in docs_)
        out = []
        for i in range(0, len(wire), 7):  # in small pieces: answers split across reads
            out += reader.feed(wire[i:i + 7])
        return out
    return answer


@settings(max_examples=150, deadline=None)
@given(runs(), st.sampled_from(["function", JSON, MSGPACK]))
def test_an_identity_filter_leaves_random_transactions_byte_for_byte(case, how):
    recs, run = case
    answer = function_answerer(identity, "id") if how == "function" else through_codec(identity, how)
    out = filter_run(run, answer)
    assert (out.first_seqno, out.data, out.ends) == (run.first_seqno, run.data, run.ends)
    assert decode_run(out) == recs


@settings(max_examples=100, deadline=None)
@given(runs(), st.sampled_from(["function", JSON, MSGPACK]))
def test_a_filter_that_drops_updates_gives_empty_transactions_with_their_seqnos(case, how):
    recs, run = case
    answer = function_answerer(drop_updates, "drop") if how == "function" else through_codec(drop_updates, how)
    out = decode_run(filter_run(run, answer))
    assert [(r.seqno, r.stream, r.stream_seqno, r.origin, r.time) for r in out] == \
        [(r.seqno, r.stream, r.stream_seqno, r.origin, r.time) for r in recs]
    assert all(r.updates == [] for r in out)


def test_empty_transactions_take_their_seqnos_on_the_secondary(tmp_path):
    multisite.create(tmp_path / "B", name="B")
    recs = [Record(i, 0, 0, "A", 1.0, [Update(SET, "acct", ("k", i), encode_value(i))]) for i in (1, 2, 3)]
    run = FrameRun.of([(r.seqno, encode_record(r)) for r in recs])
    out = filter_run(run, function_answerer(drop_updates, "drop"))
    with multisite.open(tmp_path / "B") as db:
        assert db.apply_frames([out]) == 3
        assert db.seqno == 3 and "acct" not in db.regions()  # nothing reached the store
    assert [(r.seqno, r.updates) for r in iter_records(tmp_path / "B" / "journal")] == [(1, []), (2, []), (3, [])]
    with multisite.open(tmp_path / "B") as db:  # and after recovery on open
        assert db.seqno == 3


def test_empty_transactions_take_their_seqnos_on_a_supplementary_instance(tmp_path):
    """SI re-frames what it receives: a transaction a filter emptied must still take a local seqno and
    its stream seqno, else the next one is a gap and the stream never moves past the empty one."""
    multisite.create(tmp_path / "P", name="P", supplementary=True)
    recs = [Record(i, 0, 0, "A", 1.0, [Update(SET, "acct", ("k", i), encode_value(i))]) for i in (1, 2, 3)]
    run = filter_run(FrameRun.of([(r.seqno, encode_record(r)) for r in recs]),
                     function_answerer(lambda d: d if d["seqno"] == 3 else dict(d, updates=[]), "drop"))
    with multisite.open(tmp_path / "P") as db:
        db.apply_records(decode_run(run), si_stream=2)
        assert (db.seqno, db.stream_seqno(2)) == (3, 3)
        assert db.get("acct", ("k", 3)) == 3
    assert [(r.seqno, r.stream, r.stream_seqno, len(r.updates)) for r in iter_records(tmp_path / "P" / "journal")] \
        == [(1, 2, 1, 0), (2, 2, 2, 0), (3, 2, 3, 1)]
    with multisite.open(tmp_path / "P") as db:  # and after recovery on open
        assert (db.seqno, db.stream_seqno(2)) == (3, 3)


def _run(*recs: Record) -> FrameRun:
    return FrameRun.of([(r.seqno, encode_record(r)) for r in recs])


def _rec(seqno: int, value=None) -> Record:
    return Record(seqno, 0, 0, "A", 1.0, [Update(SET, "people", ("p", seqno), encode_value(value or {"n": seqno}))])


@pytest.mark.parametrize("answers, match", [
    (lambda f, d: [dict(x, seqno=x["seqno"] + 1) for x in d], "out of step: it answered seqno 6 for seqno 5"),
    (lambda f, d: d[:1], "answered 1 transaction.* for 2 .*out of step at seqno 6"),
    (lambda f, d: d + d[:1], "answered 3 transaction.* for 2"),
    (lambda f, d: [d[0], "x"], "answered seqno 6 with a str"),
    (lambda f, d: [d[0], {"seqno": 6}], "seqno 6 without an 'updates' list"),
    (lambda f, d: [d[0], dict(d[1], updates=[{"op": "set", "region": "r", "key": ["k"]}])], "seqno 6.*needs a value"),
    (lambda f, d: [d[0], dict(d[1], updates=[{"op": "put", "region": "r", "key": ["k"]}])], "seqno 6.*'put'"),
    (lambda f, d: [d[0], dict(d[1], updates=[{"op": "zkill", "region": "r", "key": [1.5]}])], "seqno 6.*key"),
    (lambda f, d: [d[0], dict(d[1], updates=[{"op": "set", "region": "r", "key": ["k"], "value": {1j}}])],
     "seqno 6"),
])
def test_answers_out_of_step_or_malformed_are_refused_naming_the_seqno(answers, match):
    with pytest.raises(FilterError, match=match):
        filter_run(_run(_rec(5), _rec(6)), answers)


def test_a_function_that_raises_names_the_seqno():
    def boom(doc):
        if doc["seqno"] == 6:
            raise KeyError("name")
        return doc
    with pytest.raises(FilterError, match="raised KeyError.*on seqno 6"):
        filter_run(_run(_rec(5), _rec(6)), function_answerer(boom, "f"))


def test_the_answer_reader_refuses_empty_lines_garbage_and_surplus():
    r = AnswerReader(JSON, "f")
    r.expect(10)
    with pytest.raises(FilterError, match="empty line for seqno 10"):
        r.feed(b"\n")
    r = AnswerReader(JSON, "f")
    r.expect(10)
    assert r.feed(b'{"seqno": 10, "updates": []}\n{"seqno"') == [{"seqno": 10, "updates": []}]
    with pytest.raises(FilterError, match="more answers than transactions"):
        r.expect(11)
    r = AnswerReader(JSON, "f")
    r.expect(3)
    with pytest.raises(FilterError, match="seqno 3 with malformed JSON"):
        r.feed(b"not json\n")
    r = AnswerReader(MSGPACK, "f")
    r.expect(3)
    with pytest.raises(FilterError, match="seqno 3 claims"):
        r.feed(b"\xff\xff\xff\xff")


def test_the_rolling_upgrade_shapes_round_trip_values_and_before_images():
    old = {"seqno": 1, "updates": [
        {"op": "set", "region": "people", "key": ["p", 1], "value": {"name": "Ann Lee", "age": 40},
         "before": {"name": "Ann Smith", "age": 39}},
        {"op": "kill", "region": "people", "key": ["q"], "killed": [[["q", 1], {"name": "Bo Tan"}]]},
        {"op": "set", "region": "other", "key": ["x"], "value": {"name": "not a person"}, "before": None}]}
    new = upgrade_person({**old, "updates": [dict(u) for u in old["updates"]]})
    assert new["updates"][0]["value"] == {"age": 40, "first": "Ann", "last": "Lee"}
    assert new["updates"][0]["before"] == {"age": 39, "first": "Ann", "last": "Smith"}
    assert new["updates"][1]["killed"] == [[["q", 1], {"first": "Bo", "last": "Tan"}]]
    assert new["updates"][2]["value"] == {"name": "not a person"}
    back = downgrade_person(new)
    assert back["updates"][0]["value"] == {"age": 40, "name": "Ann Lee"}
    assert back["updates"][0]["before"] == {"age": 39, "name": "Ann Smith"}


def test_filter_specs_tell_functions_from_commands():
    f = FilterSpec.parse("myapp.filters:upgrade")
    assert f.in_process and f.function == "myapp.filters:upgrade" and f.argv == ()
    c = FilterSpec.parse("python3 '/opt/my filters/up.py' --fast", fmt=MSGPACK, timeout_s=2)
    assert not c.in_process and c.argv == ("python3", "/opt/my filters/up.py", "--fast") and c.fmt == MSGPACK
    assert FilterSpec.parse("/usr/bin/filter").argv == ("/usr/bin/filter",)
    for bad in ({"text": ""}, {"text": "x", "fmt": "xml"}, {"text": "x", "timeout_s": 0}, {"text": "a 'b"}):
        with pytest.raises(ConfigError):
            FilterSpec.parse(**bad)
