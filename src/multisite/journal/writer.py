"""Appending frames to the journal and hardening them, in three durability modes.

- ``fsync``: every commit is written and ``fdatasync``-ed before the commit returns.
- ``group``: concurrent commits are combined into one write and one ``fdatasync`` (see
  ``engine.group``); each is still hardened before it returns.
- ``none``: written to the OS (survives a process crash, not a power cut), never fsynced.

``append`` must be called under the database's commit lock (it keeps seqno order); ``harden``
runs outside it, so that readers and the next batch are not held up by the fsync.

Segment switch: when a segment passes ``segment_bytes`` the writer fsyncs it (in every mode: a
sealed segment is always hard), creates the next one crash-safely with a back pointer, and switches.

Preallocation (``fsync`` and ``group``): the newest segment is extended ahead of the records with
zeros, written and hardened ``PREALLOC_BYTES`` at a time, and records are written over them. An
fdatasync then hardens only the records' blocks: the file's size and extents are already on disk,
so there is no metadata to journal with each commit (about 1.3 times the fsyncs per second of an
append on ext4 here). Readers take a frame header of zeros with only zeros after it as the end of
a segment's records. Files are never shrunk under readers that may have them mapped (a page past
the end would be SIGBUS): a segment keeps its zeros when it is sealed (there are none left by then:
the last preallocation stops at ``segment_bytes``) or closed, and the next open writes over them.
After a crash, recovery keeps a zero tail and cuts anything else after the last record. The cost:
every 4 MiB of records, one commit waits for the zeros' write and fdatasync (milliseconds).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

from ..errors import ConfigError, JournalError
from .durability import Durability
from ..fsutil import atomic_write, fsync_dir, write_all
from .segments import SegmentHeader, segment_name

_GENERATIONS = itertools.count(1)  # fd generations, unique in the process: a token outlives no writer
MIN_SEGMENT_BYTES = 4096
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
PREALLOC_BYTES = 4 * 1024 * 1024
_ZEROS = bytes(1024 * 1024)


def create_segment(journal_dir: Path, index: int, first_seqno: int, prev_index: int) -> Path:
    path = journal_dir / segment_name(index)
    hdr = SegmentHeader(index=index, first_seqno=first_seqno, prev_index=prev_index,
                        prev_last_seqno=first_seqno - 1, created=time.time())
    atomic_write(path, hdr.pack())
    return path


class JournalWriter:
    def __init__(self, journal_dir: Path, *, index: int, path: Path, last_seqno: int,
                 durability: str | Durability = Durability.FSYNC, segment_bytes: int = DEFAULT_SEGMENT_BYTES, size: int | None = None):
        """``size``: where the segment's records end (recovery's scan), when zeros may follow them."""
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"journal segment_bytes must be at least {MIN_SEGMENT_BYTES}, got {segment_bytes}")
        self.dir = journal_dir
        self.durability = durability = Durability.parse(durability)
        self._sync_each = durability is Durability.FSYNC  # harden in append (the commit path's test)
        self.segment_bytes = segment_bytes
        self.index = index
        self.path = path
        self._fd = os.open(path, os.O_WRONLY)
        self._alloc_end = os.fstat(self._fd).st_size  # the file's size: records, then zeros
        self._size = self._alloc_end if size is None else size  # where the next record goes
        self._prealloc = durability is not Durability.NONE
        self.written_seqno = last_seqno  # written to the OS
        self.durable_seqno = last_seqno  # hardened on disk
        self._generation = self._first_generation = next(_GENERATIONS)
        self._fsync_lock = threading.Lock()  # held while an fd is being fsynced
        self.fsyncs = 0
        self.broken: BaseException | None = None

    # -- called under the commit lock -------------------------------------------------------------
    def append(self, data: bytes, last_seqno: int) -> None:
        """Write the frames of one or more transactions ending at ``last_seqno``."""
        if self.broken is not None:
            raise JournalError(f"the journal writer failed earlier ({self.broken}); reopen the instance")
        if self._size >= self.segment_bytes and self._size >= self._alloc_end:
            # Past the limit and no zeros left: seal. Zeros preallocated under a larger limit (the
            # instance reopened with a smaller segment_bytes) are written over first: a sealed segment
            # must end at its last record, or readers take the zeros for corruption.
            self._switch()
        if self._prealloc and self._size + len(data) > self._alloc_end:
            self._extend(self._size + len(data))
        try:
            write_all(self._fd, data, f"journal segment {self.path}", offset=self._size)
        except BaseException as e:
            # A short write may have left part of a frame: put the zeros back over it (and cut what
            # went past the preallocated space), so the file stays a valid journal. Cutting the
            # zeros too would shrink the file under readers that have it mapped.
            try:
                end = min(self._size + len(data), self._alloc_end)
                if end > self._size:
                    write_all(self._fd, bytes(end - self._size), f"journal segment {self.path}", offset=self._size)
                os.ftruncate(self._fd, max(self._size, self._alloc_end))
            except OSError:
                self.broken = e
            raise
        self._size += len(data)
        self.written_seqno = last_seqno
        if self._sync_each:
            self._fdatasync(self._fd)
            self.fsyncs += 1
            self.durable_seqno = last_seqno

    @property
    def size(self) -> int:
        return self._size

    def _extend(self, end: int) -> None:
        """Write and harden zeros from the end of the file to past ``end`` (see Preallocation). If
        the zeros cannot be written (a full disk) they are taken back and this segment goes on
        without them. A failed fdatasync is another matter: it may report the loss of records
        written before (their pages failed to reach the disk), so the writer stops."""
        target = max(end, min(self._alloc_end + PREALLOC_BYTES, self.segment_bytes))
        try:
            off = self._alloc_end
            while off < target:
                chunk = _ZEROS[: min(len(_ZEROS), target - off)]
                write_all(self._fd, chunk, f"journal segment {self.path}", offset=off)
                off += len(chunk)
        except OSError:  # StorageFull is an OSError too
            os.ftruncate(self._fd, self._alloc_end)  # only zeros were written past it
            self._prealloc = False
            return
        self._fdatasync(self._fd)
        self._alloc_end = target

    def _switch(self) -> None:
        with self._fsync_lock:
            os.fsync(self._fd)
            os.close(self._fd)
            self._generation = next(_GENERATIONS)
        self.durable_seqno = max(self.durable_seqno, self.written_seqno)
        prev = self.index
        self.index += 1
        self.path = create_segment(self.dir, self.index, self.written_seqno + 1, prev)
        self._fd = os.open(self.path, os.O_WRONLY)
        self._size = self._alloc_end = os.fstat(self._fd).st_size
        self._prealloc = self.durability is not Durability.NONE

    # -- called without the commit lock -----------------------------------------------------------
    def sync_token(self) -> tuple[int, int, int]:
        """Under the commit lock: what ``harden`` needs to make everything written so far durable."""
        return self._fd, self._generation, self.written_seqno

    def harden(self, token: tuple[int, int, int]) -> None:
        """fdatasync without the commit lock (group commit), so the next batch is prepared meanwhile.
        Concurrent calls serialize on the fsync lock; a segment switch in between already synced."""
        fd, gen, target = token
        if gen < self._first_generation:
            raise JournalError(f"journal of {self.dir} was reopened or rolled back while a commit waited for "
                               f"its fsync; the commit's outcome is what the journal holds now")
        with self._fsync_lock:
            if self.broken is not None:  # an fdatasync failed: the kernel may have dropped these pages
                raise JournalError(f"the journal writer of {self.dir} failed earlier ({self.broken}); the "
                                   f"commit may not be on disk: reopen the instance (recovery checks the journal)")
            if gen != self._generation:
                return  # a segment switch (or close) since: it synced the old fd in full
            if self.durable_seqno < target:
                self._fdatasync(fd)
                self.fsyncs += 1
                self.durable_seqno = target  # under the lock, and below it only ``sync`` moves it, also under it

    def sync(self) -> None:
        """Harden everything written so far (any mode). Caller holds the commit lock. After a failed
        fdatasync it raises, as ``harden`` does: Linux reports a failed writeback once, so a second
        fdatasync may succeed with the pages of the first lost, and the store (committed only behind a
        hard journal) would go ahead of the journal on disk."""
        if self.broken is not None:
            raise JournalError(f"the journal writer of {self.dir} failed earlier ({self.broken}); nothing written "
                               f"since its last hard point is known to be on disk: reopen the instance")
        if self.durable_seqno < self.written_seqno or self.durability is Durability.NONE:
            target = self.written_seqno
            with self._fsync_lock:  # moved under the lock: a ``harden`` of a lower target must not lower it after
                self._fdatasync(self._fd)
                self.durable_seqno = max(self.durable_seqno, target)

    def _fdatasync(self, fd: int) -> None:
        """fdatasync; a failure stops the writer: the records it covers may not be on disk, and the
        kernel may not report it again (only recovery, on reopening, can tell what is there)."""
        try:
            os.fdatasync(fd)
        except OSError as e:
            self.broken = e
            raise JournalError(f"fdatasync of journal segment {self.path} failed ({e}); reopen the instance "
                               f"(recovery checks the journal)") from e

    def close(self) -> None:
        with self._fsync_lock:
            try:
                os.fsync(self._fd)
            except OSError as e:
                self.broken = e  # a harden waiting on this fd must not take the close for a sync
                raise
            finally:
                os.close(self._fd)
                self._generation = next(_GENERATIONS)
                fsync_dir(self.dir)
