"""SI streams 1..15 with real instance servers: one supplementary instance fed in turn by three BC groups.

P1, P2 and P3 are originating primaries of LMS groups g1, g2 and g3; S is a supplementary instance
(group ``si``) and S2 its supplementary standby (BC from S). Each group's transactions are labelled
by a letter (P1: ``A1``, ``A2``…; P2: ``B…``; P3: ``C…``), S's own by ``M…``. One source feeds S at a
time: each group gets the next stream (g1: 1, g2: 2, g3: 3) and keeps it; S tags every record it
receives with that stream and the seqno the transaction has on its group, and its own with stream 0
numbered apart. S2 receives S's frames byte for byte, so it holds the same tags and the same streams.
"""

from __future__ import annotations

import pytest

import multisite
from multisite.instance.instance_file import StreamInfo
from multisite.journal.lostfile import NUMBERING_SI, LostFile
from multisite.testing.cluster import Cluster
from multisite.testing.scenario import commit, labels, lost_files, lost_labels, tagged, wait_for, wait_has

GROUP_OF = {"A": "g1", "B": "g2", "C": "g3"}
STREAM_OF = {"A": 1, "B": 2, "C": 3}
ORIGIN_OF = {"A": "P1", "B": "P2", "C": "P3"}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, durability="group")
    yield c
    c.stop_all()


def deactivate(src, dst) -> None:
    src.call("source.deactivate", secondary=dst.name)
    # one source at a time: the next one would be BUSY until S has seen this one go
    wait_for(lambda: dst.call("receiver.status")["state"] == "listening", f"{dst.name} to drop {src.name}")


def activate(src, dst) -> None:
    src.call("source.activate", secondary=dst.name)


def feed(cluster, src, dst, *labels_: str) -> None:
    """``src`` commits ``labels_`` and feeds ``dst`` until it holds them, then stops feeding it."""
    if dst.name in src.sources:
        activate(src, dst)
    else:
        cluster.link(src, dst)
    for lb in labels_:
        commit(src, lb)
    wait_has(dst, *labels_)
    deactivate(src, dst)


def check_si_tags(node, groups: dict[str, list[str]]) -> None:
    """Every record of ``node``: S's own are stream 0 numbered 1, 2, …; a group's carry its stream and
    the transaction's seqno on that group (its position in ``groups[letter]``, the group's labels)."""
    n0 = 0
    for (seqno, stream, sseq, origin), lb in zip(tagged(node), labels(node), strict=True):
        if lb[0] == "M":
            n0 += 1
            assert (stream, sseq, origin) == (0, n0, "S"), (node.name, lb, seqno, stream, sseq, origin)
        else:
            want = (STREAM_OF[lb[0]], groups[lb[0]].index(lb) + 1, ORIGIN_OF[lb[0]])
            assert (stream, sseq, origin) == want, (node.name, lb, seqno, stream, sseq, origin)


def streams_of(node) -> dict[str, dict]:
    return node.call("status")["streams"]


def build(c: Cluster, *, s_receiver: dict | None = None, s2_receiver: dict | None = None):
    p1, p2, p3 = (c.instance(f"P{i}", group=f"g{i}") for i in (1, 2, 3))
    s = c.instance("S", group="si", supplementary=True)
    s2 = c.instance("S2", group="si", supplementary=True)
    s2.call("role", role="secondary")  # S's standby: it generates nothing
    s.start_receiver(**(s_receiver or {}))
    s2.start_receiver(**(s2_receiver or {}))
    c.link(s, s2)
    return p1, p2, p3, s, s2


def test_three_groups_in_turn_feed_one_supplementary_instance_and_its_standby(cluster):
    c = cluster
    p1, p2, p3, s, s2 = build(c)
    commit(s, "M1")
    feed(c, p1, s, "A1", "A2")
    commit(s, "M2")
    commit(p2, "B1")  # P2 holds B1 before it ever meets S: S catches up on stream 2
    feed(c, p2, s, "B2", "B3")
    commit(s, "M3")
    feed(c, p3, s, "C1")
    assert {n: v["group"] for n, v in streams_of(s).items()} == {"1": "g1", "2": "g2", "3": "g3"}
    # Back to the first group: stream 1 again, from its stream seqno 2; heartbeat answers confirm
    # P1's seqnos (stream 1's numbering), not S's.
    activate(p1, s)
    commit(p1, "A3")
    wait_has(s, "A3")
    wait_for(lambda: p1.call("source.status", secondary="S")["last_confirmed"] == 3,
             "P1 to see its seqno 3 confirmed by S")
    deactivate(p1, s)
    commit(s, "M4")
    groups = {"A": labels(p1), "B": labels(p2), "C": labels(p3)}
    assert labels(s) == ["M1", "A1", "A2", "M2", "B1", "B2", "B3", "M3", "C1", "A3", "M4"]
    check_si_tags(s, groups)
    assert {n: (v["group"], v["root_primary"], v["stream_seqno"]) for n, v in streams_of(s).items()} == \
        {"1": ("g1", "P1", 3), "2": ("g2", "P2", 3), "3": ("g3", "P3", 1)}

    # S2, BC from S, holds the same frames, hence the same tags, and all three streams.
    wait_has(s2, "M4")
    assert tagged(s2) == tagged(s) and labels(s2) == labels(s)
    assert streams_of(s2) == streams_of(s)
    for n in (p1, p2, p3):
        assert all(stream == 0 for _, stream, _, _ in tagged(n))  # BC instances: stream 0 only
    c.stop_all()
    with multisite.open(s.root) as sdb, multisite.open(s2.root) as s2db:
        for num in (1, 2, 3):
            a, b = sdb.info.streams[num], s2db.info.streams[num]
            assert (a.source_group, [h.uid for h in a.history]) == (b.source_group, [h.uid for h in b.history])
        assert sdb.stream_seqnos() == s2db.stream_seqnos() == {0: 4, 1: 3, 2: 3, 3: 1}


