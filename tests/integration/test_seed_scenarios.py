"""The scenario tables of seed 000 ("With SI replication"), end to end with real instance servers.

Instances are named as in the tables: Ardmore, BrynMawr (BC group ``bank``), Malvern and Newtown
(supplementary, group ``si``). Every transaction's value names it (region ``t``, key ``(label,)``),
so what an instance holds is read from its journal, in seqno order, as a list of labels; the "..."
of every row is ``PREFIX``, two transactions shared by all instances. Each test drives the
instances to the table's first row, applies the events, and asserts every later row exactly, who
rolled back what into which lost-transaction file, and the stream tags of SI instances.

Where a row interleaves a receiver's own transactions between transactions its new source already
held before the link came up (table 1, Malvern's "A98, M39, B61"; table 4, Newtown's "A97, A98,
N73, B61, N74"), the stream is cut into parts with ``HeldLink``: a Source Server sends all it holds
at once, so without a cut the receiver would apply them together.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multisite.journal.lostfile import LostFile
from multisite.testing.cluster import Cluster
from multisite.testing.faultproxy import ProxyProcess
from multisite.testing.scenario import commit, labels, lost_files, lost_labels, tagged, wait_for, wait_has

PREFIX = ["A93", "A94"]
BANK, SI = "bank", "si"
MULTISITE = str(Path(sys.executable).with_name("multisite"))  # the console script of this environment
HELD_HEARTBEAT_TIMEOUT_S = 60.0  # a held link must not time out while the test holds its bytes


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, durability="group")
    c.proxies = []
    yield c
    for p in c.proxies:
        p.stop()
    c.stop_all()


def rows(*labels_: str) -> list[str]:
    return PREFIX + list(labels_)


def check_si_tags(node, bc_primary_labels: list[str], local: str = "MN") -> None:
    """On a supplementary instance: its own (and its supplementary group's) transactions carry
    stream 0, numbered 1, 2, 3... in order; those from the BC group carry stream 1 and their seqno
    on the BC instances (the position of the label in ``bc_primary_labels``), and keep their origin."""
    tags = tagged(node)
    seq = labels(node)
    assert [t[0] for t in tags] == list(range(1, len(seq) + 1))
    n0 = 0
    for (seqno, stream, sseq, origin), lb in zip(tags, seq):
        if lb[0] in local:
            n0 += 1
            assert (stream, sseq) == (0, n0), f"{node.name} {lb} at {seqno}: tags {stream},{sseq}"
        else:
            assert (stream, sseq) == (1, bc_primary_labels.index(lb) + 1), f"{node.name} {lb}: {stream},{sseq}"
            assert origin == {"A": "Ardmore", "B": "BrynMawr"}[lb[0]], (lb, origin)


def check_bc_tags(node) -> None:
    """On a BC instance every transaction is stream 0 with stream_seqno = seqno, whoever made it."""
    for seqno, stream, sseq, origin in tagged(node):
        assert (stream, sseq) == (0, seqno)


def deactivate(src, dst) -> None:
    src.call("source.deactivate", secondary=dst.name)


def activate(src, dst) -> None:
    src.call("source.activate", secondary=dst.name)


def lost_file_of(node):
    """The only lost-transaction file of ``node``, read."""
    files = lost_files(node)
    assert len(files) == 1, f"{node.name} has lost files {files}"
    assert files[0].parent == node.root / "lost"
    return LostFile.read(files[0])


class HeldLink:
    """A source -> receiver link through a fault proxy, to deliver what the source holds in parts.

    ``connect(n)``: the receiver's Update Process stops and the link comes up; the ``n`` transactions
    the source holds beyond the receiver wait in the receive pool (part 1). ``hold(label)``: the proxy
    stalls, the source commits ``label`` and sends it into the proxy, and goes passive (its
    connection's end waits in the proxy behind it: part 2). ``release_pool()`` applies part 1,
    ``release_held()`` part 2."""

    def __init__(self, cluster, src, dst):
        self.src, self.dst = src, dst
        self.proxy = ProxyProcess("127.0.0.1", dst.receiver_port).start()
        cluster.proxies.append(self.proxy)

    def connect(self, in_pool: int) -> None:
        self.dst.call("update.stop")
        self.src.start_source(self.dst, port=self.proxy.port, heartbeat_timeout_s=HELD_HEARTBEAT_TIMEOUT_S)
        wait_for(lambda: self.dst.call("receiver.status")["backlog"] == in_pool,
                 f"{in_pool} transaction(s) from {self.src.name} in {self.dst.name}'s receive pool")

    def hold(self, label: str) -> None:
        self.proxy.stall("upstream")
        seqno = commit(self.src, label)
        wait_for(lambda: self.src.call("source.status", secondary=self.dst.name)["last_sent"] == seqno,
                 f"{self.src.name} to send {label} into the stalled link")
        deactivate(self.src, self.dst)

    def release_pool(self) -> None:
        self.dst.call("update.start")

    def release_held(self) -> None:
        self.proxy.resume("upstream")


def build_b97_m98(c: Cluster, *, b_receiver: dict | None = None, m_receiver: dict | None = None):
    """The first row shared by tables 2, 3 and 5:

    Ardmore  O: ... A95, A96, A97, A98, A99
    BrynMawr R: ... A95, A96, A97
    Malvern  S: ... M34, A95, M35, M36, A96, A97, M37, M38, A98, M39, M40
    """
    a = c.instance("Ardmore", group=BANK)
    b = c.instance("BrynMawr", group=BANK)
    m = c.instance("Malvern", group=SI, supplementary=True)
    b.start_receiver(**(b_receiver or {}))
    m.start_receiver(**(m_receiver or {}))
    c.link(a, b)
    c.link(a, m)
    for x in PREFIX:
        commit(a, x)
    wait_has(b, *PREFIX)
    wait_has(m, *PREFIX)
    commit(m, "M34")
    commit(a, "A95")
    wait_has(m, "A95")
    commit(m, "M35")
    commit(m, "M36")
    commit(a, "A96")
    commit(a, "A97")
    wait_has(b, "A97")
    deactivate(a, b)
    wait_has(m, "A97")
    commit(m, "M37")
    commit(m, "M38")
    commit(a, "A98")
    wait_has(m, "A98")
    deactivate(a, m)
    commit(m, "M39")
    commit(m, "M40")
    commit(a, "A99")
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99")
    assert labels(b) == rows("A95", "A96", "A97")
    assert labels(m) == rows("M34", "A95", "M35", "M36", "A96", "A97", "M37", "M38", "A98", "M39", "M40")
    return a, b, m


M_ROW1_B97 = rows("M34", "A95", "M35", "M36", "A96", "A97", "M37", "M38", "A98", "M39", "M40")


# -- table 1 ----------------------------------------------------------------------------------------
def test_table1_brynmawr_takes_over_and_malvern_follows_without_rollback(cluster):
    c = cluster
    a = c.instance("Ardmore", group=BANK)
    b = c.instance("BrynMawr", group=BANK)
    m = c.instance("Malvern", group=SI, supplementary=True)
    c.link(a, b)
    c.link(a, m)
    for x in PREFIX:
        commit(a, x)
    wait_has(b, *PREFIX)
    wait_has(m, *PREFIX)
    commit(m, "M34")
    commit(a, "A95")
    wait_has(m, "A95")
    commit(m, "M35")
    commit(m, "M36")
    commit(a, "A96")
    commit(a, "A97")
    wait_has(m, "A97")
    commit(m, "M37")
    commit(m, "M38")
    deactivate(a, m)
    commit(a, "A98")
    wait_has(b, "A98")
    deactivate(a, b)
    commit(a, "A99")
    # Row 1
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99")
    assert labels(b) == rows("A95", "A96", "A97", "A98")
    m_row1 = rows("M34", "A95", "M35", "M36", "A96", "A97", "M37", "M38")
    assert labels(m) == m_row1

    # Ardmore crashes; BrynMawr becomes the originating primary. Malvern's receiver stays up.
    a.kill()
    b.call("receiver.stop")
    assert b.call("role", role="primary")["role"] == "primary"
    held = HeldLink(c, b, m)
    held.connect(in_pool=1)  # A98, the one transaction BrynMawr holds beyond Malvern, waits in the pool
    held.hold("B61")
    # Row 2
    assert labels(b) == rows("A95", "A96", "A97", "A98", "B61")
    assert labels(m) == m_row1

    # Row 3: SI replication from BrynMawr picks up where Ardmore's left off (A97 is the common point).
    held.release_pool()
    wait_has(m, "A98")
    commit(m, "M39")
    held.release_held()
    wait_has(m, "B61")
    commit(m, "M40")
    commit(b, "B62")
    b_seq = rows("A95", "A96", "A97", "A98", "B61", "B62")
    assert labels(b) == b_seq
    assert labels(m) == m_row1 + ["A98", "M39", "B61", "M40"]

    # Row 4: Ardmore is repaired and brought online, still holding A99. BrynMawr and Malvern continue.
    a.start()
    activate(b, m)
    wait_has(m, "B62")
    commit(b, "B63")
    wait_has(m, "B63")
    deactivate(b, m)
    commit(b, "B64")
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99")
    b_seq = rows("A95", "A96", "A97", "A98", "B61", "B62", "B63", "B64")
    assert labels(b) == b_seq
    assert labels(m) == m_row1 + ["A98", "M39", "B61", "M40", "B62", "B63"]

    # Without a rollback BrynMawr's Source Server cannot connect to Ardmore, and says why.
    a.start_receiver()
    b.start_source(a)
    err = wait_for(lambda: b.call("source.status", secondary="Ardmore")["last_error"], "the source's error")
    assert "ROLLBACK_NEEDED" in err and "rollback" in err
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99") and lost_files(a) == []

    # Ardmore rolls A99 off into an Unreplicated Transaction Log (the CLI, on its running server).
    out = subprocess.run([MULTISITE, "rollback", str(a.root), "--fetchresync",
                          f"127.0.0.1:{b.client_port}", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert (rep["instance"], rep["rolled_back"], rep["to_seqno"]) == ("Ardmore", 1, 6)
    lf = lost_file_of(a)
    assert str(lf.path) == rep["lost_file"]
    assert lost_labels(a) == [["A99"]]
    assert (lf.header["instance"], lf.header["from_seqno"], lf.header["to_seqno"], lf.header["common_seqno"]) == \
        ("Ardmore", 7, 7, 6)
    assert [t["origin"] for t in lf.transactions] == ["Ardmore"]
    assert lf.may_have_changed("t", ("A99",)) and not lf.may_have_changed("t", ("A98",))
    assert lost_files(b) == [] and lost_files(m) == []

    # Row 5: Ardmore is a replicating secondary of BrynMawr; Malvern applies M41 then B64.
    wait_has(a, "B64")
    commit(m, "M41")
    activate(b, m)
    wait_has(m, "B64")
    deactivate(b, m)
    deactivate(b, a)
    commit(b, "B65")
    assert labels(a) == b_seq
    assert labels(b) == b_seq + ["B65"]
    assert labels(m) == m_row1 + ["A98", "M39", "B61", "M40", "B62", "B63", "M41", "B64"]
    check_bc_tags(a)
    check_bc_tags(b)
    check_si_tags(m, labels(b))
    assert [o for *_, o in tagged(m)][-1] == "BrynMawr"


# -- table 2 ----------------------------------------------------------------------------------------
def test_table2_malvern_ahead_rolls_back_with_fetchresync(cluster):
    c = cluster
    a, b, m = build_b97_m98(c)
    # Ardmore crashes; BrynMawr becomes the originating primary with A97.
    a.kill()
    b.call("receiver.stop")
    b.call("role", role="primary")
    # Row 2
    assert labels(b) == rows("A95", "A96", "A97")
    assert labels(m) == M_ROW1_B97

    # Note [b]: BrynMawr's Source Server fails to connect while Malvern is ahead, and reports it.
    c.link(b, m)
    err = wait_for(lambda: b.call("source.status", secondary="Malvern")["last_error"], "the source's error")
    assert "ROLLBACK_NEEDED" in err
    assert labels(m) == M_ROW1_B97 and lost_files(m) == []

    # Malvern: rollback --fetchresync rolls A98, M39, M40 off.
    rep = m.call("rollback", fetchresync=f"127.0.0.1:{b.client_port}")
    assert (rep["instance"], rep["rolled_back"], rep["from_seqno"], rep["to_seqno"]) == ("Malvern", 3, 13, 10)
    lf = lost_file_of(m)
    assert lost_labels(m) == [["A98", "M39", "M40"]]
    assert [(t["stream"], t["stream_seqno"], t["origin"]) for t in lf.transactions] == \
        [(1, 6, "Ardmore"), (0, 6, "Malvern"), (0, 7, "Malvern")]
    assert lf.header["common_seqno"] == 5  # in BrynMawr's seqnos: A97
    # A rollback when not ahead is a no-op (note [b]).
    again = m.call("rollback", fetchresync=f"127.0.0.1:{b.client_port}")
    assert again["rolled_back"] == 0 and len(lost_files(m)) == 1

    # Row 3
    commit(b, "B61")
    wait_has(m, "B61")
    deactivate(b, m)
    commit(b, "B62")
    assert labels(b) == rows("A95", "A96", "A97", "B61", "B62")
    m_row3 = rows("M34", "A95", "M35", "M36", "A96", "A97", "M37", "M38", "B61")
    assert labels(m) == m_row3

    # Row 4: M39a and M40a are new transactions, not the rolled-off M39 and M40.
    activate(b, m)
    wait_has(m, "B62")
    commit(m, "M39a")
    commit(m, "M40a")
    commit(b, "B63")
    wait_has(m, "B63")
    deactivate(b, m)
    commit(b, "B64")
    b_seq = rows("A95", "A96", "A97", "B61", "B62", "B63", "B64")
    assert labels(b) == b_seq
    assert labels(m) == m_row3 + ["B62", "M39a", "M40a", "B63"]
    assert lost_labels(m) == [["A98", "M39", "M40"]] and lost_files(b) == []
    check_si_tags(m, b_seq)
    check_bc_tags(b)


# -- table 3 ----------------------------------------------------------------------------------------
def test_table3_malvern_noresync_keeps_a98(cluster):
    c = cluster
    a, b, m = build_b97_m98(c)
    a.kill()
    b.call("receiver.stop")
    b.call("role", role="primary")
    commit(b, "B61")
    commit(b, "B62")
    # Row 2
    b_seq = rows("A95", "A96", "A97", "B61", "B62")
    assert labels(b) == b_seq
    assert labels(m) == M_ROW1_B97

    # Row 3: Malvern's Receiver Server restarts with --noresync; replication starts from the last
    # common transaction (A97): B61 and B62 follow A98, M39 and M40, and nothing is rolled back.
    m.call("receiver.stop")
    m.start_receiver(noresync=True)
    c.link(b, m)
    wait_has(m, "B62")
    assert labels(b) == b_seq
    assert labels(m) == M_ROW1_B97 + ["B61", "B62"]
    assert lost_files(m) == [] and lost_files(b) == []
    tags = tagged(m)
    assert [(s, ss, o) for _, s, ss, o in tags[-2:]] == [(1, 6, "BrynMawr"), (1, 7, "BrynMawr")]
    assert [(s, ss, o) for _, s, ss, o in tags[-5:-2]] == [(1, 6, "Ardmore"), (0, 6, "Malvern"), (0, 7, "Malvern")]
    # and it continues
    commit(m, "M41")
    commit(b, "B63")
    wait_has(m, "B63")
    assert labels(m)[-2:] == ["M41", "B63"]


# -- table 4 ----------------------------------------------------------------------------------------
# Table 4 cannot hold as printed. Its rows, counted from the first (Ardmore at A99): in rows 1-3
# BrynMawr holds A98 ("R: ... A97, A98"; "BrynMawr becomes the new originating primary, with A98 as the
# latest transaction"), and Newtown receives A98 from it in row 3 (Malvern too, in row 5, from
# Newtown). But rows 4 and 5 print BrynMawr as "O: ... A95, A96, A97, B61, B62, B63, B64[, B65]",
# row 4's comment says "Ardmore rolls off A98 and A99", and row 5 prints Ardmore as "R: ... A97, B61,
# ...". A transaction never leaves an originating primary without a rollback, and nothing rolls
# BrynMawr back, so this test follows rows 1-3: BrynMawr keeps A98 in rows 4 and 5, Ardmore rolls off
# A99 only, and Ardmore's row 5 is "R: ... A97, A98, B61, ..., B64". Every other cell is as printed.
def test_table4_newtown_takes_over_for_malvern(cluster):
    c = cluster
    a = c.instance("Ardmore", group=BANK)
    b = c.instance("BrynMawr", group=BANK)
    m = c.instance("Malvern", group=SI, supplementary=True)
    n = c.instance("Newtown", group=SI, supplementary=True)
    n.call("role", role="secondary")  # Q for P: a supplementary standby that generates nothing
    c.link(a, b)
    c.link(a, m)
    c.link(m, n)
    for x in PREFIX:
        commit(a, x)
    wait_has(b, *PREFIX)
    wait_has(n, *PREFIX)
    commit(m, "M34")
    commit(a, "A95")
    wait_has(m, "A95")
    commit(m, "M35")
    commit(m, "M36")
    commit(a, "A96")
    wait_has(m, "A96")
    commit(m, "M37")
    wait_has(n, "M37")
    deactivate(m, n)
    commit(a, "A97")
    wait_has(m, "A97")
    commit(m, "M38")
    deactivate(a, m)
    commit(a, "A98")
    wait_has(b, "A98")
    deactivate(a, b)
    commit(a, "A99")
    # Row 1
    m_row1 = rows("M34", "A95", "M35", "M36", "A96", "M37", "A97", "M38")
    n_row1 = rows("M34", "A95", "M35", "M36", "A96", "M37")
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99")
    assert labels(b) == rows("A95", "A96", "A97", "A98")
    assert labels(m) == m_row1
    assert labels(n) == n_row1
    check_si_tags(n, labels(a))

    # The data center with Ardmore and Malvern goes down. BrynMawr takes over for Ardmore, Newtown
    # for Malvern: it becomes a supplementary originating instance receiving from BrynMawr.
    a.kill()
    m.kill()
    b.call("receiver.stop")
    b.call("role", role="primary")
    n.call("receiver.stop")
    n.call("role", role="primary")
    n.start_receiver()
    held = HeldLink(c, b, n)
    held.connect(in_pool=2)  # A97, A98
    held.hold("B61")
    commit(b, "B62")
    # Row 2
    b_seq = rows("A95", "A96", "A97", "A98", "B61", "B62")
    assert labels(b) == b_seq
    assert labels(n) == n_row1

    # Row 3: Newtown needs no rollback (it is not ahead of BrynMawr) and originates N73, N74.
    held.release_pool()
    wait_has(n, "A98")
    commit(n, "N73")
    held.release_held()
    wait_has(n, "B61")
    commit(n, "N74")
    activate(b, n)
    wait_has(n, "B62")
    deactivate(b, n)
    assert labels(b) == b_seq
    n_row3 = n_row1 + ["A97", "A98", "N73", "B61", "N74", "B62"]
    assert labels(n) == n_row3

    # Row 4: the first data center is recovered; Ardmore and Malvern still hold what they had.
    a.start()
    m.start()
    commit(n, "N75")
    commit(b, "B63")
    activate(b, n)
    wait_has(n, "B63")
    deactivate(b, n)
    commit(n, "N76")
    commit(b, "B64")
    activate(b, n)
    wait_has(n, "B64")
    deactivate(b, n)
    b_seq = b_seq + ["B63", "B64"]
    n_row4 = n_row3 + ["N75", "B63", "N76", "B64"]
    assert labels(a) == rows("A95", "A96", "A97", "A98", "A99")  # the seed's "... A99"
    assert labels(b) == b_seq  # the seed prints this row without A98: see the comment above the test
    assert labels(m) == m_row1
    assert labels(n) == n_row4

    # Ardmore rolls back automatically (--autorollback) when BrynMawr connects; Malvern with
    # rollback --fetchresync from Newtown, then it replicates from Newtown.
    a.start_receiver(autorollback=True)
    b.start_source(a)
    wait_has(a, "B64")
    deactivate(b, a)
    rep = m.call("rollback", fetchresync=f"127.0.0.1:{n.client_port}")
    assert (rep["instance"], rep["rolled_back"]) == ("Malvern", 2)
    m.call("role", role="secondary")
    m.start_receiver()
    c.link(n, m)
    wait_has(m, "B64")
    deactivate(n, m)
    commit(b, "B65")
    commit(n, "N77")
    # Row 5
    assert labels(a) == b_seq
    assert labels(b) == b_seq + ["B65"]
    assert labels(m) == n_row4
    assert labels(n) == n_row4 + ["N77"]
    assert lost_labels(a) == [["A99"]]  # the seed: "Ardmore rolls off A98 and A99" (see above)
    assert lost_labels(m) == [["A97", "M38"]]  # "Malvern rolls off A97 and M38"
    assert lost_file_of(a).header["reason"].startswith("autorollback")
    assert lost_files(b) == [] and lost_files(n) == []
    check_si_tags(n, b_seq)
    check_si_tags(m, b_seq)  # Malvern received A97 again, from Newtown, with Newtown's tags
    check_bc_tags(a)

    # and they continue: Malvern follows Newtown, Ardmore follows BrynMawr.
    activate(n, m)
    activate(b, a)
    wait_has(m, "N77")
    wait_has(a, "B65")
    assert labels(m) == labels(n) and labels(a) == labels(b)


# -- table 5 ----------------------------------------------------------------------------------------
def test_table5_online_rollback_on_ardmore_malvern_noresync(cluster):
    c = cluster
    a, b, m = build_b97_m98(c, b_receiver={"autorollback": True}, m_receiver={"noresync": True})
    # Ardmore rolls back online to A96, with A97 through A99 in an Unreplicated Transaction Log.
    rep = a.call("rollback", resync=4)
    assert (rep["rolled_back"], rep["to_seqno"]) == (3, 4)
    assert lost_labels(a) == [["A97", "A98", "A99"]]
    assert labels(a) == rows("A95", "A96")
    # Ardmore originates A97a...: BrynMawr (--autorollback) rolls back to A96 automatically; Malvern
    # (--noresync) keeps A97, A98 and continues from A96.
    commit(a, "A97a")
    activate(a, b)
    activate(a, m)
    wait_has(b, "A97a")
    wait_has(m, "A97a")
    commit(m, "M41")
    commit(a, "A98a")
    wait_has(b, "A98a")
    wait_has(m, "A98a")
    deactivate(a, b)
    deactivate(a, m)
    commit(m, "M42")
    commit(a, "A99a")
    # Row 2
    assert labels(a) == rows("A95", "A96", "A97a", "A98a", "A99a")
    assert labels(b) == rows("A95", "A96", "A97a", "A98a")
    assert labels(m) == M_ROW1_B97 + ["A97a", "M41", "A98a", "M42"]
    assert lost_labels(b) == [["A97"]]
    assert lost_file_of(b).header["reason"].startswith("autorollback")
    assert lost_files(m) == []
    tags = tagged(m)
    # A97a and A98a are Ardmore's new seqnos 5 and 6, the same numbers A97 and A98 had
    assert [(s, ss, o) for _, s, ss, o in tags[-4:]] == [(1, 5, "Ardmore"), (0, 8, "Malvern"), (1, 6, "Ardmore"),
                                                        (0, 9, "Malvern")]
    check_bc_tags(b)


def test_table5_comment_malvern_with_autorollback_rolls_off_a97_through_m40(cluster):
    """The comment of table 5: with --autorollback instead, Malvern rolls A97 through M40 off."""
    c = cluster
    a, b, m = build_b97_m98(c, b_receiver={"autorollback": True}, m_receiver={"autorollback": True})
    a.call("rollback", resync=4)
    commit(a, "A97a")
    activate(a, m)
    wait_has(m, "A97a")
    assert lost_labels(m) == [["A97", "M37", "M38", "A98", "M39", "M40"]]
    assert labels(m) == rows("M34", "A95", "M35", "M36", "A96", "A97a")
    check_si_tags(m, labels(a))


def test_newtown_learns_a_stream_history_malvern_adopts_after_newtown_connected(cluster):
    """Q learns P's SI stream history in the Start of its connection to P. When P adopts a new one
    later (its first connection from A, or one from a new BC primary), Q must be told, or Q cannot
    take the stream from B "as being a continuation of the updates generated by A" (seed 000)."""
    c = cluster
    a = c.instance("Ardmore", group=BANK)
    b = c.instance("BrynMawr", group=BANK)
    m = c.instance("Malvern", group=SI, supplementary=True)
    n = c.instance("Newtown", group=SI, supplementary=True)
    n.call("role", role="secondary")
    c.link(m, n)  # Newtown first: Malvern has no SI stream yet
    wait_for(lambda: m.call("source.status", secondary="Newtown")["state"] == "streaming", "Malvern -> Newtown")
    c.link(a, b)
    c.link(a, m)
    commit(a, "A93")
    wait_has(b, "A93")
    wait_has(n, "A93")
    a.kill()
    m.kill()
    b.call("receiver.stop")
    b.call("role", role="primary")
    commit(b, "B61")
    n.call("receiver.stop")
    n.call("role", role="primary")
    n.start_receiver()
    c.link(b, n)
    wait_has(n, "B61")
    assert labels(n) == ["A93", "B61"] and lost_files(n) == []
