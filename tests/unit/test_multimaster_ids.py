"""UNIDs, OIDs and conflict UNIDs: encodings, checks, determinism."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from multisite.errors import MalformedDocument
from multisite.multimaster.ids import (OID, Stamp, check_unid, conflict_unid, decode_oid, encode_oid, new_unid,
                                       unid_time_us)

times = st.integers(0, 2**63 - 1)
rands = st.integers(0, 2**64 - 1)


@given(times, rands)
def test_unid_is_16_bytes_of_time_then_number(t, r):
    u = new_unid(t, r)
    assert check_unid(u) == u and len(bytes.fromhex(u)) == 16
    assert unid_time_us(u) == t and int(u[16:], 16) == r


@given(times, times, rands)
def test_unids_sort_by_creation_time(t1, t2, r):
    assert (new_unid(t1, r) < new_unid(t2, r)) == (t1 < t2)


@given(times, rands, st.integers(1, 2**32 - 1), times)
def test_oid_is_28_bytes_and_round_trips(t, r, seq, st_):
    u = new_unid(t, r)
    oid = encode_oid(u, seq, st_)
    assert len(oid) == OID.size == 28
    assert decode_oid(oid) == (u, seq, st_)


@pytest.mark.parametrize("bad", ["", "zz" * 16, "AB" * 16, "ab" * 15, 42, None])
def test_malformed_unids_are_refused_by_name(bad):
    with pytest.raises(MalformedDocument, match="UNID"):
        check_unid(bad)


def test_decode_oid_refuses_a_wrong_length():
    with pytest.raises(MalformedDocument, match="28 bytes"):
        decode_oid(b"\0" * 27)


@given(times, rands, st.integers(1, 1000), times, st.text(min_size=1, max_size=8))
def test_conflict_unid_depends_only_on_document_and_losing_version(t, r, seq, lt, origin):
    u = new_unid(t, r)
    s = Stamp(seq, lt, origin)
    assert conflict_unid(u, s) == conflict_unid(u, Stamp(seq, lt, origin))
    assert conflict_unid(u, s) != conflict_unid(u, Stamp(seq + 1, lt, origin))
    assert conflict_unid(u, s) != u
    check_unid(conflict_unid(u, s))
