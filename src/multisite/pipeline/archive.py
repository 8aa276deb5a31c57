"""The journal archive: sealed segments and journal-index pieces copied to shared storage.

``multisite journal archive DIR --to URL [--follow]`` does for a multisite journal what litestream or
pgBackRest do for SQLite and PostgreSQL: it copies every *sealed* segment (a segment with a newer one
after it never changes again) and the index pieces of those segments to ``URL``, through
``pyarrow.fs``, so that Spark executors on other hosts read the journal from there. ``URL`` is a local
or mounted path (``/mnt/archive/A`` or ``file:///…``) or S3-compatible object storage
(``s3://bucket/prefix``; endpoint and credentials from the environment: ``AWS_ENDPOINT_URL`` or
``MULTISITE_S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).

Layout at ``URL``::

    segments/<NNNNNNNN>.msj        byte copies of sealed segments
    headers/<NNNNNNNN>.bin         (seqno, payload CRC) of each frame, int64 pairs: what an export
                                   compares to find a rollback, without fetching the segment
    index/<validity key>.parquet   journal-index pieces of archived segments (a cache, as locally)
    archive.json                   the manifest: instance, regions, and every archived file with its
                                   size and CRC-32 (written last, after each segment)

Each segment is copied whole (a local path through ``fsutil.atomic_write``: temp file, fsync,
rename; an object store through one upload, which is atomic), read back and compared by CRC-32 with
the source, then added to the manifest, and the instance records the last seqno archived without a
gap (``instance.archives``: ``journal prune`` keeps what no archive holds yet). A crash at any point
resumes without re-copying or skipping: a segment is in the manifest only once its copy was checked;
a copy that was complete but not yet recorded is found by its size and CRC and recorded without being
copied again; a partial copy is never visible under the final name (a local temp file is removed on
the next run, an unfinished upload is not an object). Segments are archived in seqno order and the
archive refuses a gap (segments pruned before they were archived) or a segment the instance rolled
back and rewrote after it was archived. ``check`` re-reads every archived file and names each one
whose CRC differs from the manifest's.

With ``follow``, an object store that does not answer (network, a 5xx, throttling: ``transient``) does
not stop the archiver: the pass is logged (the URL, never credentials) and tried again after a pause
doubling from ``interval_s`` up to ``RETRY_MAX_S``; what stays until someone acts (no such bucket,
access denied, a rollback, a gap) still stops it with its error. An upload that fails mid-way leaves no
object (``Target._abandon``: pyarrow has no abort for its S3 stream, so a partial object is deleted).

Readers (``plan``, ``decode``) take an archive URL wherever they take an instance directory: objects
are fetched once into a local cache (``MULTISITE_ARCHIVE_CACHE``, default under the temp dir), checked
against the manifest's CRC, and read from there; a local archive is read in place.

This module is the archiver (and ``check``); where an archive lives and how readers fetch from it
(``Target``, the manifest, the cache) is ``archive_store``.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ArchiveCorrupt, ArchiveError, ArchiveUnreachable, ConfigError
from ..instance import archives, instance_file as ifile
from ..instance.layout import Layout
from ..journal.segments import SEGMENT_HEADER_SIZE, SegmentView, list_segments
from ..journal.sidecars import list_sidecars

# The store side (URLs, Target, the manifest, the readers' cache) is archive_store's; re-exported here,
# where the readers, the CLI and the tests have always imported it from.
from .archive_store import (  # noqa: F401
    BLOCK_BYTES, FORMAT, HEADERS_DIR, INDEX_DIR, MANIFEST, MANIFEST_READ_ATTEMPTS, MANIFEST_RETRY_S, SEGMENTS_DIR,
    TRANSIENT, Target, archived_crcs, cache_dir, file_url, is_archive, is_url, local_copy, local_files, manifest,
    redact, s3_filesystem, transient,
)

FOLLOW_INTERVAL_S = 1.0
RETRY_MAX_S = 30.0  # the longest pause of --follow before it tries an unreachable archive again (doubling)
TAIL_BYTES = 4096  # a segment's last bytes whose CRC tells a copy from a rewrite (a rollback cuts and rewrites)


log = logging.getLogger(__name__)


@dataclass
class ArchiveReport:
    instance: str
    url: str
    segments_copied: list[str] = field(default_factory=list)
    segments_recorded: list[str] = field(default_factory=list)  # complete copies of a crashed run, not copied again
    pieces_copied: int = 0
    bytes_copied: int = 0
    first_archived: int = 0
    last_archived: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Throttle:
    """At most ``rate_bytes_per_s`` bytes per second (None: no limit)."""

    def __init__(self, rate_bytes_per_s: float | None):
        self.rate = rate_bytes_per_s
        self.t0 = time.monotonic()
        self.sent = 0

    def __call__(self, nbytes: int) -> None:
        if self.rate:  # unused time (--follow idle, an outage) earns at most this block's or a second's worth
            excess_s = time.monotonic() - self.t0 - self.sent / self.rate - max(1.0, nbytes / self.rate)
            self.t0 += max(0.0, excess_s)  # of credit, not a burst of all of it
        self.sent += nbytes
        if self.rate:
            wait = self.sent / self.rate - (time.monotonic() - self.t0)
            if wait > 0:
                time.sleep(wait)


def _regions(lay: Layout) -> dict:
    from .regions import store_regions

    return {name: [repl, schema] for name, (repl, schema) in sorted(store_regions(lay).items())}


def archive(instance: str, url: str, *, follow: bool = False, interval_s: float = FOLLOW_INTERVAL_S,
            rate_bytes_per_s: float | None = None, progress=None, should_stop=None) -> ArchiveReport:
    """Copy the sealed segments (and their index pieces) of ``instance`` not yet in the archive at
    ``url``; with ``follow``, again every ``interval_s`` until interrupted (or ``should_stop()``)."""
    t0 = time.time()
    lay = Layout.existing(instance)
    name = ifile.load(lay.instance_file).name
    tgt = Target(url)
    if tgt.local and Path(tgt.base).resolve().is_relative_to(lay.root.resolve()):
        raise ConfigError(f"archive location {url} is inside the instance directory {lay.root}: an archive is a "
                          f"copy kept elsewhere (and pipeline reads would take the directory for the archive)")
    rep = ArchiveReport(name, url)
    throttle = Throttle(rate_bytes_per_s)
    tgt.sweep_temp()
    retry_s = 0.0
    while True:
        try:
            _archive_once(lay, name, tgt, rep, throttle, progress)
            retry_s = 0.0
        except ArchiveUnreachable as e:
            if not follow:
                raise
            retry_s = min(RETRY_MAX_S, max(interval_s, retry_s * 2))
            (progress or log.warning)(f"{e.message}; trying again in {retry_s:g} s")
        if not follow or (should_stop is not None and should_stop()):
            break
        time.sleep(retry_s or interval_s)
    rep.seconds = time.time() - t0
    return rep


def rewritten(path: Path, rec: dict) -> bool:
    """Whether the sealed segment ``path`` differs in header, size or last bytes from its archived record
    ``rec`` (a rollback cut it and new records were written there: same name, same header), or is gone."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != rec["bytes"] or zlib.crc32(f.read(SEGMENT_HEADER_SIZE)) != rec["header_crc"]:
                return True
            f.seek(max(0, size - TAIL_BYTES))
            return "tail_crc" in rec and zlib.crc32(f.read()) != rec["tail_crc"]
    except FileNotFoundError:
        return True


