"""Cookie sessions of the CouchDB endpoints (``multimaster/couch_session.py``): a signed cookie verifies
until it expires (the clock is passed in), names its user and tags, and is refreshed past half its
life; under Hypothesis: any string as a cookie is refused (None or a 400 CouchError), never accepted
and never another exception, and any change to a signed cookie makes it fail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.multimaster import couch_session as cs
from multisite.multimaster.couch_errors import CouchError

SECRET = b"s" * 32
T0 = 1_700_000_000


def test_a_signed_cookie_verifies_until_it_expires_with_its_name_and_tags():
    c = cs.sign(SECRET, "alice", ["t1", "t2"], T0, 600)
    s = cs.verify(SECRET, c, T0 + 599)
    assert s == cs.Session("alice", T0 + 600, frozenset({"t1", "t2"}))
    assert not s.refresh_due(T0 + 200, 600) and s.refresh_due(T0 + 301, 600)
    assert cs.verify(SECRET, c, T0 + 600) is None  # expired: the request goes on as anonymous
    assert cs.verify(b"x" * 32, c, T0) is None  # another server's secret


def test_a_user_tag_changes_with_the_password_or_the_role():
    t = cs.user_tag("alice", "read-write", "$argon2id$a")
    assert t != cs.user_tag("alice", "read-write", "$argon2id$b") != cs.user_tag("alice", "admin", "$argon2id$a")
    assert t == cs.user_tag("alice", "read-write", "$argon2id$a")


def test_what_cannot_be_a_cookie():
    for bad in ["%%%", "", "a" * 5000, "YWJj"]:  # not base64, empty, too long, no fields
        with pytest.raises(CouchError) as e:
            cs.verify(SECRET, bad, T0)
        assert e.value.status == 400 and "Malformed AuthSession cookie" in e.value.reason
    with pytest.raises(CouchError):
        cs.sign(SECRET, "a:b", [], T0)
    with pytest.raises(ValueError):
        cs.sign(b"short", "a", [], T0)
    assert cs.set_cookie("").startswith("AuthSession=; ") and "Max-Age=0" in cs.set_cookie("")


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=200).map(lambda b: __import__("base64").urlsafe_b64encode(b).decode()))
def test_no_made_up_cookie_is_accepted(cookie):
    try:
        assert cs.verify(SECRET, cookie, T0) is None
    except CouchError as e:
        assert e.status == 400


@settings(max_examples=500, deadline=None)
@given(st.text(min_size=1, max_size=20).filter(lambda n: ":" not in n), st.lists(st.text("0123456789abcdef", min_size=16,
       max_size=16), max_size=4), st.integers(0, 10_000), st.data())
def test_any_change_to_a_signed_cookie_makes_it_fail(name, tags, age, data):
    c = cs.sign(SECRET, name, tags, T0, 600)
    s = cs.verify(SECRET, c, T0 + age)
    assert (s is not None) == (age < 600)
    if s is not None:
        assert s.name == name and s.tags == frozenset(tags)
    i = data.draw(st.integers(0, len(c) - 1))
    ch = data.draw(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_").filter(lambda x: x != c[i]))
    changed = c[:i] + ch + c[i + 1:]
    try:
        got = cs.verify(SECRET, changed, T0)
    except CouchError:
        return
    assert got is None or got == cs.verify(SECRET, c, T0)  # (a change in the last char's unused base64 bits)
