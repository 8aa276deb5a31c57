"""One simulated instance of log shipping: its disk, journal, instance file and lost files.

What the engine does for an instance, reduced to what replication sees and done on a ``SimDisk``:
commits append real journal frames (``records.encode_record``) and are acknowledged only once
fsynced; a secondary journals the frames it receives byte for byte and fsyncs them before it
confirms; a rollback writes the frames it takes off into a lost-transaction file (durably, first)
and then cuts the journal, as ``engine/rollback.py`` does; the instance file is replaced atomically
(``fsutil.atomic_write``). History records come from the real ``InstanceFile`` methods, with the
uid and time passed in (a seed must replay).
"""

from __future__ import annotations

import msgspec

from ...instance.instance_file import InstanceFile, dumps, loads
from ...journal.records import SET, Record, Update, encode_record
from ...protocol.messages import Hello
from ...replication.history import hello_for, to_entries
from .disk import SimDisk, SimJournal

INSTANCE_FILE = "instance"
GROUP = "simgroup"
_value = msgspec.msgpack.Encoder()


class NodeCrashed(Exception):
    """An fsync failed (EIO): like PostgreSQL since "fsyncgate", the instance stops at once rather than
    trust a page cache that may have dropped the write."""


class Node:
    """``frame_ids`` maps each frame this simulation made to its number (``World``'s, shared by all
    nodes): frames are unique, so a frame's number says which commit it is on any instance."""

    def __init__(self, name: str, role: str, uid: int):
        self.name = name
        self.disk = SimDisk()
        self.journal = SimJournal(self.disk)
        self.info = InstanceFile(name=name, group=GROUP, role=role)
        self.info.add_history(1, name, "originating", uid=uid, created=0.0)
        self.up = True
        self.pending: list[int] = []  # frame numbers written, not yet hardened (not acknowledged)
        self.chain: list[int] = [0]  # chain[s]: a hash of frames 1..s (prefixes compared in O(1))
        self.ids: list[int] = []  # ids[s - 1]: the number of the frame at seqno s
        self.lost_ids: list[list[int]] = []
        self._entries_key: tuple = ()
        self._entries: list = []
        self.ids_key: tuple = ()  # the records' identities, (uid, start) each: equal means the same history
        self.save_info()

    # -- the instance file -------------------------------------------------------------------------
    def save_info(self) -> None:
        self.disk.replace(INSTANCE_FILE, dumps(self.info))

    def entries(self) -> list:
        """The history as the wire carries it, remade only when it changed (the invariants compare
        every pair of instances after every step): the history changes at its end (a record added,
        replaced or cut) or whole (adopted), so its length and first and last identities tell."""
        h = self.info.history
        key = (len(h), h[0].uid if h else 0, h[-1].uid if h else 0)
        if key != self._entries_key:
            self._entries_key, self._entries = key, to_entries(h)
            self.ids_key = tuple((e.uid, e.start_seqno) for e in self._entries)
        return self._entries

    def hello(self, **flags: object) -> Hello:
        return hello_for(self.info, self.journal.seqno, **flags)

    # -- the journal -------------------------------------------------------------------------------
    def _extend(self, ids: list[int]) -> None:
        chain = self.chain
        for i in ids:
            chain.append(hash((chain[-1], i)))
        self.ids.extend(ids)

    def commit(self, fid_of, n: int, time_s: float, make_id) -> list[int]:
        """Write ``n`` transactions (not yet hardened); their frame numbers. ENOSPC raises OSError
        before anything is written (the commit is refused, nothing acknowledged)."""
        frames, ids = [], []
        seqno = self.journal.seqno
        for k in range(1, n + 1):
            fid = make_id()
            rec = Record(seqno + k, 0, 0, self.name, time_s, [Update(SET, "sim", (fid % 97,), _value.encode(fid))])
            fr = encode_record(rec)
            fid_of[fr] = fid
            frames.append(fr)
            ids.append(fid)
        self.journal.append(frames)
        self._extend(ids)
        self.pending += ids
        return ids

    def harden(self) -> list[int]:
        """fsync: the frame numbers now acknowledged. EIO: ``NodeCrashed`` (the caller crashes us)."""
        try:
            self.journal.fsync()
        except OSError as e:
            raise NodeCrashed(str(e)) from None
        done, self.pending = self.pending, []
        return done

    def receive(self, frames: list[bytes], ids: list[int]) -> None:
        """Journal received frames and harden them (the Update Process: one write and fsync a batch)."""
        self.journal.append(frames)
        self._extend(ids)
        try:
            self.journal.fsync()
        except OSError as e:
            raise NodeCrashed(str(e)) from None

    def rollback(self, to_seqno: int, uid: int) -> list[int]:
        """Take the frames after ``to_seqno`` off into a lost-transaction file (hardened first), then
        cut the journal and the history; the frame numbers taken off."""
        if to_seqno >= self.journal.seqno:
            return []
        gone_ids = self.ids[to_seqno:]
        gone = self.journal.frames[to_seqno:]
        try:
            self.disk.replace(f"lost/{len(self.lost_ids)}", b"".join(gone))
        except OSError as e:
            raise NodeCrashed(str(e)) from None
        self.lost_ids.append(gone_ids)
        self.journal.cut(to_seqno)
        del self.ids[to_seqno:], self.chain[to_seqno + 1:]
        gone_set = set(gone_ids)
        self.pending = [i for i in self.pending if i not in gone_set]
        self.info.cut_at(to_seqno, uid=uid, created=0.0)
        self.save_info()
        return gone_ids

    # -- crash and restart -------------------------------------------------------------------------
    def crash(self, keep_permille: int) -> None:
        self.disk.crash(keep_permille)
        self.up = False
        self.pending = []

    def restart(self, fid_of: dict[bytes, int]) -> int:
        """Recover from what is on the disk: the instance file, the journal (a torn tail cut), the lost
        files. The torn bytes cut."""
        self.info = loads(self.disk.atomic[INSTANCE_FILE])
        torn = self.journal.recover()
        self.ids, self.chain = [], [0]
        self._extend([fid_of[fr] for fr in self.journal.frames])
        self.up = True
        return torn
