"""Preallocated journal segments: records written over hardened zeros (fsync and group modes).

Checks the on-disk contract that every reader relies on: while an instance is open its newest
segment ends in zeros; a sealed or closed segment holds records only; after a crash recovery keeps
a zero tail silently but cuts (and reports) anything else after the last record; a full disk turns
preallocation off without losing or half-writing a commit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

import multisite
from multisite.journal.reader import iter_records
from multisite.journal.segments import SegmentView, list_segments
from multisite.journal.writer import PREALLOC_BYTES


def _records_end(info) -> int:
    """The offset just past the segment's last record."""
    with SegmentView(info) as view:
        end = 64
        for off, hdr in view.frames(tail=True):
            end = off + hdr.total
        return end


def _fill(db, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        db.set("acct", ("k", i), {"i": i, "pad": "p" * 40})


@pytest.mark.parametrize("mode", ["fsync", "group"])
def test_the_tail_ends_in_zeros_that_the_next_open_writes_over(tmp_path, mode):
    root = multisite.create(tmp_path / "A", name="A", durability=mode)
    with multisite.open(root) as db:
        db.create_region("acct")
        _fill(db, 200)
        (tail,) = list_segments(root / "journal")
        end = _records_end(tail)
        size = tail.path.stat().st_size
        assert size >= end + PREALLOC_BYTES // 2  # preallocated ahead of the records
        assert tail.path.read_bytes()[end:].count(0) == size - end  # and only zeros
        # A reader of the live journal sees exactly the committed records, not the zeros.
        assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 201))
    # Closed: the zeros stay (a file is never shrunk under readers that may have it mapped) ...
    assert tail.path.stat().st_size == size and _records_end(tail) == end
    with multisite.open(root) as db:
        assert db.recovery.torn_bytes == 0 and db.recovery.notes == []
        _fill(db, 100, start=200)  # ... and the next open writes over them
    assert tail.path.stat().st_size == size
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 301))


def test_none_mode_does_not_preallocate(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("acct")
        _fill(db, 50)
        (tail,) = list_segments(root / "journal")
        assert tail.path.stat().st_size == _records_end(tail)


def test_sealed_segments_hold_records_only(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=16 * 1024)
    with multisite.open(root) as db:
        db.create_region("acct")
        _fill(db, 600)
        infos = list_segments(root / "journal")
        assert len(infos) > 3
        for info in infos[:-1]:
            assert info.path.stat().st_size == _records_end(info)
        assert infos[-1].path.stat().st_size > _records_end(infos[-1])
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 601))


def test_a_smaller_segment_size_on_reopen_seals_no_preallocated_zeros(tmp_path):
    # The first open preallocates 4 MiB of zeros under the default 64 MiB limit; reopening with a
    # 4 KiB limit sealed that segment with the zeros still after its records, and every later read
    # of it said JournalCorrupt "in a sealed segment" (the zeros were never a record).
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(5):
            db.set("acct", ("k", i), i)
    with multisite.open(root, segment_bytes=4096) as db:
        for i in range(60):  # 6 MiB: past the zeros, so the segment is sealed and the next one too
            db.set("acct", ("k", i), "x" * 100_000)
        seqno = db.seqno
    assert len(list_segments(root / "journal")) > 1  # it did switch
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, seqno + 1))
    with multisite.open(root) as db:
        assert db.seqno == seqno and db.get("acct", ("k", 59)) == "x" * 100_000


CRASHER = r"""
import os, signal, sys, multisite
db = multisite.open(sys.argv[1])
db.create_region("acct")
for i in range(int(sys.argv[2])):
    db.set("acct", ("k", i), {"i": i, "pad": "p" * 40})
print("DONE", db.seqno, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _crashed(tmp_path, n: int = 300):
    """An fsync-mode instance whose writer was SIGKILLed after ``n`` acknowledged commits."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    res = subprocess.run([sys.executable, "-c", CRASHER, str(root), str(n)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == -signal.SIGKILL and res.stdout.split() == ["DONE", str(n)], res.stderr
    (tail,) = list_segments(root / "journal")
    return root, tail


def test_a_crash_leaves_zeros_that_recovery_keeps_without_calling_them_torn(tmp_path):
    root, tail = _crashed(tmp_path)
    end = _records_end(tail)
    assert tail.path.stat().st_size > end
    with multisite.open(root) as db:
        assert db.seqno == 300 and db.recovery.torn_bytes == 0 and db.recovery.notes == []
        assert db.get("acct", ("k", 299)) == {"i": 299, "pad": "p" * 40}
        _fill(db, 100, start=300)  # written over the zeros the crash left
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 401))


