"""Backup (``instance.maintenance.backup``) of a crashed, damaged or odd source, or one pruned while it is
copied: a clear error and no half copy, never a copy that silently misses acknowledged transactions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import multisite
from multisite.errors import InstanceExists, InstanceFileCorrupt, JournalCorrupt
from multisite.instance.layout import Layout
from multisite.instance.maintenance import backup, store_seqno
from multisite.journal.segments import SegmentView, list_segments
from multisite.testing.checks import filled_instance

WRITER = """
import sys, multisite, multisite.engine.core
multisite.engine.core.STORE_FLUSH_INTERVAL_S = 3600  # the store stays behind: the copy needs the journal
db = multisite.open(sys.argv[1], segment_bytes=int(sys.argv[2]))
i = 0
while True:
    db.set("acct", ("k", i % 50), {"i": i, "pad": "x" * 200})
    i += 1
    if i == 300:
        print("ready", flush=True)
"""


@pytest.fixture
def crashed(tmp_path):
    return _crash(tmp_path)


def _crash(tmp_path, segment_bytes=64 << 20):
    """An instance whose writer was SIGKILLed: the store is behind the journal (unflushed)."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    with multisite.open(root) as db:
        db.create_region("acct")
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(segment_bytes)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    return root


def _frames(root):
    info = list_segments(root / "journal")[-1]
    with SegmentView(info) as v:
        return info, [(off, hdr.seqno) for off, hdr in v.frames(tail=True)]


def _damage(path, off):
    with open(path, "r+b") as f:
        f.seek(off + 30)
        b = f.read(1)
        f.seek(off + 30)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_damaged_journal_fails_the_backup_instead_of_a_copy_cut_short(crashed, tmp_path):
    # The copy of the newest segment was cut at the first damaged frame without a word: the copy
    # opened (its store was behind the damage) and silently lacked acknowledged transactions that
    # the source still held after the damage (the source itself refuses to open: JournalCorrupt).
    s = store_seqno(Layout.existing(crashed))
    info, frames = _frames(crashed)
    after = [(off, q) for off, q in frames if q > s + 1]
    assert len(after) > 4, "the store must be behind the journal for this test"
    off, seqno = after[len(after) // 2]
    _damage(info.path, off)
    with pytest.raises(JournalCorrupt) as e:
        backup(crashed, tmp_path / "copy")
    assert info.path.name in str(e.value) and str(off) in str(e.value)
    assert not (tmp_path / "copy").exists()  # no half copy


def test_a_damaged_sealed_segment_the_copy_needs_fails_the_backup(tmp_path):
    # Sealed segments were copied unchecked: backup said "backed up", and the copy then refused to
    # open (its roll-forward hit the damage).
    root = _crash(tmp_path, segment_bytes=4096)
    s = store_seqno(Layout.existing(root))
    sealed = [i for i in list_segments(root / "journal")[:-1] if i.first_seqno > s + 1]
    assert sealed, "the store must be behind a sealed segment for this test"
    with SegmentView(sealed[0]) as v:
        off = [o for o, _ in v.frames(tail=False)][1]
    _damage(sealed[0].path, off)
    with pytest.raises(JournalCorrupt) as e:
        backup(root, tmp_path / "copy")
    assert e.value.path == str(sealed[0].path) and str(sealed[0].path) in str(e.value)
    assert not (tmp_path / "copy").exists()


def test_backup_refuses_a_file_or_damaged_instance_file_without_leaving_a_copy(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InstanceExists, match="is a file"):
        backup(root, tmp_path / "f")
    data = (root / "instance.msi").read_bytes()
    (root / "instance.msi").write_bytes(data[:-3])
    with pytest.raises(InstanceFileCorrupt, match="instance.msi"):
        backup(root, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InstanceFileCorrupt):
        backup(root, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []  # usable for a retry


def test_a_crashed_instance_backs_up_with_every_acknowledged_transaction(crashed, tmp_path):
    _, frames = _frames(crashed)
    backup(crashed, tmp_path / "copy")
    with multisite.open(tmp_path / "copy") as c:
        assert c.seqno == frames[-1][1]


def _filled(tmp_path):
    return filled_instance(tmp_path / "A", 60)


def test_a_missing_store_is_rebuilt_from_the_journal_so_prune_keeps_it_and_backup_copies_it(tmp_path):
    # sqlite3.OperationalError tracebacks before; opening such an instance rebuilds its store from
    # the whole journal, so prune must keep all of it, and a backup is the journal without a store.
    from multisite.instance.maintenance import prune

    root = _filled(tmp_path)
    for f in (root / "db").iterdir():
        f.unlink()
    rep = prune(root, 50)
    assert rep.removed == [] and rep.limit_seqno == 1
    backup(root, tmp_path / "copy")
    with multisite.open(tmp_path / "copy") as c:
        assert c.seqno == 60 and c.get("acct", ("k", 59)) == {"i": 59, "pad": "x" * 100}


def test_a_damaged_store_is_a_clear_error_naming_it(tmp_path):
    from multisite.errors import MultisiteError
    from multisite.instance.maintenance import prune

    root = _filled(tmp_path)
    for f in (root / "db").iterdir():
        f.unlink()
    (root / "db" / "store.sqlite").write_bytes(b"not a database" * 100)
    for fn in (lambda: prune(root, 50), lambda: backup(root, tmp_path / "copy")):
        with pytest.raises(MultisiteError, match="store.sqlite cannot be read"):
            fn()
    assert not (tmp_path / "copy").exists()


def test_segments_pruned_while_the_backup_copies_are_left_out_and_the_copy_opens(tmp_path, monkeypatch):
    """``journal prune`` may remove old segments between the backup's listing and its copy of them
    (it was FileNotFoundError): those, and older ones copied already, are not needed by the copy."""
    import shutil

    from multisite.instance import maintenance
    from multisite.instance.maintenance import prune

    root = _filled(tmp_path)
    with multisite.open(root) as db:
        db.flush()
    segs = list_segments(root / "journal")
    assert len(segs) >= 3
    real = shutil.copyfile

    def copy_after_prune(src, dst, *a, **k):
        if os.path.basename(src) == segs[1].path.name:  # prune runs just after segment 1 was copied
            prune(root, segs[-1].first_seqno)
        return real(src, dst, *a, **k)

    monkeypatch.setattr(maintenance.shutil, "copyfile", copy_after_prune)
    rep = backup(root, tmp_path / "copy")
    monkeypatch.setattr(maintenance.shutil, "copyfile", real)
    left = [s.path.name for s in list_segments(tmp_path / "copy" / "journal")]
    assert left == [s.path.name for s in list_segments(root / "journal")] and rep.segments == len(left)
    with multisite.open(tmp_path / "copy") as c:
        assert c.seqno == 60 and c.get("acct", ("k", 59)) == {"i": 59, "pad": "x" * 100}
