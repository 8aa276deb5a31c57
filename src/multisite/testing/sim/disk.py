"""A simulated disk, and a journal of real frames on it.

Why a simulated disk and not the engine on real temp files (docs/decisions.md): a seed must replay
to the byte, thousands of times a minute. A real file system gives neither: an fsync costs
milliseconds (the speed figure is 1,000 simulated transactions a second), what survives a crash is
the kernel's choice and not the seed's, and ENOSPC or EIO on fsync cannot be made to happen at one
chosen write. Here every file is bytes plus how many of them are durable; a crash keeps the durable
bytes and a seed-chosen part of the rest (a torn last write, or whole unsynced frames that made it
after all); ENOSPC and EIO are armed by a step. The engine on real files is tested by the faults
tier (SIGKILL rounds, ``crash_writer``), which this does not replace.

The journal keeps the engine's frames byte for byte (``journal.records.frame``: CRCs and seqnos), and
its recovery reads them back with the engine's own parsers (``records.parse_header``, ``payload_ok``)
under the rule of ``journal/segments.scan``: a bad frame at the end is a torn write and is cut; a
bad frame followed by a good one is corruption.
"""

from __future__ import annotations

import errno

from ...journal.records import FRAME_HEADER_SIZE, parse_header, payload_ok


class SimFile:
    __slots__ = ("data", "durable")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable = 0  # bytes of ``data`` known to be on stable storage


class SimDisk:
    """Files of one simulated machine. ``free_bytes`` (None: unlimited) makes a write past it fail
    with ENOSPC; ``eio_fsyncs`` fails that many next fsyncs with EIO."""

    def __init__(self) -> None:
        self.files: dict[str, SimFile] = {}
        self.atomic: dict[str, bytes] = {}  # files replaced whole (temp, fsync, rename, fsync dir)
        self.free_bytes: int | None = None
        self.eio_fsyncs = 0

    def _file(self, name: str) -> SimFile:
        f = self.files.get(name)
        if f is None:
            f = self.files[name] = SimFile()
        return f

    def append(self, name: str, data: bytes) -> None:
        if self.free_bytes is not None:
            if len(data) > self.free_bytes:
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")
            self.free_bytes -= len(data)
        self._file(name).data += data

    def fsync(self, name: str) -> None:
        if self.eio_fsyncs:
            self.eio_fsyncs -= 1
            raise OSError(errno.EIO, "Input/output error on fsync (simulated)")
        f = self._file(name)
        f.durable = len(f.data)

    def truncate(self, name: str, size: int) -> None:
        """Truncate and fsync (a metadata change made durable before the caller goes on)."""
        f = self._file(name)
        if self.free_bytes is not None:
            self.free_bytes += max(0, len(f.data) - size)
        del f.data[size:]
        f.durable = min(f.durable, size)
        self.fsync(name)

    def read(self, name: str) -> bytes:
        return bytes(self._file(name).data)

    def replace(self, name: str, data: bytes) -> None:
        """``fsutil.atomic_write``: the old content or the new one survives a crash, never a mix."""
        if self.eio_fsyncs:
            self.eio_fsyncs -= 1
            raise OSError(errno.EIO, "Input/output error on fsync (simulated)")
        self.atomic[name] = bytes(data)

    def crash(self, keep_permille: int) -> None:
        """Power off: each file keeps its durable bytes and ``keep_permille``/1000 of the rest (the
        part of the last writes the disk had taken: a torn write when it ends inside a frame)."""
        for f in self.files.values():
            extra = len(f.data) - f.durable
            keep = f.durable + extra * keep_permille // 1000
            del f.data[keep:]
            f.durable = len(f.data)
        self.eio_fsyncs = 0


class JournalCorruptSim(Exception):
    """A bad frame with a valid one after it: corruption, not a torn write (a simulation bug or a
    disk model bug; never expected)."""


def scan_frames(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The frames of a journal file as ``(seqno, start, end)`` and the valid end; what follows it is a
    torn write (to be cut). The rule of ``journal/segments.scan`` with the engine's parsers."""
    out, off, size = [], 0, len(data)
    while off + FRAME_HEADER_SIZE <= size:
        hdr = parse_header(data, off)
        if hdr is None or off + hdr.total > size or not payload_ok(hdr, data, off):
            if _valid_frame_after(data, off + 1):
                raise JournalCorruptSim(f"bad frame at byte {off} with a valid frame after it")
            break
        out.append((hdr.seqno, off, off + hdr.total))
        off += hdr.total
    return out, off


def _valid_frame_after(data: bytes, start: int) -> bool:
    """Whether a whole valid frame starts anywhere after ``start`` (the torn-versus-corrupt test)."""
    for off in range(start, len(data) - FRAME_HEADER_SIZE + 1):
        hdr = parse_header(data, off)
        if hdr is not None and hdr.length > 0 and off + hdr.total <= len(data) and payload_ok(hdr, data, off):
            return True
    return False


class SimJournal:
    """One instance's journal on a ``SimDisk``: frames appended, hardened by ``fsync``, recovered on
    restart. ``frames[i]`` holds seqno ``i + 1``; ``durable_seqno`` is the last hardened one."""

    FILE = "journal"

    def __init__(self, disk: SimDisk):
        self.disk = disk
        self.frames: list[bytes] = []
        self.ends: list[int] = []  # byte offset where each frame ends in the file
        self.durable_seqno = 0

    @property
    def seqno(self) -> int:
        return len(self.frames)

    def append(self, frames: list[bytes]) -> None:
        """Write (not harden) ``frames``; ENOSPC leaves the file as it was (nothing half-written)."""
        blob = b"".join(frames)
        self.disk.append(self.FILE, blob)
        end = self.ends[-1] if self.ends else 0
        for fr in frames:
            end += len(fr)
            self.frames.append(fr)
            self.ends.append(end)

    def fsync(self) -> None:
        self.disk.fsync(self.FILE)
        self.durable_seqno = len(self.frames)

    def cut(self, seqno: int) -> list[bytes]:
        """Truncate after ``seqno`` (durably); the frames cut."""
        gone = self.frames[seqno:]
        size = self.ends[seqno - 1] if seqno else 0
        self.disk.truncate(self.FILE, size)
        del self.frames[seqno:], self.ends[seqno:]
        self.durable_seqno = min(self.durable_seqno, seqno)
        return gone

    def recover(self) -> int:
        """After a restart: read the file back, cut a torn tail; the bytes cut."""
        data = self.disk.read(self.FILE)
        found, valid_end = scan_frames(data)
        self.frames = [data[s:e] for _, s, e in found]
        self.ends = [e for _, _, e in found]
        for i, (seqno, _, _) in enumerate(found, 1):
            if seqno != i:
                raise JournalCorruptSim(f"frame {i} of the journal holds seqno {seqno}")
        torn = len(data) - valid_end
        if torn:
            self.disk.truncate(self.FILE, valid_end)
        self.durable_seqno = len(self.frames)
        return torn