def test_bytes_after_the_zero_header_are_cut_and_reported(tmp_path):
    """A write that never completed can leave bytes beyond a still-zero header (blocks reach the
    disk in any order): they were never acknowledged, so recovery cuts them and says so."""
    root, tail = _crashed(tmp_path)
    end = _records_end(tail)
    with open(tail.path, "r+b") as f:
        f.seek(end + 300)
        f.write(b"\x17" * 700)
    size = tail.path.stat().st_size
    with multisite.open(root) as db:
        assert db.seqno == 300
        assert db.recovery.torn_bytes == size - end and "cut a torn record" in db.recovery.notes[0]
        db.set("acct", ("after",), 1)
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 302))


FULL = r"""
import json, resource, signal, sys
import multisite, multisite.engine.core
from multisite.journal.segments import list_segments
multisite.engine.core.STORE_FLUSH_INTERVAL_S = 3600.0  # the store must not flush (and grow) under the limit
db = multisite.open(sys.argv[1])
db.create_region("acct")
(tail,) = list_segments(db.layout.journal)
size = tail.path.stat().st_size  # the segment header: nothing preallocated yet
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 2000, resource.RLIM_INFINITY))
out = {"ok": [], "error": None}
try:
    for i in range(100):  # the preallocation fails at once; the records themselves after ~2000 bytes
        out["ok"].append(db.set("acct", ("k", i), "v" * 100))
except Exception as e:
    out["error"] = type(e).__name__
out["seqno"] = db.seqno
out["size"] = tail.path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
out["next"] = db.set("acct", ("after",), 1)
db.close()
print(json.dumps(out))
"""


def test_a_full_disk_turns_preallocation_off_and_loses_nothing(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    res = subprocess.run([sys.executable, "-c", FULL, str(root)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    n = len(out["ok"])
    assert out["error"] in ("StorageFull", "OSError") and 5 < n < 100  # EFBIG here, ENOSPC on a full disk
    assert out["ok"] == list(range(1, n + 1)) and out["seqno"] == n
    (tail,) = list_segments(root / "journal")
    assert out["next"] == n + 1
    with multisite.open(root) as db:
        assert db.seqno == n + 1 and db.recovery.torn_bytes == 0
        assert [db.get("acct", ("k", i)) for i in range(n)] == ["v" * 100] * n
        assert db.get("acct", ("k", n)) is None  # the failed commit left nothing
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, n + 2))
    assert out["size"] <= 64 + 2000  # no zeros were left past the limit


def test_a_zeroed_record_with_records_after_it_is_corruption_not_a_torn_tail(tmp_path):
    """A lost (zeroed) sector in the middle of acknowledged records must not pass for the end of
    the journal: recovery refuses, naming file and offset, and cuts nothing."""
    root, tail = _crashed(tmp_path, 20)
    with SegmentView(tail) as view:
        offs = [off for off, _ in view.frames(tail=True)]
    before = tail.path.read_bytes()
    with open(tail.path, "r+b") as f:
        f.seek(offs[9])
        f.write(bytes(20))  # record 10's header
    with pytest.raises(multisite.JournalCorrupt) as e:
        multisite.open(root)
    assert str(tail.path) in str(e.value) and e.value.offset == offs[9]
    after = tail.path.read_bytes()
    assert len(after) == len(before) and after[offs[10]:] == before[offs[10]:]


READER = r"""
import sys, multisite
from multisite.journal.segments import SegmentView, list_segments
root = sys.argv[1]
db = multisite.open(root)
db.create_region("acct")
for i in range(30):
    db.set("acct", ("k", i), "v" * 100)
infos = list_segments(db.layout.journal)
views = [SegmentView(i) for i in infos]  # mapped now, zeros included
for i in range(30, 400):  # segment switches, then close
    db.set("acct", ("k", i), "v" * 100)
db.close()
seen = []
for v in views:
    seen += [h.seqno for _, h in v.frames(tail=True)]
    v.close()
print(len(seen), seen[:3])
"""


def test_readers_that_mapped_a_segment_survive_its_switch_and_close(tmp_path):
    """Files are never shrunk under a mapping: a reader walking a segment it mapped before the
    writer sealed and closed it reads on instead of dying of SIGBUS."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=16 * 1024)
    res = subprocess.run([sys.executable, "-c", READER, str(root)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert int(res.stdout.split()[0]) >= 30


def test_a_backup_copy_overtaken_by_the_writer_is_cut_after_its_last_intact_record(tmp_path):
    """A copy of the newest segment read while the owner wrote on can hold a half-written record
    followed by complete later ones; backup cuts it there, so the copy opens."""
    from multisite.instance.maintenance import cut_after_last_intact_record

    root, tail = _crashed(tmp_path, 40)
    with SegmentView(tail) as view:
        frames = [(off, hdr.total) for off, hdr in view.frames(tail=True)]
    off, total = frames[35]  # record 36 half there, 37..40 complete
    with open(tail.path, "r+b") as f:
        f.seek(off + total - 10)
        f.write(bytes(10))
    with pytest.raises(multisite.JournalCorrupt):
        multisite.open(root)
    cut_after_last_intact_record(tail.path)
    assert tail.path.stat().st_size == off
    with multisite.open(root) as db:  # the store was at 0: everything up to 35 is replayed
        assert db.seqno == 35 and db.get("acct", ("k", 34)) is not None


EIO_CHILD = r"""
import errno, json, os, sys, multisite
from multisite.journal import writer as W
db = multisite.open(sys.argv[1])
db.create_region("acct")
db.set("acct", ("a",), 1)
real = os.fdatasync
def eio(fd):  # the one fault a test cannot cause for real without a failing device
    raise OSError(errno.EIO, "Input/output error")
W.os.fdatasync = eio
out = {}
try:
    db.set("acct", ("b",), 2)
except Exception as e:
    out["first"] = str(e)
W.os.fdatasync = real
try:
    db.set("acct", ("c",), 3)
except Exception as e:
    out["then"] = str(e)
print(json.dumps(out), flush=True)
os._exit(0)  # no close: the process ends as after the error
"""


def test_a_failed_fdatasync_stops_the_writer(tmp_path):
    """An fsync error may mean earlier records never reached the disk and may not be reported
    again: the writer refuses further commits until the instance is reopened (recovery decides)."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    res = subprocess.run([sys.executable, "-c", EIO_CHILD, str(root)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "fdatasync" in out["first"] and "reopen" in out["then"]
    with multisite.open(root) as db:
        assert db.get("acct", ("a",)) == 1 and db.get("acct", ("c",)) is None


def test_a_fsync_token_from_a_replaced_writer_is_refused(tmp_path):
    """After a rollback replaces the journal writer, a commit still waiting for its fsync must not
    fsync a closed (or reused) descriptor nor move the new writer's durable position."""
    from multisite.journal.writer import JournalWriter

    root = multisite.create(tmp_path / "A", name="A", durability="group")
    with multisite.open(root) as db:
        db.create_region("acct")
        db.set("acct", ("a",), 1)
    (tail,) = list_segments(root / "journal")
    old = JournalWriter(root / "journal", index=1, path=tail.path, last_seqno=1, durability="group")
    old.append(b"", 1)
    token = old.sync_token()
    old.close()
    new = JournalWriter(root / "journal", index=1, path=tail.path, last_seqno=1, durability="group")
    with pytest.raises(multisite.JournalError, match="reopened or rolled back"):
        new.harden(token)
    assert new.durable_seqno == 1 and new.fsyncs == 0
    new.close()


def test_zeros_at_the_end_of_a_sealed_segment_are_corruption(tmp_path):
    """Only the newest segment may end in zeros: a sealed one never does, so a zeroed last record
    there is data lost, for readers and for the Spark planner alike."""
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=16 * 1024)
    with multisite.open(root) as db:
        db.create_region("acct")
        _fill(db, 400)
    sealed = list_segments(root / "journal")[0]
    with SegmentView(sealed) as view:
        last_off = [off for off, _ in view.frames(tail=False)][-1]
    size = sealed.path.stat().st_size
    with open(sealed.path, "r+b") as f:
        f.seek(last_off)
        f.write(bytes(size - last_off))
    with pytest.raises(multisite.JournalCorrupt):
        list(iter_records(root / "journal"))
    with SegmentView(sealed) as view, pytest.raises(multisite.JournalCorrupt):
        list(view.headers(tail=False))


