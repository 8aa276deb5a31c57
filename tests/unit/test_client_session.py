"""The client protocol's connection state and group gathering, sans-IO (``protocol.client``).

``ClientSession``: what may start when (pipelined commits join one group in order, a read waits for
the commits before it to be written, nothing overtakes a running request), replies strictly in request
order however requests finish, a bad frame keeps what came before it. ``Gathering``: commits of many
connections written as one batch, hardened by one fdatasync with whatever was written before it
started, a failure of one commit or of the fdatasync answered to exactly the commits it concerns.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multisite.errors import LocalProtocolError, NotPrimary, RemoteProtocolError
from multisite.protocol.client import (DONE, GATHERED, RUNNING, WRITTEN, ClientSession, Gathering, LEN, encode)


def _session(*reqs: list, **kw) -> ClientSession:
    s = ClientSession(**kw)
    s.feed(b"".join(encode(r) for r in reqs))
    s.parse()
    return s


def _start_all(s: ClientSession) -> list:
    out = []
    while (r := s.next_runnable()) is not None:
        out.append(r)
    return out


def test_consecutive_pipelined_commits_join_one_group_and_a_read_waits_until_they_are_written():
    s = _session([1, "commit", {}], [2, "commit", {}], [3, "get", {}], [4, "commit", {}])
    first = _start_all(s)
    assert [(r.rid, r.state) for r in first] == [(1, GATHERED), (2, GATHERED)]  # the get waits
    s.written(first[0])
    assert s.next_runnable() is None  # commit 2 is not written yet
    s.written(first[1])
    get = s.next_runnable()
    assert (get.rid, get.state) == (3, RUNNING)
    assert s.next_runnable() is None  # nothing overtakes a running request, not even a commit
    s.answer(get, True, "v")
    assert s.replies() == []  # the commits before it are not answered yet: nothing goes out
    (c4,) = _start_all(s)
    assert c4.rid == 4
    s.answer(first[1], True, 2)
    assert s.replies() == []
    s.answer(first[0], True, 1)
    assert s.replies() == [[1, True, 1], [2, True, 2], [3, True, "v"]]
    s.answer(c4, False, ["NOT_PRIMARY", "no"])
    assert s.replies() == [[4, False, ["NOT_PRIMARY", "no"]]] and s.in_flight == 0


def test_a_frame_split_anywhere_gives_the_same_requests():
    data = encode([1, "get", {"k": "x" * 300}]) + encode([2, "commit", {"ops": []}])
    for cut in range(len(data) + 1):
        s = ClientSession()
        s.feed(data[:cut])
        s.parse()
        s.feed(data[cut:])
        s.parse()
        assert [r.rid for r in _start_all(s)] == [1] and s.in_flight == 2


def test_a_request_of_the_wrong_shape_stops_parsing_but_keeps_the_requests_before_it():
    s = ClientSession()
    s.feed(encode([1, "get", {}]) + encode([2, "get"]) + encode([3, "get", {}]))
    with pytest.raises(RemoteProtocolError, match=r"\[id, op, args\]"):
        s.parse()
    assert [r.rid for r in _start_all(s)] == [1]
    s2 = ClientSession()
    s2.feed(LEN.pack(3) + b"\xc1\xc1\xc1")
    with pytest.raises(RemoteProtocolError, match="malformed client frame"):
        s2.parse()


def test_the_pipeline_bound_and_dropping_what_never_started():
    s = _session(*([i, "info", {}] for i in range(3)), max_pipeline=3)
    assert not s.wants_more and s.in_flight == 3
    r = s.next_runnable()
    assert s.drop_waiting() == 2 and s.in_flight == 1 and s.next_runnable() is None
    s.answer(r, True, {})
    assert s.replies() == [[0, True, {}]] and s.wants_more


def test_answering_twice_or_writing_a_request_that_is_not_gathered_is_a_local_error():
    s = _session([1, "info", {}])
    r = s.next_runnable()
    with pytest.raises(LocalProtocolError):
        s.written(r)
    s.answer(r, True, 1)
    with pytest.raises(LocalProtocolError):
        s.answer(r, True, 1)


def test_gathering_writes_many_connections_in_one_batch_and_one_fdatasync_answers_them():
    g = Gathering()
    a = _session([1, "commit", {}], [2, "commit", {}])
    b = _session([7, "commit", {}])
    for s in (a, b):
        for r in _start_all(s):
            g.add(r, ["ops", r.rid])
    batch = g.take_batch()
    assert [ops for _, ops in batch] == [["ops", 1], ["ops", 2], ["ops", 7]] and len(g) == 0
    reqs = [r for r, _ in batch]
    # commit 2 failed alone: answered at once; the others wait for their fdatasync
    answered = g.wrote(reqs, [11, NotPrimary("refused"), 12], token="t1")
    assert [r.rid for r in answered] == [2] and reqs[1].state is DONE and reqs[0].state is WRITTEN
    assert a.replies() == []  # 2 is answered but 1 is not: order holds
    token, upto = g.to_harden(0)  # the sync thread starts an fdatasync: everything written so far
    assert (token, upto) == ("t1", 2)
    # while it syncs, another batch is written; the sync in flight does not cover it
    c = _session([9, "commit", {}])
    (r9,) = _start_all(c)
    g.add(r9, "x")
    g.wrote([r for r, _ in g.take_batch()], [13], token="t2")
    assert g.synced(upto) == [reqs[0], reqs[2]]
    assert a.replies() == [[1, True, 11], [2, False, ["NOT_PRIMARY", "refused"]]] and b.replies() == [[7, True, 12]]
    assert c.replies() == [] and g.waiting_sync == 1
    assert g.to_harden(upto) == ("t2", 3) and g.to_harden(3) is None
    g.synced(3, OSError(5, "EIO"))
    (code, msg), = [rep[2] for rep in c.replies()]
    assert code == "SERVER" and "EIO" in msg


def test_a_batch_with_nothing_to_harden_is_answered_when_written():
    g = Gathering()
    s = _session([1, "commit", {}])
    (r,) = _start_all(s)
    g.add(r, "x")
    assert g.wrote([r for r, _ in g.take_batch()], [0], token=None) == [r]
    assert s.replies() == [[1, True, 0]] and g.to_harden(0) is None


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.sampled_from(["commit", "get", "create_region"]), min_size=1, max_size=12),
       seed=st.randoms(use_true_random=False))
def test_replies_always_leave_in_request_order_whatever_order_requests_finish_in(ops, seed):
    s = _session(*([i, op, {}] for i, op in enumerate(ops)))
    sent: list = []
    pending: list = []
    g = Gathering()
    hard = 0
    while len(sent) < len(ops):
        for r in _start_all(s):
            (g.add(r, None) if r.op == "commit" else pending.append(r))
        choices = []
        if len(g):
            choices.append("write")
        if g.to_harden(hard) is not None:
            choices.append("sync")
        if pending:
            choices.append("run")
        assert choices, "stuck: nothing can make progress"
        what = seed.choice(choices)
        if what == "write":
            batch = [r for r, _ in g.take_batch()]
            g.wrote(batch, [r.rid for r in batch], token="t")
        elif what == "sync":
            _token, hard = g.to_harden(hard)
            g.synced(hard)
        else:
            r = pending.pop(seed.randrange(len(pending)))
            s.answer(r, True, r.rid)
        sent += s.replies()
    assert [rep[0] for rep in sent] == list(range(len(ops)))
    assert all(msgspec.msgpack.decode(encode(rep)[4:]) == rep for rep in sent)


def _hard(g: Gathering, *rids_seqnos: tuple[int, int], now: float = 0.0) -> tuple[ClientSession, list]:
    s = _session(*[[rid, "commit", {}] for rid, _ in rids_seqnos])
    reqs = _start_all(s)
    for r in reqs:
        g.add(r, "x")
    g.wrote([r for r, _ in g.take_batch()], [q for _, q in rids_seqnos], token="t")
    g.synced(g.written_total, None, now)
    return s, reqs


def test_with_min_confirm_a_hard_commit_is_answered_only_once_confirmed():
    g = Gathering()
    g.min_confirm = 1
    s, reqs = _hard(g, (1, 10), (2, 11))
    assert s.replies() == [] and g.waiting_confirm == 2
    assert g.confirmed(10) == [reqs[0]] and s.replies() == [[1, True, 10]]
    assert g.confirmed(9) == []  # confirmations never go back
    assert g.confirmed(11) == [reqs[1]] and s.replies() == [[2, True, 11]]
    s2, (r3,) = _hard(g, (3, 11))  # already confirmed when it became hard: answered at once
    assert s2.replies() == [[3, True, 11]]


def test_with_min_confirm_an_unconfirmed_commit_is_refused_after_its_timeout_naming_why():
    g = Gathering()
    g.min_confirm = 2
    s, _ = _hard(g, (1, 5), now=100.0)
    assert g.expire(100.5, 1.0, "1 of the 2 secondaries needed are connected") == []
    (late,) = g.expire(101.0, 1.0, "1 of the 2 secondaries needed are connected")
    ((rid, ok, (code, msg)),) = s.replies()
    assert (rid, ok, code) == (1, False, "MIN_CONFIRM_TIMEOUT")
    assert "hard on this primary" in msg and "2 secondaries" in msg and "1 of the 2" in msg
