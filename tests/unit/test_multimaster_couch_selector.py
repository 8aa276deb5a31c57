"""The Mango selector matcher of ``_changes?filter=_selector`` (``multimaster/couch_selector.py``):
CouchDB's meaning on examples, clear 400s for what it does not take, and under Hypothesis: any JSON
value as a selector either compiles or is refused with a CouchError (never another exception), a
compiled selector answers for any document without raising, the combinations are the logic they name,
a document's own values select it, and the collation is a total order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.multimaster.couch_errors import CouchError
from multisite.multimaster.couch_selector import collate, compile_selector

DOC = {"_id": "p1", "_rev": "1-" + "a" * 32, "type": "person", "age": 36, "name": "Ada",
       "tags": ["math", "poetry"], "address": {"city": "London", "zip": None}, "active": True}


@pytest.mark.parametrize("sel,want", [
    ({"type": "person"}, True),
    ({"type": "place"}, False),
    ({"age": {"$gt": 30, "$lte": 36}}, True),
    ({"age": {"$lt": 36}}, False),
    ({"age": {"$gte": 36.0}}, True),
    ({"age": {"$ne": 36}}, False),
    ({"missing": {"$ne": 1}}, False),  # as CouchDB: a condition on an absent field is false
    ({"missing": {"$exists": False}}, True),
    ({"address.zip": {"$exists": True}}, True),
    ({"address.city": "London"}, True),
    ({"address": {"city": "London"}}, True),  # nested selector syntax
    ({"address": {"city": {"$in": ["Paris", "London"]}}}, True),
    ({"tags": {"$in": ["poetry"]}}, True),  # $in looks at an array's elements
    ({"tags": {"$nin": ["poetry"]}}, False),
    ({"tags": ["math", "poetry"]}, True),
    ({"$or": [{"type": "place"}, {"age": 36}]}, True),
    ({"$and": [{"type": "person"}, {"age": {"$lt": 10}}]}, False),
    ({"$nor": [{"type": "place"}, {"age": 1}]}, True),
    ({"$not": {"type": "person"}}, False),
    ({"name": {"$gt": 5}}, True),  # collation: every string after every number
    ({"active": {"$lt": 0}}, True),  # true before numbers
    ({"_id": {"$gte": "p"}, "_rev": {"$exists": True}}, True),
    ({}, True),
])
def test_selectors_mean_what_couchdb_says(sel, want):
    assert compile_selector(sel).matches(DOC) is want


@pytest.mark.parametrize("sel,words", [
    ({"name": {"$regex": "^A"}}, "operator $regex is not supported"),
    ({"tags": {"$elemMatch": {"$eq": 1}}}, "operator $elemMatch is not supported"),
    ({"$and": {"a": 1}}, "$and takes a list of selectors"),
    ({"$not": [1]}, "$not takes a selector"),
    ({"a": {"$in": 1}}, "$in takes a list"),
    ({"a": {"$exists": "yes"}}, "$exists takes true or false"),
    ({"$gt": 1}, "$gt applies to a field"),
    ({"a..b": 1}, "has an empty part"),
    ([1], "a selector is a JSON object"),
])
def test_what_it_does_not_take_is_a_400_naming_it(sel, words):
    with pytest.raises(CouchError) as e:
        compile_selector(sel)
    assert e.value.status == 400 and e.value.error == "invalid_selector" and words in e.value.reason


def test_a_selector_nested_too_deep_is_refused():
    sel: dict = {"a": 1}
    for _ in range(40):
        sel = {"$and": [sel]}
    with pytest.raises(CouchError, match="nested deeper"):
        compile_selector(sel)


json_scalars = st.none() | st.booleans() | st.integers(-10, 10) | st.floats(-10, 10, allow_nan=False) | \
    st.sampled_from(["", "a", "b", "ab", "é"])
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.sampled_from(["a", "b", "c"]), c, max_size=3), max_leaves=8)
keys = st.sampled_from(["a", "b", "c", "a.b", "$eq", "$ne", "$gt", "$lt", "$gte", "$lte", "$in", "$nin",
                        "$exists", "$and", "$or", "$nor", "$not", "$regex", "$size", ""])
any_selector = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(keys, c, max_size=3),
                            max_leaves=12)
docs = st.dictionaries(st.sampled_from(["a", "b", "c"]), json_values, max_size=3)


@settings(max_examples=500, deadline=None)
@given(any_selector, docs)
def test_any_selector_compiles_or_is_refused_and_any_document_gets_an_answer(sel, doc):
    try:
        m = compile_selector(sel)
    except CouchError as e:
        assert e.status == 400 and e.reason
        return
    assert m.matches(doc) in (True, False)


field_conds = st.fixed_dictionaries({}, optional={
    "$eq": json_values, "$ne": json_values, "$gt": json_values, "$lt": json_values, "$exists": st.booleans(),
    "$in": st.lists(json_values, max_size=3)}).filter(bool)
simple = st.dictionaries(st.sampled_from(["a", "b", "c"]), field_conds, min_size=1, max_size=2)


@settings(max_examples=300, deadline=None)
@given(simple, simple, docs)
def test_combinations_are_the_logic_they_name(s1, s2, doc):
    a, b = compile_selector(s1).matches(doc), compile_selector(s2).matches(doc)
    assert compile_selector({"$and": [s1, s2]}).matches(doc) == (a and b)
    assert compile_selector({"$or": [s1, s2]}).matches(doc) == (a or b)
    assert compile_selector({"$nor": [s1, s2]}).matches(doc) == (not (a or b))
    assert compile_selector({"$not": s1}).matches(doc) == (not a)


@settings(max_examples=300, deadline=None)
@given(docs)
def test_a_documents_own_values_select_it(doc):
    assert compile_selector({k: {"$eq": v} for k, v in doc.items()}).matches(doc)
    assert compile_selector({k: {"$gte": v, "$lte": v, "$exists": True} for k, v in doc.items()}).matches(doc)
    assert compile_selector({k: {"$in": v if isinstance(v, list) and v else [v]}  # an array: by its elements
                             for k, v in doc.items() if v != []}).matches(doc)
    assert not any(compile_selector({k: {"$ne": v}}).matches(doc) for k, v in doc.items())


@settings(max_examples=300, deadline=None)
@given(json_values, json_values, json_values)
def test_collation_is_a_total_order(a, b, c):
    assert collate(a, a) == 0
    assert collate(a, b) == -collate(b, a)
    if collate(a, b) <= 0 and collate(b, c) <= 0:
        assert collate(a, c) <= 0


def test_an_operators_value_nested_past_the_bound_is_refused_so_matching_never_recurses_too_deep():
    deep_doc: object = 1
    deep_arg: object = 1
    for _ in range(400):  # a document nested as deep as the argument: collate would follow both down
        deep_doc, deep_arg = {"a": deep_doc}, {"a": deep_arg}
    for sel in ({"v": {"$eq": deep_arg}}, {"v": {"$lte": [deep_arg]}}, {"v": {"$nin": [deep_arg]}}, {"v": [deep_arg]}):
        with pytest.raises(CouchError, match="nested deeper") as e:
            compile_selector(sel)
        assert e.value.status == 400
    shallow: object = 1
    for _ in range(20):
        shallow = {"a": shallow}
    assert compile_selector({"v": {"$eq": shallow}}).matches({"v": deep_doc}) is False
