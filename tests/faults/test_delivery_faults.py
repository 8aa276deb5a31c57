"""Delivery under faults, with real ``multisite delivery agent`` processes over the file transport:

- SIGKILL of an agent at random points of its polls (sending, applying, confirming), seeded rounds on
  both sides of a two-way link: nothing lost, nothing applied twice (each of HQ's transactions is
  in the remote's journal exactly once, and each of the remote's in HQ's), and the applications'
  history of commits (``testing/history``) checked on both sites: no lost write, phantom or duplicate;
- a full disk on the receiving side (its instance on a small tmpfs): nothing applied in part, the
  messages wait, and everything applies once there is room;
- a damaged and a truncated message file: a clear error naming it, not applied, and the resend
  it triggers delivers what it held.

The SIGKILL rounds replay from their seed: ``DELIVERY_FAULT_SEED=<seed> pytest ...`` (default 1313; the
coverage checks, half the rounds killed mid-poll and kills while sending and applying, hold for it, and
may miss for another seed without a bug).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

import multisite.engine as engine
from multisite.delivery.sysremote import STATE_REGION
from multisite.journal.offsets import iter_commits, start_offset
from multisite.journal.records import record_decoder
from multisite.testing.delivery import FIELD, REGION, agent_process, make_topology, rows, run_agent
from multisite.testing.history import WRITE, Recorder, check

ROUNDS = 24
SEED = int(os.environ.get("DELIVERY_FAULT_SEED", "1313"))


def _applied_keys(path, prefix: str) -> list[tuple]:
    """Every key with ``prefix`` written into REGION by the instance's journal, once per write."""
    jdir = path / "journal"
    out = []
    for _, _, payload in iter_commits(jdir, start_offset(jdir)):
        for u in record_decoder.decode(payload).updates:
            if u.region == REGION and u.key[0] == prefix:
                out.append(tuple(u.key))
    return out


