"""The test harnesses' free ports (testing/ports.py) come from below the kernel's ephemeral range, where
no outgoing connection can take one between the probe and the server's bind."""

from __future__ import annotations

import socket

from multisite.testing import ports
from multisite.testing.ports import LOWEST, ephemeral_range, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_bound():
    lo, hi = ephemeral_range()
    assert LOWEST < lo <= hi
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST <= p < lo for p in ports)
    assert len(ports) > 1  # picked at random, not one port for every caller
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # not one free_port gave: only the bind can tell it is taken
        held.listen()
        taken = held.getsockname()[1]
        real, tried = ports._pick.randrange, []
        picks = iter([taken, taken])  # then real picks: a neighbour of the taken port may be in use too
        monkeypatch.setattr(ports._pick, "randrange",
                            lambda lo, hi: tried.append(1) or next(picks, None) or real(lo, hi))
        assert free_port() != taken
        assert len(tried) >= 3  # the taken port was tried, twice, and passed over


def test_one_process_is_never_given_the_same_port_twice(monkeypatch):
    first = free_port()
    picks = iter([first, first + 1 if first + 1 < ephemeral_range()[0] else first - 1])
    monkeypatch.setattr(ports._pick, "randrange", lambda lo, hi: next(picks))
    assert free_port() != first  # free again (nothing bound it), but given already
