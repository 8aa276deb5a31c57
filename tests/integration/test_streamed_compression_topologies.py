"""Streamed compression through a cascade and an SI stream, with real instance servers.

A BC cascade A → B → C with ``--compress 3`` on both links: B rebuilds the frame headers that did not
travel, journals them, and streams them on to C, whose frames must still be A's byte for byte. An SI
stream P1 → S (``--compress 3``) and S → S2 (its supplementary standby, ``--compress 3``): the SI
stream's seqnos (P1's), not S's own, are what the rebuilt headers carry on the first link, and S's
re-framed records on the second.
"""

from __future__ import annotations

import pytest

from multisite.testing.checks import assert_same_data, journal_frames
from multisite.testing.cluster import Cluster
from multisite.testing.scenario import commit, labels, tagged, wait_for, wait_has


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, durability="group")
    yield c
    c.stop_all()


def _streamed(src, dst) -> bool:
    return src.call("source.status", secondary=dst.name)["compression"] == "streamed"


def test_a_streamed_cascade_keeps_the_primarys_frames_byte_for_byte(cluster):
    a, b, c = cluster.instance("A"), cluster.instance("B"), cluster.instance("C")
    cluster.link(a, b, compress=3)
    cluster.link(b, c, compress=3)
    wait_for(lambda: _streamed(a, b) and _streamed(b, c), "both links streamed")
    last = 0
    for i in range(120):  # one at a time: small batches, each a piece of the stream
        last = commit(a, f"T{i}")
    wait_for(lambda: c.seqno() == last, "C to apply everything through B")
    cluster.stop_all()
    assert_same_data(a.root, b.root)
    assert_same_data(a.root, c.root)
    frames = journal_frames(a.root)
    assert len(frames) == last
    assert journal_frames(b.root) == frames and journal_frames(c.root) == frames


def test_an_si_stream_and_its_standby_streamed(cluster):
    p1 = cluster.instance("P1", group="g1")
    s = cluster.instance("S", group="si", supplementary=True)
    s2 = cluster.instance("S2", group="si", supplementary=True)
    s2.call("role", role="secondary")
    s.start_receiver()
    s2.start_receiver()
    cluster.link(s, s2, compress=3)
    commit(s, "M1")
    commit(p1, "A1")  # before P1 meets S: S catches up on its stream
    cluster.link(p1, s, compress=3)
    wait_for(lambda: _streamed(p1, s) and _streamed(s, s2), "both links streamed")
    for i in range(2, 40):
        commit(p1, f"A{i}")
    commit(s, "M2")
    wait_has(s2, "A39", "M2")
    assert [(st, sseq) for _, st, sseq, _ in tagged(s) if st == 1] == [(1, n) for n in range(1, 40)]
    cluster.stop_all()
    assert labels(s2) == labels(s)
    assert journal_frames(s2.root) == journal_frames(s.root)