def _lines(path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _commit(path, prefix: str, start: int, n: int, value: str, per_tx: int = 5,
            history: Recorder | None = None) -> None:
    """``n`` rows in transactions of ``per_tx`` (fewer fsyncs: the rounds are about the agents); each row
    a write of its own number to its key in ``history``, acknowledged when its transaction commits."""
    with engine.open(path) as db:
        for t in range(start, start + n, per_tx):
            rows_ = range(t, min(t + per_tx, start + n))
            ops = [history.invoke(prefix, WRITE, (prefix, i), i) for i in rows_] if history is not None else []
            with db.transaction() as tx:
                for i in rows_:
                    tx.set(REGION, (prefix, i), {FIELD: value, "pad": "x" * 64})
            for op in ops:
                history.ok(op)


def _check_history(top, history: Recorder) -> str:
    """Each site's rows and journal against the applications' commits (``testing/history``)."""
    h = history.history()
    out = []
    for name, path in top.sites.items():
        final = {k: k[1] for k in rows(path)}
        applied = [(k, k[1]) for k in _applied_keys(path, "hq") + _applied_keys(path, "p")]
        report = check(h, final, applied=applied)
        report.assert_clean(name)
        out.append(f"{name}: {report.summary()}")
    return "; ".join(out)


def _settle(top, rounds: int = 10) -> None:
    """Agent processes in turn until a whole round finds nothing to do (a gap takes a few rounds:
    the receiver asks for the resend on its second idle poll)."""
    for _ in range(rounds):
        busy = False
        for path in top.sites.values():
            res = run_agent(path, "--until-idle", "--interval", "0", "--json")
            assert res.returncode == 0, res.stderr
            polls = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
            busy |= any(p["busy"] or p["waiting"] or p["resend_requests"] for p in polls)
        if not busy:
            return


def test_sigkill_of_agents_at_random_points_loses_nothing_and_applies_nothing_twice(tmp_path):
    rng = random.Random(SEED)
    top = make_topology(tmp_path, {"P": "fr"})
    p = top.remotes["P"]
    hq_n = p_n = 0
    kills = 0
    phases: set[str] = set()  # what the agent had just logged when it was killed
    history = Recorder()
    for rnd in range(ROUNDS):
        _commit(top.hq, "hq", hq_n, 300, "fr", history=history)
        hq_n += 300
        _commit(p, "p", p_n, 100, "fr", history=history)
        p_n += 100
        site = top.hq if rnd % 2 == 0 else p
        logf = site / "log" / "delivery-agent.log"
        base = _lines(logf)
        at = base + 1 + rng.randrange(40)  # killed once the agent has logged this many steps (sent, applied, ...)
        proc = agent_process(site, "--until-idle", "--interval", "0", "--message-bytes", "4096",
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and _lines(logf) < at:
            time.sleep(0.0005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
            last = logf.read_text().splitlines()[-1] if logf.exists() else ""
            phases.update(w for w in ("sent", "applied", "confirmed", "dropped") if f" {w} " in last)
        proc.wait()
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"round {rnd}: the agent failed: {proc.stderr.read().decode()}")
        proc.stderr.close()
    assert kills >= ROUNDS // 2, f"only {kills} agents were killed mid-poll: the rounds test too little"
    assert {"sent", "applied"} <= phases, phases  # killed while sending and while applying (confirming between)
    _settle(top)
    hq_keys, p_keys = _applied_keys(p, "hq"), _applied_keys(top.hq, "p")
    assert sorted(hq_keys) == [("hq", i) for i in range(hq_n)]  # each once: nothing lost or applied twice
    assert sorted(p_keys) == [("p", i) for i in range(p_n)]
    assert rows(p) == rows(top.hq)
    with engine.open(top.hq) as db:
        out = db.get(STATE_REGION, ("P", "out"))
    assert out["confirm_sent"] == out["log_sent"]
    print(f"seed {SEED}: {ROUNDS} rounds, {kills} agents SIGKILLed mid-poll; history: {_check_history(top, history)}")


needs_mount = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")


@needs_mount
def test_a_full_disk_on_the_receiving_side_applies_nothing_in_part_and_resumes_once_there_is_room(tmp_path):
    top = make_topology(tmp_path / "t", {"P": "fr"}, durability="fsync")
    p = top.remotes["P"]
    small = tmp_path / "small"
    small.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs", str(small)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        shutil.copytree(p, small / "P")  # the remote instance on the small disk; its inbox stays on the big one
        shutil.rmtree(p)
        os.symlink(small / "P", p)
        with engine.open(top.hq) as db:
            for i in range(16):  # ~16 MB: more than the remote's 6 MiB disk
                with db.transaction() as tx:
                    for j in range(500):
                        tx.set(REGION, ("hq", i, j), {FIELD: "fr", "pad": "y" * 1000})
        assert run_agent(top.hq, "--once").returncode == 0
        res = run_agent(p, "--until-idle", "--interval", "0")
        # The journal (STORAGE_FULL) or the store (STORE_LOST, "a full disk?") finds the disk full first.
        assert res.returncode == 1 and ("STORAGE_FULL" in res.stderr or "full disk" in res.stderr), res.stderr
        got = _applied_keys(p, "hq")  # the journal: opening the store needs room to roll it forward
        assert len(got) % 500 == 0 and len(got) < 8000  # whole transactions only, and not all of them
        assert any(top.inbox("P").glob("*.msg"))  # the rest waits in the inbox
        subprocess.run(["mount", "-o", "remount,size=200m", str(small)], check=True)
        _settle(top, rounds=3)
        assert len(rows(p)) == 8000
        assert sorted(_applied_keys(p, "hq")) == sorted(k for k in rows(top.hq))
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_message_file_is_named_not_applied_and_resent(tmp_path, damage):
    top = make_topology(tmp_path, {"P": "fr"})
    p = top.remotes["P"]
    _commit(top.hq, "hq", 0, 5, "fr")
    assert run_agent(top.hq, "--once").returncode == 0
    _commit(top.hq, "hq", 5, 5, "fr")
    assert run_agent(top.hq, "--once").returncode == 0
    first = sorted(top.inbox("P").glob("*.msg"))[0]
    data = bytearray(first.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2:]
    else:
        data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    res = run_agent(p, "--once")
    assert res.returncode == 0
    assert first.name in res.stdout.replace("\n", "") and "MESSAGE_CORRUPT" in res.stdout.replace("\n", "")
    assert rows(p) == {}  # the second message waits: nothing out of order
    assert "rejected" in (p / "log" / "delivery-agent.log").read_text()
    _settle(top, rounds=6)
    assert sorted(_applied_keys(p, "hq")) == [("hq", i) for i in range(10)]
