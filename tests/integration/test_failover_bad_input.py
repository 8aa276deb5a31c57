"""Bad input to the failover tools: a clear error, and nothing changed.

Through the Python API each case raises a MultisiteError subclass; through the CLI (the installed
``multisite`` script, in a child process) it exits with status 1 and one line on stderr, without a
traceback. "Nothing changed" is checked on the journal's bytes, the instance file, the store's
contents and the lost-transaction directory (or, for a running server, on what it serves).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import multisite
from multisite.errors import (ConfigError, ConnectionLost, GroupMismatch, LostFileCorrupt, NotAnInstance,
                              RollbackError)
from multisite.server.client import fetch_hello
from multisite.journal.lostfile import LostFile, list_lost_files
from multisite.replication.roles import resync_instance
from multisite.testing.cluster import Cluster
from multisite.testing.scenario import commit, labels, lost_files

MULTISITE = str(Path(sys.executable).with_name("multisite"))


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([MULTISITE, *map(str, args)], capture_output=True, text=True, timeout=60)


def assert_one_line_error(p: subprocess.CompletedProcess, code: str, *words: str) -> str:
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"error: {code}: ") and "Traceback" not in p.stderr, lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def fingerprint(root: Path) -> tuple:
    """Everything a rollback could change in a stopped instance."""
    journal = {p.name: p.read_bytes() for p in sorted((root / "journal").iterdir())}
    info = (root / "instance.msi").read_bytes()
    lost = sorted(p.name for p in (root / "lost").iterdir())
    with multisite.open(root) as db:
        content = {r: list(db.items(r)) for r in sorted(db.regions())}
        seqno = db.seqno
    return journal, info, lost, content, seqno


@pytest.fixture
def stopped(tmp_path):
    """A stopped instance with 5 transactions and one rollback already behind it."""
    root = multisite.create(tmp_path / "A", name="A", group="bank", durability="none")
    with multisite.open(root) as db:
        db.create_region("t")
        for i in range(7):
            db.set("t", (f"A{i}",), i)
        db.rollback(5)
    return root


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "c", durability="group")
    yield c
    c.stop_all()


# -- a rollback of an instance that does not exist --------------------------------------------------
def test_rollback_of_a_nonexistent_instance(tmp_path):
    missing = tmp_path / "nowhere"
    for args in (["rollback", missing, "--resync", "0"], ["rollback", missing, "--fetchresync", "127.0.0.1:1"],
                 ["instance", "role", missing, "primary"]):
        assert_one_line_error(cli(*args), "NOT_AN_INSTANCE", str(missing))
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli("rollback", empty, "--resync", "0"), "NOT_AN_INSTANCE", "not a multisite instance")
    assert list(empty.iterdir()) == []
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_one_line_error(cli("rollback", a_file, "--resync", "0"), "NOT_AN_INSTANCE", "is a file")
    assert a_file.read_text() == "x"
    with pytest.raises(NotAnInstance):
        multisite.open(missing)


# -- --resync past the end, and other bad targets ---------------------------------------------------
def test_resync_past_the_end_of_a_stopped_instance(stopped):
    before = fingerprint(stopped)
    assert before[-1] == 5 and len(before[2]) == 1
    line = assert_one_line_error(cli("rollback", stopped, "--resync", "6"), "ROLLBACK", "past the end", "5")
    assert "nothing was changed" in line
    assert_one_line_error(cli("rollback", stopped, "--resync", "-1"), "ROLLBACK")
    assert_one_line_error(cli("rollback", stopped), "CONFIG", "--resync", "--fetchresync")
    assert_one_line_error(cli("rollback", stopped, "--resync", "1", "--fetchresync", "127.0.0.1:1"), "CONFIG")
    with multisite.open(stopped) as db:
        for bad in (6, 10**12, -1):
            with pytest.raises(RollbackError):
                resync_instance(db, resync=bad)
        with pytest.raises(ConfigError):
            resync_instance(db)
    assert fingerprint(stopped) == before


def test_resync_past_the_end_of_a_running_instance(cluster):
    a = cluster.instance("A", group="bank")
    for i in range(4):
        commit(a, f"A{i}")
    for bad in (5, 99):
        with pytest.raises(RollbackError) as ei:
            a.call("rollback", resync=bad)
        assert "past the end" in ei.value.message
    assert_one_line_error(cli("rollback", a.root, "--resync", "77"), "ROLLBACK", "past the end")
    assert labels(a) == ["A0", "A1", "A2", "A3"] and lost_files(a) == [] and a.seqno() == 4
    assert commit(a, "A4") == 5  # and it goes on


def test_fetchresync_from_nowhere_or_from_another_group(cluster, stopped):
    before = fingerprint(stopped)
    assert_one_line_error(cli("rollback", stopped, "--fetchresync", "127.0.0.1:1"), "CONNECTION_LOST", "127.0.0.1:1")
    assert_one_line_error(cli("rollback", stopped, "--fetchresync", "no-port"), "CONFIG")
    other = cluster.instance("Other", group="elsewhere")
    commit(other, "O1")
    assert_one_line_error(cli("rollback", stopped, "--fetchresync", f"127.0.0.1:{other.client_port}"),
                          "GROUP_MISMATCH", "Other", "elsewhere")
    assert fingerprint(stopped) == before
    with pytest.raises(ConnectionLost):
        fetch_hello("127.0.0.1:1")
    with multisite.open(stopped) as db:
        with pytest.raises(GroupMismatch):
            resync_instance(db, primary=fetch_hello(f"127.0.0.1:{other.client_port}"))
    assert fingerprint(stopped) == before


# -- --noresync on a BC instance --------------------------------------------------------------------
def test_noresync_on_a_bc_instance(cluster):
    a = cluster.instance("A", group="bank")
    commit(a, "A1")
    with pytest.raises(ConfigError) as ei:
        a.start_receiver(noresync=True)
    assert "supplementary" in ei.value.message
    assert_one_line_error(cli("receiver", "start", a.root, "--listen", "127.0.0.1:0", "--noresync"), "CONFIG",
                          "--noresync", "BC instance")
    st = a.status()
    assert st["receiver"] is None and st["role"] == "primary"  # not even made a secondary
    assert labels(a) == ["A1"] and commit(a, "A2") == 2
    p = cluster.instance("P", group="si", supplementary=True)  # where it belongs, it is accepted
    p.start_receiver(noresync=True)
    assert p.call("receiver.status")["state"] == "listening"


# -- corrupt lost-transaction files ---------------------------------------------------------------
@pytest.fixture
def lost_file(stopped) -> Path:
    (f,) = list_lost_files(stopped / "lost")
    return f


def corrupt_variants(good: bytes):
    lines = good.splitlines(keepends=True)
    yield "empty", b""
    yield "header cut", good[: len(lines[0]) // 2]
    yield "header only", lines[0]
    yield "mid transaction", good[: len(lines[0]) + len(lines[1]) // 2]
    yield "no end line", b"".join(lines[:-1])
    yield "end line cut", good[:-10]
    yield "a transaction dropped", b"".join(lines[:1] + lines[2:])
    yield "not a lost file", b'{"format": "something-else/1"}\n{"end": true, "count": 0, "crc32": 0}\n'
    yield "a list", b"[1, 2]\n[3]\n"
    yield "binary", bytes(range(256)) * 4


def test_truncated_or_foreign_lost_files(lost_file, tmp_path):
    good = lost_file.read_bytes()
    assert [x["seqno"] for x in LostFile.read(lost_file).transactions] == [6, 7]
    for name, data in corrupt_variants(good):
        f = tmp_path / f"{name.replace(' ', '_')}.mslost"
        f.write_bytes(data)
        with pytest.raises(LostFileCorrupt):
            LostFile.read(f)
        assert f.read_bytes() == data, name
    for name in ("no_end_line", "end_line_cut", "a_transaction_dropped"):
        for args in (["lost", "show", tmp_path / f"{name}.mslost"], ["lost", "show", tmp_path / f"{name}.mslost",
                                                                        "--json"]):
            assert_one_line_error(cli(*args), "LOST_FILE_CORRUPT", f"{name}.mslost")
    # A wrong path is the caller's mistake, not a damaged file: a CONFIG error naming it.
    assert_one_line_error(cli("lost", "show", tmp_path / "missing.mslost"), "CONFIG", "missing.mslost")


def test_every_single_bit_flip_in_a_lost_file_is_detected(lost_file, tmp_path):
    good = lost_file.read_bytes()
    f = tmp_path / "flipped.mslost"
    for pos in range(len(good)):
        for bit in range(8):
            data = bytearray(good)
            data[pos] ^= 1 << bit
            f.write_bytes(bytes(data))
            with pytest.raises(LostFileCorrupt):
                LostFile.read(f)
    data = bytearray(good)
    data[len(good) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    assert_one_line_error(cli("lost", "show", f), "LOST_FILE_CORRUPT", "flipped.mslost")
    assert f.read_bytes() == bytes(data)
    assert lost_file.read_bytes() == good and LostFile.read(lost_file).header["instance"] == "A"
