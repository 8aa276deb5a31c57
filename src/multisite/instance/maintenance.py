"""Backup and journal pruning: operations on an instance directory that may be live.

Backup is consistent without stopping the owner: the store is copied first through SQLite's backup
API (a committed snapshot at some seqno S, never ahead of the hardened journal), then the journal
segments (which hold at least everything up to S), then the instance file. The copy of the newest
segment is cut after its last intact record (the owner may have written on while it was read).
Opening the copy rolls its store forward from the copied journal. Before it returns, backup checks
that the copy holds, intact, every record from the store's seqno to the last one the journal held
when it began: a damaged source journal fails the backup (naming the file and offset) rather than
giving a copy cut short at the damage.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, InstanceExists, JournalCorrupt, MultisiteError
from ..fsutil import GROUP_READ_DIR_MODE, atomic_write, copy_file, create_file, fsync_dir, make_dir, make_root
from ..journal.reader import iter_frames
from ..journal.recovery import JournalState, recover_journal
from ..journal.segments import SEGMENT_HEADER_SIZE, SUFFIX, SegmentInfo, SegmentView, list_segments, read_header
from ..journal.sidecars import drop_segments
from . import archives, consumers, instance_file as ifile
from .layout import Layout
from .users import users_path


@dataclass
class BackupReport:
    dest: Path
    store_seqno: int
    segments: int
    bytes_copied: int


def store_seqno(layout: Layout) -> int:
    """The store's committed applied seqno, read through its own connection (safe while live). A
    store that is not there is at 0: opening the instance rebuilds it from the whole journal."""
    if not layout.store_file.exists():
        return 0
    return store_file_seqno(layout.store_file)


def store_file_seqno(path: str | Path) -> int:
    """``store_seqno`` of a store file (the store itself, or a consistent copy of a live one's)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
            return row[0] if row else 0
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise MultisiteError(f"the store {path} cannot be read ({e}); restore the instance from a "
                             f"backup") from None


def cut_after_last_intact_record(path: Path) -> None:
    """Cut a copied newest segment after its last intact record, without looking further.

    The copy is read while the owner goes on writing (over preallocated zeros): it can hold a
    record that was still being written when its bytes were read and, after it, records written
    later and read complete, which recovery would call corruption. Everything the copied store
    needs was hardened before the copy began, so nothing past the first damaged record is needed."""
    info = SegmentInfo(path, read_header(path))
    with SegmentView(info) as view:
        end = SEGMENT_HEADER_SIZE
        for off, hdr in view.frames(tail=True, search=False):
            end = off + hdr.total
        size = view.size
    if end < size:
        with open(path, "rb+") as f:
            f.truncate(end)


def backup(src: str | Path, dest: str | Path) -> BackupReport:
    lay = Layout.existing(src)
    out = Layout(Path(dest).absolute())
    if out.root.exists() and not out.root.is_dir():
        raise InstanceExists(f"backup destination {out.root} is a file; choose a new directory")
    if out.root.exists() and any(out.root.iterdir()):
        raise InstanceExists(f"backup destination {out.root} exists and is not empty; choose a new directory")
    inst = ifile.load(lay.instance_file)  # a damaged instance file fails the backup before anything is copied
    # Every record acknowledged before the backup began is in the journal now, up to ``acked``; this
    # also checks the newest segment (corruption there is JournalCorrupt, not a copy cut short).
    acked = recover_journal_hinted(lay.journal, repair=False).last_seqno
    created = not out.root.exists()
    try:
        return _backup(lay, out, inst, acked)
    except BaseException:
        # Leave no half copy behind (it would look like an instance, and block a retry into dest).
        if created:
            shutil.rmtree(out.root, ignore_errors=True)
        elif out.root.is_dir():
            for p in out.root.iterdir():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
        raise


def _backup(lay: Layout, out: Layout, inst: ifile.InstanceFile, acked: int) -> BackupReport:
    # As private as the instance: 0700 and 0600, or 0750 and 0640 for one created with --group-read.
    make_root(out.root, group_read=lay.root.stat().st_mode & 0o777 == GROUP_READ_DIR_MODE)
    for d in out.dirs():
        make_dir(d)
    copied = 0
    seqno = 0
    if lay.store_file.exists():  # else the copy, as the source, rebuilds its store from the whole journal
        seqno = _copy_store(lay, out)
        copied += out.store_file.stat().st_size
    segs = list_segments(lay.journal)
    for i, s in enumerate(segs):
        try:
            copy_file(s.path, out.journal / s.path.name)
        except FileNotFoundError:
            if i + 1 == len(segs):
                raise  # the newest segment is never pruned: something else removed it
            # Pruned since the listing (prune goes oldest first): neither it nor the older ones
            # copied so far are needed; the check below proves the copy holds what it needs.
            for older in segs[:i]:
                (out.journal / older.path.name).unlink(missing_ok=True)
    segs = [s for s in segs if (out.journal / s.path.name).exists()]
    copied += sum((out.journal / s.path.name).stat().st_size for s in segs)
    if segs:
        cut_after_last_intact_record(out.journal / segs[-1].path.name)
    _check_copied_journal(lay, out, seqno, acked)
    lost = [f for f in lay.lost.glob("*") if f.is_file()]
    for f in lost:
        copy_file(f, out.lost / f.name)
    ifile.save(out.instance_file, inst)
    synced = [*(out.journal.glob("*" + SUFFIX)), *(out.lost / f.name for f in lost)]
    if users_path(lay.root).exists():  # the client port's users (instance.users): a restored copy keeps them
        atomic_write(users_path(out.root), users_path(lay.root).read_bytes(), mode=0o600)  # 0600 from its first byte
    for p in synced + ([out.store_file] if out.store_file.exists() else []):
        with open(p, "rb+") as fh:
            os.fsync(fh.fileno())
    for d in out.dirs():
        fsync_dir(d)
    fsync_dir(out.root)
    fsync_dir(out.root.parent)
    return BackupReport(out.root, seqno, len(segs), copied)


def _copy_store(lay: Layout, out: Layout) -> int:
    """Copy the store (a committed snapshot, through SQLite's backup API); returns its applied seqno."""
    try:
        src_conn = sqlite3.connect(f"file:{lay.store_file}?mode=ro", uri=True)
        dst_conn = sqlite3.connect(str(create_file(out.store_file)))
        try:
            src_conn.backup(dst_conn)
            row = dst_conn.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
            dst_conn.execute("PRAGMA journal_mode=WAL")
            return row[0] if row else 0
        finally:
            src_conn.close()
            dst_conn.close()
    except sqlite3.Error as e:
        raise MultisiteError(f"the store {lay.store_file} cannot be read ({e}); restore the instance from a "
                             f"backup") from None


def _check_copied_journal(lay: Layout, out: Layout, store_seqno: int, acked: int) -> None:
    """The copy opens and holds every acknowledged record: its journal runs, intact, from just after
    the copied store's seqno to at least ``acked`` (and to the store's seqno). A damaged frame that
    the copy was cut at, or a damaged sealed segment, is the source's corruption: named there."""
    last = store_seqno
    try:
        for last, _ in iter_frames(out.journal, store_seqno + 1):
            pass
    except JournalCorrupt as e:
        src = lay.journal / Path(e.path).name
        raise JournalCorrupt(e.message.replace(str(out.journal), str(lay.journal))
                             + " (found while backing it up; nothing was copied)", path=str(src),
                             offset=e.offset) from None
    need = max(acked, store_seqno)
    if last < need:
        tail = list_segments(lay.journal)[-1].path
        raise JournalCorrupt(f"the journal of {lay.root} held records up to seqno {need} when the backup began, but "
                             f"its copy ends at seqno {last}: {tail} is damaged after seqno {last} (or was cut by "
                             f"a rollback meanwhile); nothing was copied", path=str(tail), offset=-1)


@dataclass
class PruneReport:
    removed: list[str]
    kept_from_seqno: int
    limit_seqno: int
    reason: str




def _interrupted_rollback(lay: Layout) -> int | None:
    """The seqno a rollback that has not finished (its marker in ``run/``) goes back to, if any."""
    marker = lay.rollback_marker
    try:
        return int(json.loads(marker.read_text())["to_seqno"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"rollback marker {marker} is unreadable ({e}); open the instance (it finishes the "
                          f"rollback) before pruning") from None


def prune(root: str | Path, before: int, *, require_archived: bool | None = None) -> PruneReport:
    """Remove whole segments holding only seqnos below ``before`` and below what every source slot,
    pipeline consumer, the store's own recovery and an interrupted rollback still need. The newest
    segment always stays. ``require_archived`` (default: when a journal archive is recorded for the
    instance, see ``archives``) also keeps every segment that an archive does not hold yet."""
    if before < 1:
        raise ConfigError(f"--before must be a positive seqno, got {before}")
    lay = Layout.existing(root)
    marks = archives.load_all(lay)
    if require_archived is None:
        require_archived = bool(marks)
    if require_archived and not marks:
        raise ConfigError(f"archiving is required but no journal archive is recorded for {lay.root}: archive it "
                          f"first (multisite journal archive {lay.root} --to URL)")
    inst = ifile.load(lay.instance_file)
    limit, reason = before, f"--before {before}"
    for slot in inst.slots.values():
        need = slot.last_confirmed + 1
        if need < limit:
            limit, reason = need, f"{slot.kind} {slot.name!r} has confirmed only seqno {slot.last_confirmed}"
    for pos in consumers.load_all(lay):
        need = pos.last_confirmed + 1
        if need < limit:
            limit, reason = need, f"pipeline consumer {pos.name!r} has consumed only seqno {pos.last_confirmed}"
    for mark in marks if require_archived else []:
        need = mark.last_archived + 1
        if need < limit:
            limit, reason = need, f"the journal archive {mark.url} holds only up to seqno {mark.last_archived}"
    need = store_seqno(lay) + 1
    if need < limit:
        limit, reason = need, f"the store is flushed only to seqno {need - 1}"
    rolling = _interrupted_rollback(lay)
    if rolling is not None and rolling + 1 < limit:
        # The next open finishes it, undoing the store from the records after that seqno.
        limit, reason = rolling + 1, f"an interrupted rollback to seqno {rolling} still needs the records after it"
    segs = list_segments(lay.journal)
    removed = []
    for cur, nxt in zip(segs, segs[1:]):
        last = nxt.first_seqno - 1
        if last < limit:
            cur.path.unlink()
            removed.append(cur.path.name)
        else:
            break
    drop_segments(lay.journal, [s.index for s in segs if s.path.name in removed])
    fsync_dir(lay.journal)
    remaining = list_segments(lay.journal)
    return PruneReport(removed, remaining[0].first_seqno if remaining else 1, limit, reason)


def hint(root: Path) -> str:
    """What a JournalCorrupt adds when the damage is in the newest segment (see ``instance.repair``)."""
    return (f"; if the machine lost power, the damaged records may never have been acknowledged: "
            f"`multisite journal repair {root}` shows what cutting the journal there would drop")


def recover_journal_hinted(journal_dir: Path, *, repair: bool = True) -> JournalState:
    """``journal.recovery.recover_journal``, its JournalCorrupt for damage in the newest segment
    saying how to repair it (``hint``): what the open and every command that checks the newest
    segment tell the operator (the journal layer does not know the instance's commands)."""
    try:
        return recover_journal(journal_dir, repair=repair)
    except JournalCorrupt as e:
        infos = list_segments(journal_dir)
        if infos and e.path == str(infos[-1].path):  # the newest segment: a power loss may explain it
            raise JournalCorrupt(e.message + hint(journal_dir.parent), path=e.path, offset=e.offset) from None
        raise
