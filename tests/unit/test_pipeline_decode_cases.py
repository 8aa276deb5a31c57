"""Edge cases of the pipeline's decoding, without Spark: real instances, decoded the way a Spark task does."""

from __future__ import annotations

import datetime as dt
import json

import pytest

pytest.importorskip("pyarrow")

import multisite  # noqa: E402
from multisite.instance.layout import Layout  # noqa: E402
from multisite.pipeline import columns as C  # noqa: E402
from multisite.pipeline.compare import _readable  # noqa: E402
from multisite.pipeline.plan import chunks, instance_ref  # noqa: E402
from multisite.pipeline.segment_index import chunk_batches, journal_schema  # noqa: E402
from multisite.pipeline.state_source import RangePartition, plan_ranges, read_range  # noqa: E402


def journal_rows(root, columns, *, regions=None, index="off", **kw) -> list[dict]:
    """The rows of ``format("multisite")`` for ``columns``, as one Spark task would make them."""
    ref = instance_ref(str(root))
    fields = C.merge_fields(sorted((r, s) for r, s in ref.region_schemas.items() if regions is None or r in regions))
    target = journal_schema(columns, fields)
    out = []
    for c in chunks(ref, 1, None, index=index, **kw):
        for b in chunk_batches(c, target, regions=regions, region_schemas=ref.region_schemas, fields=fields):
            out.extend(b.to_pylist())
    return out


def state_rows(root, columns) -> list[dict]:
    """The rows of ``format("multisite_state")`` for ``columns``: one key range per region, read as a task does."""
    ref = instance_ref(str(root))
    store = str(Layout.existing(str(root)).store_file)
    out = []
    for rng in plan_ranges(ref.name, store, None, 1000):
        fields = ref.region_schemas.get(rng.region, {})
        part = RangePartition(rng, tuple(fields), fields)
        for b in read_range(part, journal_schema(columns, fields)):
            out.extend(b.to_pylist())
    return out


# -- values whose dict keys JSON does not take --------------------------------------------------------
ODD = {True: 1, None: [{False: "f"}], (1, "a"): {"in": {None: 2}}, "s": 3, 7: b"\x01", 1.5: None}
ODD_JSON = {"true": 1, "null": [{"false": "f"}], '[1,"a"]': {"in": {"null": 2}}, "s": 3, "7": "AQ==", "1.5": None}


def test_values_with_bool_none_or_tuple_dict_keys_have_a_json_form(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r", schema='{"s": "long"}')
        db.set("r", ("k",), ODD)
        db.set("r", ("j",), {"plain": 1})
        db.set("r", ("k",), {None: "second"})  # before: the odd value
        db.kill("r", ("j",))
        db.kill("r", ("k",))  # a kill's before: [[subscripts], value] per node
    out = journal_rows(root, ["seqno", "op", "value", "before"])
    assert [json.loads(r["value"]) if r["value"] else None for r in out] == \
        [ODD_JSON, {"plain": 1}, {"null": "second"}, None, None]
    assert json.loads(out[2]["before"]) == ODD_JSON
    assert json.loads(out[4]["before"]) == [[["k"], {"null": "second"}]]
    # the value column of a read with typed fields (values decoded once for both) takes the same path
    typed = journal_rows(root, ["value", "fields"])
    assert [r["value"] for r in typed] == [r["value"] for r in out] and typed[0]["fields"] == {"s": 3}


def test_state_source_and_verify_samples_render_such_values_alike(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r", schema='{"s": "long"}')
        db.set("r", ("k",), ODD)
        db.set("r", ("p",), "plain")
        raw = db.get("r", ("k",))
    got = {r["key_text"]: r for r in state_rows(root, ["key_text", "value", "value_raw", "fields"])}
    assert json.loads(got['("k")']["value"]) == ODD_JSON and got['("k")']["fields"] == {"s": 3}
    assert json.loads(got['("p")']["value"]) == "plain"
    assert raw == ODD
    row = _readable({"value_raw_a": got['("k")']["value_raw"], "value_raw_b": None})
    assert json.loads(row["value_a"]) == ODD_JSON and row["value_b"] is None


def test_a_key_json_takes_keeps_its_rendering_whichever_path_a_value_takes():
    import msgspec

    from multisite.pipeline.decode import value_json

    plain = {"a": 1, 7: 2, 1.5: 3, b"k": [4, {"n": 5}]}
    assert value_json({**plain, None: 0}) == msgspec.json.encode(plain)[:-1] + b',"null":0}'
    assert value_json({True: 1, "true": 2}) == b'{"true":1,"true":2}'  # like json.dumps: both kept
    assert value_json({(1, (2, b"x")): 0}) == b'{"[1,[2,\\"eA==\\"]]":0}'


# -- regions declaring one field with different types -------------------------------------------------
def test_a_read_of_one_region_rebuilds_fields_when_pieces_hold_none(tmp_path):
    # a and b disagree on n: pieces carry no ``fields``; a read of a alone still has a typed n
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(root) as db:
        db.create_region("a", schema='{"n": "long"}')
        db.create_region("b", schema='{"n": "string"}')
        db.set("a", ("x",), {"n": 5})
        db.set("b", ("y",), {"n": "five"})
        for i in range(60):  # seal the first segment: a read writes its piece
            db.set("b", ("pad", i), {"n": "x" * 100})
        db.set("a", ("z",), {"n": 6})
    a = frozenset({"a"})
    want = [{"seqno": 1, "fields": {"n": 5}}, {"seqno": 63, "fields": {"n": 6}}]
    assert journal_rows(root, ["seqno", "fields"], regions=a) == want
    assert journal_rows(root, ["seqno", "fields"], regions=a, index="auto") == want  # writes pieces
    assert len(list(Layout.existing(str(root)).journal.glob("index/*.parquet"))) >= 1
    assert journal_rows(root, ["seqno", "fields"], regions=a, index="read") == want  # reads them
    b = journal_rows(root, ["seqno", "fields"], regions=frozenset({"b"}), index="read")
    assert b[0] == {"seqno": 2, "fields": {"n": "five"}} and len(b) == 61


# -- timestamp fields out of range ------------------------------------------------------------------
def test_a_timestamp_field_out_of_range_is_null_in_both_sources(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    given = {"ok": 1_700_000_000, "iso": "2024-05-01T12:00:00+02:00", "big": 10**15, "huge": 2**64 - 1,
             "nan": float("nan"), "inf": float("inf"), "early": -1e12, "year0": "0001-01-01T00:00:00+05:00",
             "year10000": "9999-12-31T23:00:00-05:00"}
    with multisite.open(root) as db:
        db.create_region("ev", schema='{"t": "timestamp"}')
        for k, t in given.items():
            db.set("ev", (k,), {"t": t})
    utc = dt.timezone.utc
    want = {f'("{k}")': None for k in given}
    want['("ok")'] = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=utc)
    want['("iso")'] = dt.datetime(2024, 5, 1, 10, 0, tzinfo=utc)
    journal = journal_rows(root, ["key_text", "fields"])
    state = state_rows(root, ["key_text", "fields"])
    for got in (journal, state):
        assert {r["key_text"]: r["fields"]["t"] for r in got} == want
