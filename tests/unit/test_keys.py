"""Keys: what is accepted, the encoding round trip, and that byte order is key order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multisite import KeyTypeError, MultisiteError
from multisite.keys import KILL_END, check_key, decode_key, encode_key, key_text

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
SUBSCRIPTS = st.one_of(
    st.integers(INT_MIN, INT_MAX),
    st.integers(-3, 3),  # small ints collide often, which exercises prefixes and ties
    st.text(max_size=6),
    st.sampled_from(["", "\x00", "\x00\xff", "a", "a\x00", "\xff", "\U0001f600", "\x01"]),
)
KEYS = st.lists(SUBSCRIPTS, min_size=1, max_size=4).map(tuple)


def model_order(key: tuple) -> tuple:
    """Key order as the spec states it: ints before strings, a key before the keys below it."""
    return tuple((0, p) if type(p) is int else (1, p) for p in key)


@pytest.mark.parametrize("bad", [
    (True,), ("a", False), (1.0,), ("a", 2.5), (None,), ("a", None), (b"x",), ((1,),),
    (), (2**63,), (-(2**63) - 1,), ("a", 10**30),
    "abc", 5, None, {"a": 1}, b"ab",
])
def test_check_key_rejects(bad):
    with pytest.raises(KeyTypeError) as ei:
        check_key(bad)
    assert isinstance(ei.value, MultisiteError) and isinstance(ei.value, TypeError)
    assert ei.value.code == "KEY_TYPE"
    assert "key" in str(ei.value)


def test_check_key_accepts_boundaries_and_lists():
    assert check_key((INT_MIN, INT_MAX, "", "x")) == (INT_MIN, INT_MAX, "", "x")
    assert check_key(["a", 1]) == ("a", 1)


@given(KEYS)
def test_encode_decode_round_trip(key):
    assert decode_key(encode_key(check_key(key))) == key


@given(st.lists(KEYS, max_size=30))
def test_byte_order_is_key_order(keys):
    by_bytes = sorted(keys, key=encode_key)
    by_model = sorted(keys, key=model_order)
    assert [model_order(k) for k in by_bytes] == [model_order(k) for k in by_model]


@given(KEYS, KEYS)
def test_encoding_is_injective_and_order_preserving_pairwise(a, b):
    ea, eb = encode_key(a), encode_key(b)
    assert (ea == eb) == (a == b)
    assert (ea < eb) == (model_order(a) < model_order(b))


@given(KEYS, KEYS)
def test_kill_range_holds_exactly_the_key_and_its_descendants(a, b):
    ea, eb = encode_key(a), encode_key(b)
    in_range = ea <= eb < ea + KILL_END
    assert in_range == (b[: len(a)] == a)


def test_known_orders():
    ordered = [(-5,), (0,), (1,), (2**40,), ("",), ("a",), ("a", -1), ("a", 3), ("a", ""), ("a", "x"),
               ("a", "x", 1), ("a\x00",), ("a\x01",), ("ab",), ("b",), ("\U0001f600",)]
    assert sorted(ordered, key=encode_key) == ordered


def test_decode_rejects_unknown_tags():
    with pytest.raises(KeyTypeError):
        decode_key(b"\x07abc")


def test_key_text():
    assert key_text(("a", 1, "q\"x")) == '("a",1,"q\\"x")'
    assert key_text((-3,)) == "(-3)"


@given(KEYS, st.lists(SUBSCRIPTS, max_size=3).map(tuple), KEYS)
def test_descendants_fall_inside_and_siblings_outside_the_kill_range(a, suffix, other):
    ea = encode_key(a)
    assert ea <= encode_key(a + suffix) < ea + KILL_END
    sibling = a[:-1] + other[:1] + suffix
    if sibling[: len(a)] != a:
        es = encode_key(sibling)
        assert not ea <= es < ea + KILL_END


def test_the_string_cache_stays_bounded_and_never_changes_an_encoding():
    from multisite import keys

    for i in range(keys._STR_CACHE_MAX + 500):
        s = f"s{i}"
        assert keys.encode_key((s, i)) == keys._enc_str(s) + keys._enc_int(i)
        assert len(keys._STR_CACHE) <= keys._STR_CACHE_MAX
    long = "x" * (keys._STR_CACHE_LEN + 1)
    assert keys.encode_key((long,)) == keys._enc_str(long) and long not in keys._STR_CACHE
    with pytest.raises(KeyTypeError):
        keys.encode_key(("a", 1.5))


def test_a_string_subscript_that_is_not_unicode_text_is_a_key_type_error(tmp_path):
    """A lone surrogate: a KeyTypeError naming the subscript (it was a bare UnicodeEncodeError), and
    nothing written."""
    import multisite

    with pytest.raises(KeyTypeError, match="not valid Unicode text"):
        encode_key(("a\ud800",))
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        with pytest.raises(KeyTypeError, match=r"'a\\ud800'"):
            db.set("r", ("a\ud800", 1), 1)
        assert db.seqno == 0 and list(db.items("r")) == []