def _archive_once(lay: Layout, name: str, tgt: Target, rep: ArchiveReport, throttle, progress) -> None:
    man = tgt.load_manifest() or {"format": FORMAT, "instance": name, "segments": [], "pieces": []}
    if man["instance"] != name:
        raise ArchiveError(f"the journal archive {tgt.url} holds instance {man['instance']}'s journal, not {name}'s: "
                           f"give each instance an archive of its own")
    regions = _regions(lay)
    dirty = man.get("regions") != regions
    man["regions"] = regions
    infos = list_segments(lay.journal)
    done = {s["name"]: s for s in man["segments"]}
    last = man["segments"][-1]["last_seqno"] if man["segments"] else None
    for i, info in enumerate(infos[:-1]):
        seg_last = infos[i + 1].first_seqno - 1
        rec = done.get(info.path.name)
        if rec is not None:
            if rec["first_seqno"] != info.first_seqno or rewritten(info.path, rec):
                if list_segments(lay.journal)[0].first_seqno > rec["last_seqno"]:
                    continue  # pruned since the listing (a rollback keeps the oldest segment)
                raise ArchiveError(f"segment {info.path} differs from its archived copy {tgt.display(rec['path'])} "
                                   f"(the instance was rolled back past what was archived and wrote it again): "
                                   f"archive this instance to a new URL")
            continue
        if last is not None and info.first_seqno != last + 1:
            if info.first_seqno <= last:
                raise ArchiveError(f"segment {info.path} starts at seqno {info.first_seqno}, inside what the archive "
                                   f"{tgt.url} already holds (to {last}): the instance was rolled back past what was "
                                   f"archived; archive it to a new URL")
            raise ArchiveError(f"the archive {tgt.url} ends at seqno {last} but the next sealed segment {info.path} "
                               f"starts at {info.first_seqno}: seqnos {last + 1}..{info.first_seqno - 1} were pruned "
                               f"before they were archived")
        try:
            _archive_segment(lay, info, seg_last, tgt, man, rep, throttle, progress)
        except FileNotFoundError:
            if not pruned(lay, info):
                raise
            if last is not None:
                raise ArchiveError(f"the archive {tgt.url} ends at seqno {last} but its next segment {info.path} was "
                                   f"pruned while it was being archived: seqnos {last + 1}..{seg_last} are in "
                                   f"neither") from None
            continue  # pruned meanwhile, before a first segment was archived: the archive starts later
        last = seg_last
        dirty = False
    done = {s["index"] for s in man["segments"]}
    if _archive_pieces(lay, done, tgt, man, rep, throttle) or dirty:
        tgt.save_manifest(man)
    if man["segments"]:
        rep.first_archived = man["segments"][0]["first_seqno"]
        rep.last_archived = man["segments"][-1]["last_seqno"]
        if not any(m.url == tgt.url for m in archives.load_all(lay, skip_unreadable=True)):
            _mark(lay, tgt, lay.journal / man["segments"][-1]["name"], man["segments"][-1])  # dropped or lost