def test_a_record_whose_header_is_visible_before_its_payload_is_not_planned(tmp_path):
    """A reader can see a frame's header while the writer is still copying its payload in (a large
    record in the preallocated newest segment). Planning readers (the Spark source's bounds and
    chunks, the export's CRC lists) walk headers only; they must stop before such a frame, not plan
    it and fail on it as corrupt. Simulated here by zeroing the last record's payload behind its
    intact header, as a reader could catch it mid-copy."""
    pytest.importorskip("pyarrow")
    from multisite.pipeline.plan import chunks, instance_ref, journal_bounds

    root = multisite.create(tmp_path / "A", name="A", durability="fsync")
    db = multisite.open(root)
    try:
        db.create_region("acct")
        _fill(db, 20)
        db.set("acct", ("big",), "v" * 300_000)  # seqno 21: bigger than one copy step
        (tail,) = list_segments(root / "journal")
        with SegmentView(tail) as view:
            off, hdr = list(view.headers(tail=True))[-1]
        assert hdr.seqno == 21 == db.seqno
        with open(tail.path, "r+b") as f:  # the payload's second half not copied in yet
            f.seek(off + hdr.total - 100_000)
            f.write(bytes(100_000))
        with SegmentView(tail) as view:
            assert [h.seqno for _, h in view.headers(tail=True)] == list(range(1, 21))
        assert journal_bounds(str(root)) == (1, 20)
        planned = chunks(instance_ref(str(root)), 1, None, index="off")
        assert max(c.last_seqno for c in planned) == 20
        # A sealed segment has no write in progress: the same damage there is corruption.
        with SegmentView(tail) as view, pytest.raises(multisite.JournalCorrupt):
            list(view.frames(tail=False))
    finally:
        db.close()
