"""The simulation's disk (issue 28): a crash keeps the durable bytes and a chosen part of the rest,
recovery cuts a torn frame with the engine's parsers and refuses a bad frame with a good one after it,
ENOSPC writes nothing, EIO fails the fsync and leaves the bytes undurable."""

import errno

import pytest

from multisite.journal.records import SET, Record, Update, encode_record
from multisite.testing.sim.disk import JournalCorruptSim, SimDisk, SimJournal


def frame(seqno: int) -> bytes:
    return encode_record(Record(seqno, 0, 0, "A", 0.0, [Update(SET, "r", (seqno,), b"v")]))


def test_a_crash_keeps_hardened_frames_and_recovery_cuts_a_torn_one():
    disk = SimDisk()
    j = SimJournal(disk)
    j.append([frame(1), frame(2)])
    j.fsync()
    j.append([frame(3)])
    disk.crash(500)  # half of frame 3 made it
    assert j.recover() > 0
    assert j.seqno == 2 and j.durable_seqno == 2
    assert SimJournal(disk).recover() == 0  # the cut was made durable


def test_unsynced_whole_frames_may_survive_a_crash():
    disk = SimDisk()
    j = SimJournal(disk)
    j.append([frame(1)])
    disk.crash(1000)
    assert j.recover() == 0 and j.seqno == 1


def test_a_bad_frame_before_a_good_one_is_corruption_not_a_torn_write():
    disk = SimDisk()
    j = SimJournal(disk)
    j.append([frame(1), frame(2)])
    j.fsync()
    disk.files[SimJournal.FILE].data[25] ^= 0xFF  # inside frame 1's payload
    with pytest.raises(JournalCorruptSim):
        j.recover()


def test_enospc_writes_nothing_and_eio_fails_the_fsync():
    disk = SimDisk()
    j = SimJournal(disk)
    disk.free_bytes = 10
    with pytest.raises(OSError) as e:
        j.append([frame(1)])
    assert e.value.errno == errno.ENOSPC and j.seqno == 0 and disk.read(SimJournal.FILE) == b""
    disk.free_bytes = None
    j.append([frame(1)])
    disk.eio_fsyncs = 1
    with pytest.raises(OSError) as e:
        j.fsync()
    assert e.value.errno == errno.EIO and j.durable_seqno == 0
    disk.crash(0)
    assert j.recover() == 0 and j.seqno == 0
