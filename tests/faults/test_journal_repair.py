"""``multisite journal repair``: after a power loss, a group-commit journal can hold a lost record
with intact, never acknowledged records behind it. Opening refuses it (JOURNAL_CORRUPT) and says
how to repair; the repair keeps the records after the damage in a lost file and cuts there, and
refuses when the store proves the damaged records were acknowledged."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import InstanceLocked, JournalCorrupt
from multisite.instance import instance_file as ifile
from multisite.instance import repair as jr
from multisite.journal.segments import SegmentView, list_segments
from multisite.journal.lostfile import LostFile, list_lost_files

COMMIT_AND_DIE = textwrap.dedent("""
    import os, sys
    import multisite, multisite.engine.core as d
    d.STORE_FLUSH_INTERVAL_S = 1e9  # the store stays at its last flush, as after a power loss
    db = multisite.open(sys.argv[1])
    for i in range(21, 51):
        db.set("r", ("k", i), i)
    os._exit(0)
""")


def _instance(tmp_path, *, flushed: bool):
    """An instance at seqno 50 whose store is at 20 (or at 50 when ``flushed``)."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(1, 21):
            db.set("r", ("k", i), i)
    if flushed:
        with multisite.open(root) as db:
            for i in range(21, 51):
                db.set("r", ("k", i), i)
    else:
        subprocess.run([sys.executable, "-c", COMMIT_AND_DIE, str(root)], check=True)
    return root


def _lose(root, *seqnos: int) -> bytes:
    """Zero the frames of ``seqnos`` in the newest segment (pages the disk never wrote); the file before."""
    tail = list_segments(root / "journal")[-1]
    before = tail.path.read_bytes()
    with SegmentView(tail) as v:
        frames = [(o, h) for o, h in v.frames(tail=True) if h.seqno in seqnos]
    data = bytearray(before)
    for off, hdr in frames:
        data[off : off + hdr.total] = bytes(hdr.total)
    tail.path.write_bytes(bytes(data))
    return before


def test_a_lost_unacknowledged_record_is_cut_with_the_records_after_it_kept_in_a_lost_file(tmp_path):
    root = _instance(tmp_path, flushed=False)
    _lose(root, 30)
    with pytest.raises(JournalCorrupt, match="journal repair"):
        multisite.open(root)
    res = CliRunner().invoke(cli, ["journal", "repair", str(root)])
    assert res.exit_code == 0 and "run again with --yes" in res.output, res.output
    with pytest.raises(JournalCorrupt):  # only shown, nothing cut
        multisite.open(root)
    p = jr.repair(root)
    assert (p.last_intact_seqno, p.intact_after, p.store_seqno, p.refused) == (29, list(range(31, 51)), 20, "")
    (lost,) = list_lost_files(root / "lost")
    assert [r.seqno for r in LostFile.read(lost).records()] == list(range(31, 51))
    info = ifile.load(root / "instance.msi")
    assert info.history[-1].start_seqno == 30 and info.history[-1].root_primary == "A"  # told apart from 30..50
    with multisite.open(root) as db:
        assert db.seqno == 29
        assert [db.get("r", ("k", i)) for i in (20, 29, 30, 31, 50)] == [20, 29, None, None, None]
        db.set("r", ("k", 30), "again")  # the journal goes on from the cut
        assert db.seqno == 30
    assert jr.plan(root) is None


def test_the_repair_is_refused_when_the_store_proves_the_damaged_records_were_acknowledged(tmp_path):
    root = _instance(tmp_path, flushed=True)
    before = _lose(root, 30)
    damaged = list_segments(root / "journal")[-1].path.read_bytes()
    p = jr.plan(root)
    assert p.store_seqno == 50 and "acknowledged" in p.refused
    with pytest.raises(JournalCorrupt, match="will not be cut"):
        jr.repair(root)
    assert list_segments(root / "journal")[-1].path.read_bytes() == damaged != before
    assert not (root / "lost").exists() or not list_lost_files(root / "lost")
    res = CliRunner().invoke(cli, ["journal", "repair", str(root), "--yes"])
    assert res.exit_code != 0 and "will not be cut" in res.output, res.output


def test_nothing_to_repair_and_never_under_a_live_owner(tmp_path):
    root = _instance(tmp_path, flushed=True)
    assert jr.plan(root) is None
    res = CliRunner().invoke(cli, ["journal", "repair", str(root), "--yes"])
    assert res.exit_code == 0 and "no damage" in res.output, res.output
    with multisite.open(root):
        with pytest.raises(InstanceLocked):
            jr.repair(root)


def test_records_behind_a_second_damaged_spot_are_kept_too(tmp_path):
    """Any page the lost writes dirtied may be lost: with two damaged spots, the intact records
    behind the second one go to the lost file too (they vanished without a trace)."""
    root = _instance(tmp_path, flushed=False)
    _lose(root, 30, 40)
    p = jr.repair(root)
    expect = [s for s in range(31, 51) if s != 40]
    assert (p.last_intact_seqno, p.intact_after) == (29, expect)
    (lost,) = list_lost_files(root / "lost")
    assert [r.seqno for r in LostFile.read(lost).records()] == expect
    with multisite.open(root) as db:
        assert db.seqno == 29