def pruned(lay: Layout, info) -> bool:
    """Whether segment ``info``, listed a moment ago, was removed by ``journal prune`` since: gone from the
    front of the journal (a rollback removes from the end, and keeps the oldest segment)."""
    infos = list_segments(lay.journal)
    return not info.path.exists() and (not infos or infos[0].first_seqno > info.first_seqno)


def _archive_segment(lay, info, seg_last: int, tgt: Target, man: dict, rep: ArchiveReport, throttle,
                     progress) -> None:
    data = info.path.read_bytes()
    crc = zlib.crc32(data)
    rel = f"{SEGMENTS_DIR}/{info.path.name}"
    if tgt.size_crc(rel) == (len(data), crc):
        rep.segments_recorded.append(info.path.name)  # copied by a run that stopped before recording it
    else:
        if progress:
            progress(f"archiving {info.path.name} (seqnos {info.first_seqno}..{seg_last}, {len(data):,} bytes)")
        tgt.put(rel, data, throttle)
        got = tgt.size_crc(rel)
        if got != (len(data), crc):
            raise ArchiveCorrupt(f"the archived copy {tgt.display(rel)} of {info.path} reads back as {got} (size, "
                                 f"CRC-32) where ({len(data)}, {crc}) was written; the archive was not updated")
        rep.segments_copied.append(info.path.name)
        rep.bytes_copied += len(data)
    heads = _frame_headers(info)
    hrel = f"{HEADERS_DIR}/{info.path.stem}.bin"
    if tgt.size_crc(hrel) != (len(heads), zlib.crc32(heads)):
        tgt.put(hrel, heads)
        if tgt.size_crc(hrel) != (len(heads), zlib.crc32(heads)):
            raise ArchiveCorrupt(f"the archived frame headers {tgt.display(hrel)} do not read back as written")
    man["segments"].append({"name": info.path.name, "index": info.index, "path": rel, "first_seqno": info.first_seqno,
                            "last_seqno": seg_last, "bytes": len(data), "crc32": crc,
                            "header_crc": zlib.crc32(data[:SEGMENT_HEADER_SIZE]), "archived": time.time(),
                            "tail_crc": zlib.crc32(data[-TAIL_BYTES:]),
                            "headers": {"path": hrel, "bytes": len(heads), "crc32": zlib.crc32(heads)}})
    _archive_pieces(lay, {info.index}, tgt, man, rep, throttle)
    tgt.save_manifest(man)  # the segment is archived from here on
    _mark(lay, tgt, info.path, man["segments"][-1])