def test_rollback_and_noresync_work_on_the_stream_of_the_group_that_needs_them(cluster):
    c = cluster
    p1, p2, p3, s, s2 = build(c, s_receiver={"autorollback": True}, s2_receiver={"autorollback": True})
    feed(c, p1, s, "A1", "A2")
    commit(s, "M1")
    feed(c, p2, s, "B1", "B2")
    commit(s, "M2")
    feed(c, p1, s, "A3")
    commit(s, "M3")
    wait_has(s2, "M3")
    assert labels(s) == ["A1", "A2", "M1", "B1", "B2", "M2", "A3", "M3"]

    # P2 rolls back online past B2 and goes on with B2a. S (--autorollback) rolls back in stream 2's
    # numbering: to just before B2, taking off M2, A3 and M3 (other streams) with it.
    assert p2.call("rollback", resync=1)["rolled_back"] == 1
    feed(c, p2, s, "B2a")
    assert lost_labels(s) == [["B2", "M2", "A3", "M3"]]
    lf = LostFile.read(lost_files(s)[0])
    assert lf.header["reason"].startswith("autorollback for P2") and lf.header["common_seqno"] == 1
    assert lf.header["common_seqno_stream"] == 2  # the common point is a seqno of P2 (stream 2)
    assert lf.numbering == NUMBERING_SI and lf.stream_groups == {1: "g1", 2: "g2"}
    assert [(t["seqno"], t["stream"], t["stream_seqno"]) for t in lf.transactions] == \
        [(5, 2, 2), (6, 0, 2), (7, 1, 3), (8, 0, 3)]
    assert labels(s) == ["A1", "A2", "M1", "B1", "B2a"]
    assert {n: v["stream_seqno"] for n, v in streams_of(s).items()} == {"1": 2, "2": 2}
    # Stream 1 lost A3: P1 sends it again.
    feed(c, p1, s, "A4")
    assert labels(s) == ["A1", "A2", "M1", "B1", "B2a", "A3", "A4"]
    check_si_tags(s, {"A": labels(p1), "B": labels(p2)})
    wait_has(s2, "A4")
    assert tagged(s2) == tagged(s) and lost_labels(s2) == [["B2", "M2", "A3", "M3"]]

    # --noresync: P1 rolls back online past A4 and goes on with A4a; S keeps A4 and continues stream 1
    # from P1's seqno 3; stream 2 is untouched.
    s.call("receiver.stop")
    s.start_receiver(port=s.receiver_port, noresync=True)
    assert p1.call("rollback", resync=3)["rolled_back"] == 1
    feed(c, p1, s, "A4a", "A5")
    assert labels(s) == ["A1", "A2", "M1", "B1", "B2a", "A3", "A4", "A4a", "A5"]
    assert [(st, ss, o) for _, st, ss, o in tagged(s)[-3:]] == [(1, 4, "P1"), (1, 4, "P1"), (1, 5, "P1")]
    assert len(lost_files(s)) == 1
    assert {n: v["stream_seqno"] for n, v in streams_of(s).items()} == {"1": 5, "2": 2}
    feed(c, p2, s, "B3")
    assert [(st, ss, o) for _, st, ss, o in tagged(s)[-1:]] == [(2, 3, "P2")]
    wait_has(s2, "B3")
    assert tagged(s2) == tagged(s)


def test_a_sixteenth_group_is_refused_with_a_clear_error(cluster):
    c = cluster
    s = c.instance("S", group="si", supplementary=True, start=False)
    with multisite.open(s.root) as db:  # S has received from 15 groups already
        db.update_info(lambda info: info.streams.update(
            {n: StreamInfo(stream=n, source_group=f"g{n}", root_primary=f"O{n}") for n in range(1, 16)}))
    s.start()
    s.start_receiver()
    p16 = c.instance("P16", group="g16")
    commit(p16, "X1")
    c.link(p16, s)
    err = wait_for(lambda: s.call("receiver.status")["last_error"], "S to refuse P16")
    assert err.startswith("NO_FREE_STREAM: S already receives 15 SI streams (groups 1: g1, 2: g2")
    assert "'g16'" in err
    wait_for(lambda: "NO_FREE_STREAM" in (p16.call("source.status", secondary="S")["last_error"] or ""),
             "P16 to report the refusal")
    assert labels(s) == [] and "16" not in streams_of(s)
    # one of its 15 groups is still taken, on its own stream
    p7 = c.instance("O7", group="g7")
    p16.call("source.stop", secondary="S")
    wait_for(lambda: s.call("receiver.status")["state"] == "listening", "S to drop P16")
    commit(p7, "Y1")
    c.link(p7, s)
    wait_has(s, "Y1")
    assert [(st, ss, o) for _, st, ss, o in tagged(s)] == [(7, 1, "O7")]
