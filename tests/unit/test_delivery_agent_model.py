"""The real Message Agents of a consolidated instance and a remote (real instances, real inbox
folders), joined by a network that loses, duplicates and reorders messages, with agents that crash in
the middle of sending (their process state gone, what they committed kept), under Hypothesis. Every
transaction of each side must end up applied on the other exactly once (each key written once in its
journal), whatever happened on the way."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multisite.engine as engine
from multisite.delivery.server.agent import Agent
from multisite.journal.offsets import iter_commits, start_offset
from multisite.journal.records import record_decoder
from multisite.testing.delivery import FIELD, REGION, make_topology


class Crash(Exception):
    """The agent's process dies here."""


class Network:
    """What the agents send: held on the wire until delivered (into the recipient's inbox), lost or
    duplicated."""

    def __init__(self, inboxes: dict[str, Path]):
        self.inboxes = inboxes
        self.wire: list[tuple[str, str, bytes]] = []  # recipient, name, bytes
        self.sent: list[tuple[str, str, bytes]] = []  # everything ever sent: late duplicates come from here
        self.crash_after: int | None = None
        self.copies = 0

    def outbox(self, address: str, spool: Path):
        recipient = next(n for n, p in self.inboxes.items() if str(p) == address)
        net = self

        class Out:
            def send(self, name: str, data: bytes) -> None:
                if net.crash_after is not None:
                    if net.crash_after == 0:
                        raise Crash()
                    net.crash_after -= 1
                net.wire.append((recipient, name, data))
                net.sent.append((recipient, name, data))

            def close(self) -> None:
                pass

        return Out()

    def deliver(self, i: int, copy: bool = False) -> None:
        """Deliver a message on the wire, or (``copy``) another copy of any message ever sent, now."""
        pool = self.sent if copy else self.wire
        if pool:
            recipient, name, data = pool[i % len(pool)] if copy else pool.pop(i % len(pool))
            if copy:
                self.copies += 1
                name = name.replace(".msg", f".copy{self.copies}.msg")
            self.inboxes[recipient].mkdir(parents=True, exist_ok=True)
            (self.inboxes[recipient] / name).write_bytes(data)

    def lose(self, i: int) -> None:
        if self.wire:
            self.wire.pop(i % len(self.wire))


def _poll(path: Path, net: Network, crash_after: int | None = None) -> None:
    net.crash_after = crash_after
    with engine.open(path) as db:
        agent = Agent(db, outbox=net.outbox, message_bytes=300, gap_polls_before_resend=1, probe_after_polls=1)
        try:
            agent.poll()
        except Crash:
            pass  # the process dies: what it committed stays, the rest is gone
    net.crash_after = None


def _written(path: Path, prefix: str) -> list[tuple]:
    jdir = path / "journal"
    return sorted(tuple(u.key) for _, _, p in iter_commits(jdir, start_offset(jdir))
                  for u in record_decoder.decode(p).updates if u.region == REGION and u.key[0] == prefix)


ACTIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["commit_hq", "commit_p"]), st.integers(1, 4)),
    st.tuples(st.sampled_from(["poll_hq", "poll_p"]), st.one_of(st.none(), st.integers(0, 3))),
    st.tuples(st.sampled_from(["deliver", "copy", "lose"]), st.integers(0, 30)),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_real_agents_apply_each_transaction_once_through_loss_duplication_reordering_and_crashes(actions):
    root = Path(tempfile.mkdtemp(prefix="delivery-model-"))
    try:
        top = make_topology(root, {"P": "fr"}, durability="none")
        sites = {"hq": top.hq, "p": top.remotes["P"]}
        net = Network({"HQ": top.inbox("HQ"), "P": top.inbox("P")})
        counts = {"hq": 0, "p": 0}
        for what, arg in actions:
            if what.startswith("commit_"):
                side = what[7:]
                with engine.open(sites[side]) as db:
                    for _ in range(arg):
                        db.set(REGION, (side, counts[side]), {FIELD: "fr", "n": counts[side]})
                        counts[side] += 1
            elif what.startswith("poll_"):
                _poll(sites[what[5:]], net, arg)
            elif what == "copy":
                net.deliver(arg, copy=True)
            else:
                getattr(net, what)(arg)
        for _ in range(40):  # the network heals
            for side in ("hq", "p"):
                _poll(sites[side], net)
                while net.wire:
                    net.deliver(0)
            if (_written(top.remotes["P"], "hq") == [("hq", i) for i in range(counts["hq"])]
                    and _written(top.hq, "p") == [("p", i) for i in range(counts["p"])]):
                break
        assert _written(top.remotes["P"], "hq") == [("hq", i) for i in range(counts["hq"])]  # once each
        assert _written(top.hq, "p") == [("p", i) for i in range(counts["p"])]
    finally:
        shutil.rmtree(root, ignore_errors=True)