def _mark(lay: Layout, tgt: Target, path: Path, rec: dict) -> None:
    """Record that the archive holds seqnos up to the end of ``rec`` (the archived copy of ``path``)."""
    archives.record(lay, tgt.url, rec["last_seqno"])
    if rewritten(path, rec) and list_segments(lay.journal)[0].first_seqno <= rec["last_seqno"]:
        # a rollback cut it after it was read (its caps came first); a pruned segment is just gone
        archives.record(lay, tgt.url, 0)
        raise ArchiveError(f"segment {path} was cut by a rollback while it was archived to {tgt.url}: the "
                           f"instance was rolled back past what was archived; archive it to a new URL")


def _frame_headers(info) -> bytes:
    import numpy as np

    with SegmentView(info) as view:
        pairs = [(h.seqno, h.payload_crc) for _, h in view.headers(tail=False)]
    return np.asarray(pairs, dtype="<i8").reshape(-1, 2).tobytes()




def _archive_pieces(lay: Layout, segments: set, tgt: Target, man: dict, rep: ArchiveReport, throttle) -> bool:
    """Copy the valid index pieces of the archived ``segments`` that the archive lacks."""
    have = {p["name"] for p in man["pieces"]}
    todo = [(sc, p) for sc, p in list_sidecars(lay.journal) if sc.segment in segments and p.name not in have]
    if not todo:
        return False
    paths = {i.index: i for i in list_segments(lay.journal)}
    added = False
    for sc, p in todo:
        info = paths.get(sc.segment)
        if info is None:
            continue
        try:
            with SegmentView(info) as view:
                end = sc.matches(view.buf, view.size)
        except FileNotFoundError:
            if pruned(lay, info):
                continue  # pruned meanwhile (the archive holds it): its pieces are a cache, not needed
            raise
        if end is None:
            continue  # stale: a cache entry the next read replaces
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            continue
        rel = f"{INDEX_DIR}/{p.name}"
        crc = zlib.crc32(data)
        if tgt.size_crc(rel) != (len(data), crc):
            tgt.put(rel, data, throttle)
            if tgt.size_crc(rel) != (len(data), crc):
                raise ArchiveCorrupt(f"the archived copy {tgt.display(rel)} of the index piece {p} does not read back "
                                     f"as written")
            rep.bytes_copied += len(data)
        man["pieces"].append({"name": p.name, "path": rel, "segment": sc.segment, "first_seqno": sc.first,
                              "last_seqno": sc.last, "start": sc.start, "end": end, "bytes": len(data), "crc32": crc})
        rep.pieces_copied += 1
        added = True
    man["pieces"].sort(key=lambda x: (x["segment"], x["start"]))
    return added


@dataclass
class CheckReport:
    url: str
    instance: str
    files: int
    bytes: int
    damaged: list[dict]  # {"path", "problem"}
    first_archived: int
    last_archived: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check(url: str) -> CheckReport:
    """Re-read every archived file and compare its size and CRC-32 with the manifest's."""
    tgt = Target(url)
    man = tgt.load_manifest()
    if man is None:
        raise ArchiveError(f"{url} is not a journal archive (no {MANIFEST})")
    damaged, nbytes, files = [], 0, 0
    for rec in man["segments"] + [s["headers"] for s in man["segments"]] + man["pieces"]:
        files += 1
        got = tgt.size_crc(rec["path"])
        if got is None:
            damaged.append({"path": tgt.display(rec["path"]), "problem": "missing"})
        elif got != (rec["bytes"], rec["crc32"]):
            damaged.append({"path": tgt.display(rec["path"]),
                            "problem": f"CRC-32 {got[1]:08x} over {got[0]:,} bytes where {rec['crc32']:08x} over "
                                       f"{rec['bytes']:,} bytes was archived"})
        else:
            nbytes += got[0]
    segs = man["segments"]
    return CheckReport(url, man["instance"], files, nbytes, damaged, segs[0]["first_seqno"] if segs else 0,
                       segs[-1]["last_seqno"] if segs else 0)
