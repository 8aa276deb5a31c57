"""Mango selectors for ``_changes?filter=_selector`` (a replication's ``selector``). Pure.

``compile_selector(sel)`` checks a selector once and returns a ``Matcher``; ``matches(doc)`` then
answers for a document's CouchDB body (``_id``, ``_rev``, ``_deleted`` and its members), so a feed
checks each row without parsing the selector again, and a fuzzer can drive both halves alone.

What is understood (CouchDB's meaning): a field name (dotted for nested objects: ``"a.b"``, or nested
selectors ``{"a": {"b": 1}}``) with a value (equality) or an object of operators ``$eq $ne $gt $gte
$lt $lte $in $nin $exists``; the combinations ``$and $or $nor`` (lists of selectors) and ``$not`` (a
selector). Several members of one object must all hold. As in CouchDB, a condition on a field the
document lacks is false (``$exists: false`` aside), ``$in``/``$nin`` on an array field look at its
elements, and comparisons follow CouchDB's collation: null < false < true < numbers < strings <
arrays < objects (strings by code point here; CouchDB uses ICU's order, which differs for some
non-ASCII text). Any other operator (``$regex``, ``$elemMatch``, ``$size``, ...) is refused with a
400 naming it: multisite does not guess at a filter it cannot run exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .couch_errors import CouchError

MAX_SELECTOR_DEPTH = 32  # nesting of a selector (objects and combinations), checked at compile
COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
FIELD_OPERATORS = frozenset(COMPARISONS + ("$in", "$nin", "$exists"))
COMBINATIONS = frozenset(("$and", "$or", "$nor", "$not"))
_MISSING = object()

Test = Callable[[Any], bool]  # a compiled condition on one document (or one field's value)


def invalid(reason: str) -> CouchError:
    return CouchError(400, "invalid_selector", reason)


@dataclass(frozen=True)
class Matcher:
    """A compiled selector: ``matches(doc)`` for a CouchDB document body."""

    test: Test

    def matches(self, doc: dict) -> bool:
        return self.test(doc)


def compile_selector(sel: Any) -> Matcher:
    """The ``Matcher`` of ``sel``; CouchError 400 (``invalid_selector``) naming what is wrong."""
    if not isinstance(sel, dict):
        raise invalid("a selector is a JSON object")
    return Matcher(_object(sel, (), 0))


# -- collation ------------------------------------------------------------------------------------
def _rank(v: Any) -> int:
    if v is None:
        return 0
    if v is False:
        return 1
    if v is True:
        return 2
    if isinstance(v, (int, float)):
        return 3
    if isinstance(v, str):
        return 4
    if isinstance(v, list):
        return 5
    return 6


def collate(a: Any, b: Any) -> int:
    """CouchDB's order of two JSON values: -1, 0 or 1 (see the module's note on strings)."""
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return -1 if ra < rb else 1
    if ra in (3, 4):
        return (a > b) - (a < b)
    if ra == 5:
        for x, y in zip(a, b):
            c = collate(x, y)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    if ra == 6:
        return collate([[k, v] for k, v in a.items()], [[k, v] for k, v in b.items()])
    return 0


# -- compiling ------------------------------------------------------------------------------------
def _object(sel: dict, path: tuple[str, ...], depth: int) -> Test:
    """All members of a selector object, at field ``path`` (() at the top)."""
    if depth > MAX_SELECTOR_DEPTH:
        raise invalid(f"the selector is nested deeper than {MAX_SELECTOR_DEPTH}")
    tests = [_member(k, v, path, depth + 1) for k, v in sel.items()]
    if len(tests) == 1:
        return tests[0]
    return lambda doc: all(t(doc) for t in tests)


def _member(key: Any, value: Any, path: tuple[str, ...], depth: int) -> Test:
    if not isinstance(key, str) or not key:
        raise invalid("a selector's member names a field or an operator")
    if key in COMBINATIONS:
        return _combination(key, value, path, depth)
    if key in FIELD_OPERATORS:
        if not path:
            raise invalid(f"{key} applies to a field: {{\"field\": {{\"{key}\": ...}}}}")
        return _field(path, _operator(key, value))
    if key.startswith("$"):
        raise invalid(f"operator {key} is not supported by multisite's _selector filter (supported: "
                      f"{', '.join(sorted(FIELD_OPERATORS | COMBINATIONS))})")
    sub = path + tuple(key.split("."))
    if isinstance(value, dict) and value:
        return _object(value, sub, depth)
    return _field(sub, _operator("$eq", value))


def _combination(op: str, value: Any, path: tuple[str, ...], depth: int) -> Test:
    if op == "$not":
        if not isinstance(value, dict):
            raise invalid("$not takes a selector (an object)")
        t = _object(value, path, depth)
        return lambda doc: not t(doc)
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise invalid(f"{op} takes a list of selectors (objects)")
    tests = [_object(s, path, depth) for s in value]
    if op == "$and":
        return lambda doc: all(t(doc) for t in tests)
    if op == "$or":
        return lambda doc: any(t(doc) for t in tests)
    return lambda doc: not any(t(doc) for t in tests)  # $nor


def _bounded(arg: Any) -> Any:
    """``arg`` if it nests at most ``MAX_SELECTOR_DEPTH`` deep: ``collate`` recurses into arrays and
    objects as deep as both values go, so a hostile argument meets a nested document in a 400, not a
    RecursionError. Checked without recursion (the JSON decoder lets ~1,000 levels through)."""
    stack = [(arg, 0)]
    while stack:
        v, d = stack.pop()
        if d > MAX_SELECTOR_DEPTH:
            raise invalid(f"an operator's value is nested deeper than {MAX_SELECTOR_DEPTH}")
        if isinstance(v, (list, dict)):
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return arg


def _operator(op: str, arg: Any) -> Callable[[Any], bool]:
    """A test on a field's value (``_MISSING`` when the document lacks it)."""
    arg = _bounded(arg)
    if op == "$exists":
        if not isinstance(arg, bool):
            raise invalid("$exists takes true or false")
        return lambda v: (v is not _MISSING) == arg
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise invalid(f"{op} takes a list of values")
        def inside(v: Any) -> bool:
            vals = v if isinstance(v, list) else [v]
            return any(collate(a, x) == 0 for a in arg for x in vals)
        if op == "$in":
            return lambda v: v is not _MISSING and inside(v)
        return lambda v: v is not _MISSING and not inside(v)
    want = {"$eq": (0,), "$ne": (-1, 1), "$gt": (1,), "$gte": (0, 1), "$lt": (-1,), "$lte": (-1, 0)}[op]
    return lambda v: v is not _MISSING and collate(v, arg) in want


def _field(path: tuple[str, ...], test: Callable[[Any], bool]) -> Test:
    if any(not p for p in path):
        raise invalid(f"field {'.'.join(path)!r:.80} has an empty part")

    def run(doc: Any) -> bool:
        v = doc
        for p in path:
            if not isinstance(v, dict) or p not in v:
                v = _MISSING
                break
            v = v[p]
        return test(v)
    return run
