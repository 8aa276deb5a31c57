"""Planning reads of instances: which instances, which regions, which chunks of which segments.

Runs on the driver side (the planner process), never in ``read()``: it lists segments, takes the
valid pieces of the journal index (``segment_index``) and walks the frame headers between them
(cheap: payloads are not read), cutting them into chunks of about ``chunk_bytes``, so a read scales
with cores however large the segments are. Everything ``read()`` needs goes into the partitions,
which are small picklable dataclasses (Spark reads streams in another process).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArchiveError, ConfigError, JournalGap
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from ..journal.records import FRAME_HEADER_SIZE, parse_header
from ..journal.segments import SEGMENT_HEADER_SIZE, SegmentInfo, SegmentView, list_segments, read_header
from ..journal.sidecars import list_sidecars
from .archive import MANIFEST, Target, archived_crcs, is_archive, is_url, local_copy, manifest, rewritten
from .columns import merge_fields, parse_region_schema
from .decode import Chunk
from .regions import store_regions  # noqa: F401  (re-exported: the jobs read regions through plan)
from .segment_index import INDEX_MIN_BYTES, piece_rows

CHUNK_BYTES = 32 * 1024 * 1024  # journal bytes per decoded chunk (a Spark partition of its own)
DECODE_COST = 4  # a row decoded from frames costs about as much as this many rows read from the index
PARTITION_BYTES = 256 * 1024 * 1024  # journal bytes per partition of indexed chunks, at most


@dataclass(frozen=True)
class InstanceRef:
    path: str
    name: str
    region_schemas: dict = field(default_factory=dict)  # region -> {field: ddl type}
    regions: tuple = ()  # every region the store knows (replicated or not)
    archive: str = ""  # a journal archive of this instance (``archive``): its seqnos are read from there


def parse_paths(options) -> list[str]:
    if "paths" in options:
        paths = json.loads(options["paths"])
    elif "path" in options:
        paths = [options["path"]]
    else:
        raise ConfigError("give the instance directory: spark.read.format('multisite').load('/data/A') "
                          "(or load([dirA, dirB]) for several shards)")
    return [p if is_url(p) else str(Path(p).absolute()) for p in paths]


def instance_ref(path: str) -> InstanceRef:
    """The instance directory ``path``, or the journal archive at ``path`` (a URL or a directory
    holding an archive manifest: its regions are the instance's when it was last archived)."""
    if is_archive(path):
        man = manifest(path)
        regs = {r: (bool(repl), schema) for r, (repl, schema) in man.get("regions", {}).items()}
        schemas = {r: parse_region_schema(sch, r) for r, (_, sch) in regs.items() if sch}
        return InstanceRef("", man["instance"], schemas, tuple(sorted(regs)), archive=path)
    lay = Layout.existing(path)
    info = ifile.load(lay.instance_file)
    regs = store_regions(lay)
    schemas = {r: parse_region_schema(s, r) for r, (_, s) in regs.items() if s}
    return InstanceRef(str(lay.root), info.name, schemas, tuple(sorted(regs)))


def instance_refs(options) -> list[InstanceRef]:
    """The instances of a read; an instance's archive and its directory given together are one
    instance, read from the archive up to its end and from the directory past it."""
    refs = combine_refs([instance_ref(p) for p in parse_paths(options)])
    names = [r.name for r in refs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"instances {', '.join(sorted(dup))} appear more than once in one read; each shard must "
                          f"have its own instance name (the `instance` column and stream offsets use it)")
    return refs


def combine_refs(refs: list[InstanceRef]) -> list[InstanceRef]:
    out: list[InstanceRef] = []
    for r in refs:
        twin = next((o for o in out if o.name == r.name and bool(o.archive) != bool(r.archive)
                     and not (o.archive and o.path)), None)
        if twin is None:
            out.append(r)
            continue
        live, arch = (twin, r) if r.archive else (r, twin)
        out[out.index(twin)] = InstanceRef(live.path, live.name, live.region_schemas, live.regions,
                                           archive=arch.archive)
    return out


def with_archive(instance: str, archive: str | None) -> InstanceRef:
    """The instance ``instance`` read with its journal archive ``archive`` (``--archive URL``): one ref,
    the archive's seqnos read from it, the rest from the directory; refused when the archive holds
    another instance's journal."""
    refs = [instance_ref(instance)] + ([instance_ref(archive)] if archive else [])
    if archive and refs[0].archive:
        raise ConfigError(f"{instance} is a journal archive too: give the instance directory with --archive {archive}")
    if archive and not refs[1].archive:
        raise ConfigError(f"{archive} is not a journal archive (no {MANIFEST}): --archive takes what multisite "
                          f"journal archive {instance} --to URL made")
    out = combine_refs(refs)
    if len(out) > 1:
        raise ConfigError(f"the archive {archive} holds instance {refs[1].name}'s journal, not {refs[0].name}'s")
    return out[0]


def load_paths(ref: InstanceRef) -> str | list[str]:
    """What ``spark.read.format("multisite").load`` takes to read ``ref`` (with its archive, if any)."""
    if ref.archive and ref.path:
        return [ref.archive, ref.path]
    return ref.archive or ref.path


def region_filter(options) -> frozenset | None:
    text = options.get("regions")
    if not text:
        return None
    return frozenset(r.strip() for r in text.split(",") if r.strip())


def fields_for(refs: list[InstanceRef], regions: frozenset | None) -> dict[str, str]:
    return merge_fields((r, s) for ref in refs for r, s in sorted(ref.region_schemas.items())
                        if regions is None or r in regions)


def journal_bounds(path: str) -> tuple[int, int]:
    """``(first, last)`` seqno held by the instance's journal now (last = first - 1 if empty), or by
    the journal archive at ``path``."""
    if is_archive(path):
        return archive_bounds(manifest(path))
    return TailWalker(path).bounds()


def archive_bounds(man: dict) -> tuple[int, int]:
    segs = man["segments"]
    return (segs[0]["first_seqno"], segs[-1]["last_seqno"]) if segs else (1, 0)


def check_seam(ref: InstanceRef, man: dict) -> None:
    """An archive read with its instance's directory must be a prefix of the instance's journal: after a
    rollback past the archive's end it holds records the instance took off (and lacks those written
    again). So the archive's last segment, where the journal still holds its seqnos, must be the same
    file (size, header and last bytes, as the archiver checks)."""
    if not man["segments"]:
        return
    rec = man["segments"][-1]
    journal = Layout.existing(ref.path).journal
    if list_segments(journal)[0].first_seqno > rec["last_seqno"]:
        return  # the journal was pruned past the archive's end: nothing to compare
    if rewritten(journal / rec["name"], rec):
        if list_segments(journal)[0].first_seqno > rec["last_seqno"]:
            return  # pruned since the listing above
        raise ArchiveError(f"the journal archive {ref.archive} ends with segment {rec['name']} (seqnos "
                           f"{rec['first_seqno']}..{rec['last_seqno']}), which instance {ref.name} no longer holds as "
                           f"archived: it was rolled back past what was archived; archive it to a new URL")


def ref_bounds(ref: InstanceRef) -> tuple[int, int]:
    """``(first, last)`` of an instance read with its archive: the archive's first, the instance's last."""
    if not ref.archive:
        return journal_bounds(ref.path)
    first, last = archive_bounds(manifest(ref.archive))
    if ref.path:
        check_seam(ref, manifest(ref.archive))
        f2, l2 = journal_bounds(ref.path)
        first, last = (min(first, f2) if last >= first else f2), max(last, l2)
    return first, last


def journal_crcs(path: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``(seqnos, payload CRCs)`` of the journal's frames in ``[lo, hi]`` from headers alone."""
    infos = list_segments(Layout.existing(path).journal)
    seqs, crcs = [], []
    last_index = infos[-1].index
    for i, info in enumerate(infos):
        nxt = infos[i + 1].first_seqno if i + 1 < len(infos) else None
        if (nxt is not None and nxt <= lo) or info.first_seqno > hi:
            continue
        with SegmentView(info) as view:
            for _, h in view.headers(tail=info.index == last_index):
                if h.seqno > hi:
                    break
                if h.seqno >= lo:
                    seqs.append(h.seqno)
                    crcs.append(h.payload_crc)
    return np.asarray(seqs, np.int64), np.asarray(crcs, np.int64)


def ref_crcs(ref: InstanceRef, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``journal_crcs`` of an instance read with its archive (the archive's up to its end)."""
    if not ref.archive:
        return journal_crcs(ref.path, lo, hi)
    man = manifest(ref.archive)
    a_last = archive_bounds(man)[1]
    if ref.path:
        check_seam(ref, man)
    seqs, crcs = archived_crcs(ref.archive, man, lo, min(hi, a_last))
    if ref.path and hi > a_last:
        s2, c2 = journal_crcs(ref.path, max(lo, a_last + 1), hi)
        seqs, crcs = np.concatenate([seqs, s2]), np.concatenate([crcs, c2])
    return seqs, crcs


def frame_crc(path: str, seqno: int) -> int | None:
    """The payload CRC of the instance's record ``seqno`` (from its frame header), None if the
    journal does not hold it (pruned, rolled back, not yet written, or 0)."""
    seqs, crcs = journal_crcs(path, seqno, seqno)
    return int(crcs[0]) if len(seqs) else None


@dataclass(frozen=True)
class _Mark:
    """A frame of the newest segment that the last walk reached."""
    segment: int
    offset: int
    seqno: int
    crc: int


class TailWalker:
    """``journal_bounds`` and ``frame_crc`` for a long-lived reader (a stream's, asked at every
    trigger): it remembers the last frame it walked to and walks on from there, instead of walking the
    whole newest segment's headers again (about a second per call for a 64 MiB segment of small
    transactions). The remembered frame is trusted only while the segment still holds it, same seqno
    and CRC, at the same offset; after a rollback (or a new segment) the walk starts over."""

    RECENT_MARKS = 16  # ends of recent walks kept: a stream asks for the CRC of its last batch's end

    def __init__(self, path: str):
        self.path = path
        self.mark: _Mark | None = None
        self.recent: dict[int, _Mark] = {}  # seqno -> an earlier walk's last frame (checked before use)

    def bounds(self) -> tuple[int, int]:
        infos = list_segments(Layout.existing(self.path).journal)
        tail, m = infos[-1], self.mark
        last = tail.first_seqno - 1
        with SegmentView(tail) as view:
            start, seqno = SEGMENT_HEADER_SIZE, None
            if m is not None and m.segment == tail.index and self._holds(view, m):
                start, seqno = m.offset, m.seqno
            self.mark = None
            for off, hdr in view.headers(tail=True, start=start, seqno=seqno):
                self.mark = _Mark(tail.index, off, hdr.seqno, hdr.payload_crc)
        if self.mark is not None:
            last = self.mark.seqno
            self.recent[last] = self.mark
            while len(self.recent) > self.RECENT_MARKS:
                del self.recent[min(self.recent)]
        return infos[0].first_seqno, last

    def crc(self, seqno: int) -> int | None:
        """``frame_crc`` of ``seqno``, without a walk when it is the last frame of this walk or of one of
        the ``RECENT_MARKS`` walks before (a stream's previous batch end), still where it was."""
        m = self._held_mark(seqno)
        return m[0].crc if m is not None else frame_crc(self.path, seqno)

    def start_after(self, seqno: int) -> tuple[int, int, int] | None:
        """``(segment index, offset, seqno + 1)``: where the frame after ``seqno`` begins, when ``seqno``
        ends a recent walk still in place (a stream's batch starts after its previous batch's end), so
        that planning the batch (``chunks(start_at=...)``) need not walk the segment's headers from its
        start; None when not known."""
        m = self._held_mark(seqno)
        return None if m is None else (m[0].segment, m[0].offset + m[1], seqno + 1)

    def _held_mark(self, seqno: int) -> tuple[_Mark, int] | None:
        """The remembered mark of ``seqno`` and its frame's total size, if the segment still holds it."""
        m = self.mark if self.mark is not None and self.mark.seqno == seqno else self.recent.get(seqno)
        if m is None:
            return None
        info = next((i for i in list_segments(Layout.existing(self.path).journal) if i.index == m.segment), None)
        if info is None:
            return None
        with SegmentView(info) as view:
            if not self._holds(view, m):
                return None
            return m, parse_header(view.buf, m.offset).total

    @staticmethod
    def _holds(view: SegmentView, m: _Mark) -> bool:
        if view.size - m.offset < FRAME_HEADER_SIZE:
            return False
        hdr = parse_header(view.buf, m.offset)
        return hdr is not None and hdr.seqno == m.seqno and hdr.payload_crc == m.crc


def chunks(ref: InstanceRef, lo: int, hi: int | None, *, chunk_bytes: int = CHUNK_BYTES,
           strict_start: bool = False, index: str = "read", index_min_bytes: int = INDEX_MIN_BYTES,
           start_at: tuple[int, int, int] | None = None) -> list[Chunk]:
    """Chunks covering seqnos ``[lo, hi]`` (``hi`` None = to the end now) of one instance's journal.

    ``strict_start`` (streams, exports) raises JournalGap when ``lo`` was pruned, instead of starting
    at the oldest record kept. ``index`` (see ``segment_index``): ``auto`` reads valid pieces and asks
    for pieces of the runs it decodes, ``read`` only reads pieces, ``off`` ignores them.

    ``start_at`` (``TailWalker.start_after``): ``(segment index, offset, seqno)`` of the frame ``lo``,
    so the walk of that segment starts there rather than at the segment's start (same chunks: the walk
    is frame by frame either way); taken only if the frame there is seqno ``lo`` (header CRC checked)
    and no valid index piece spans the offset.

    An instance with an archive (``ref.archive``) is read from the archive up to the archive's end,
    and from its directory (if given) past it.
    """
    if ref.archive:
        man = manifest(ref.archive)
        a_first, a_last = archive_bounds(man)
        if strict_start and lo < a_first and a_last >= a_first:
            raise JournalGap(f"seqno {lo} of instance {ref.name} is not in its journal archive {ref.archive} (it "
                             f"starts at {a_first})")
        if ref.path:
            check_seam(ref, man)
        out = archive_chunks(ref.name, ref.archive, man, lo, hi, chunk_bytes=chunk_bytes)
        if not ref.path or (hi is not None and hi <= a_last):
            return out
        live = InstanceRef(ref.path, ref.name, ref.region_schemas, ref.regions)
        start = max(lo, a_last + 1)
        first = list_segments(Layout.existing(ref.path).journal)[0].first_seqno
        if first > start:
            raise JournalGap(f"seqnos {start}..{first - 1} of instance {ref.name} are neither in its journal archive "
                             f"{ref.archive} (it ends at {a_last}) nor in its journal (it starts at {first}): archive "
                             f"before pruning (multisite journal archive)")
        return out + chunks(live, start, hi, chunk_bytes=chunk_bytes, strict_start=strict_start, index=index,
                            index_min_bytes=index_min_bytes, start_at=start_at)
    return _directory_chunks(ref, lo, hi, chunk_bytes=chunk_bytes, strict_start=strict_start, index=index,
                             index_min_bytes=index_min_bytes, start_at=start_at)


def _directory_chunks(ref: InstanceRef, lo: int, hi: int | None, *, chunk_bytes: int, strict_start: bool,
                      index: str, index_min_bytes: int, start_at: tuple[int, int, int] | None) -> list[Chunk]:
    """``chunks`` of the journal in the instance's directory: segment by segment, skipping those wholly
    before ``lo`` and stopping past ``hi``, each planned from its index pieces and walked headers
    (``_segment_chunks``). With ``index`` ``auto``, a sealed segment asks for pieces of every run it decodes,
    the last one (still written) only of runs of ``index_min_bytes`` or more."""
    lay = Layout.existing(ref.path)
    infos = list_segments(lay.journal)
    if strict_start and lo < infos[0].first_seqno:
        raise JournalGap(f"seqno {lo} of instance {ref.name} is no longer in its journal (it starts at "
                         f"{infos[0].first_seqno}): it was pruned before this reader consumed it")
    pieces: dict[int, list] = {}
    if index != "off":
        for sc, p in list_sidecars(lay.journal):
            pieces.setdefault(sc.segment, []).append((sc, p))
    out: list[Chunk] = []
    last_index = infos[-1].index
    for i, info in enumerate(infos):
        nxt_first = infos[i + 1].first_seqno if i + 1 < len(infos) else None
        if nxt_first is not None and nxt_first <= lo:
            continue
        if hi is not None and info.first_seqno > hi:
            break
        sealed = info.index != last_index
        with SegmentView(info) as view:
            hint = start_at[1:] if start_at is not None and start_at[0] == info.index and start_at[2] == lo else None
            out.extend(_segment_chunks(ref.name, info, view, sealed, lo, hi, pieces.get(info.index, []),
                                       chunk_bytes=chunk_bytes, write=index == "auto",
                                       min_bytes=0 if sealed else index_min_bytes, start=hint))
    return out


def archive_chunks(name: str, url: str, man: dict, lo: int, hi: int | None, *, chunk_bytes: int) -> list[Chunk]:
    """Chunks of the archived segments holding ``[lo, hi]``, planned from the manifest alone where a
    whole segment is read (its archived index pieces where they tile it, the frames between them
    decoded); a segment read in part is fetched to walk its headers. Paths are the archived files'."""
    tgt = Target(url)
    pieces: dict[int, list] = {}
    for p in man["pieces"]:
        pieces.setdefault(p["segment"], []).append(p)
    out: list[Chunk] = []
    for rec in man["segments"]:
        if rec["last_seqno"] < lo or (hi is not None and rec["first_seqno"] > hi):
            continue
        seg_url = tgt.display(rec["path"])
        common = dict(segment=rec["index"], archived=True, file_bytes=rec["bytes"], file_crc=rec["crc32"])
        if lo <= rec["first_seqno"] and (hi is None or hi >= rec["last_seqno"]):
            pos, seq = SEGMENT_HEADER_SIZE, rec["first_seqno"]
            for p in sorted(pieces.get(rec["index"], []), key=lambda p: p["start"]):
                if p["start"] < pos or p["first_seqno"] <= seq - 1 or (p["start"] == pos) != (p["first_seqno"] == seq):
                    continue
                if p["start"] > pos:
                    out.append(Chunk(name, seg_url, pos, seq, p["first_seqno"] - 1, nbytes=p["start"] - pos, **common))
                out.append(Chunk(name, seg_url, p["start"], p["first_seqno"], p["last_seqno"],
                                 piece=tgt.display(p["path"]), piece_first=p["first_seqno"],
                                 piece_last=p["last_seqno"], nbytes=p["end"] - p["start"], piece_bytes=p["bytes"],
                                 piece_crc=p["crc32"], **common))
                pos, seq = p["end"], p["last_seqno"] + 1
            if seq <= rec["last_seqno"]:
                out.append(Chunk(name, seg_url, pos, seq, rec["last_seqno"], nbytes=rec["bytes"] - pos, **common))
            continue
        local = Path(local_copy(seg_url, rec["bytes"], rec["crc32"], verify=True))  # its walk plans the chunks
        info = SegmentInfo(local, read_header(local))
        with SegmentView(info) as view:
            cs = _segment_chunks(name, info, view, True, lo, hi, [], chunk_bytes=chunk_bytes, write=False, min_bytes=0)
        out.extend(dataclasses.replace(c, path=seg_url, **common) for c in cs)
    return out


def _segment_chunks(instance: str, info, view: SegmentView, sealed: bool, lo: int, hi: int | None,
                    pieces: list, *, chunk_bytes: int, write: bool, min_bytes: int,
                    start: tuple[int, int] | None = None) -> list[Chunk]:
    """Walk one segment from its start: a valid piece where one begins, else frame headers up to the
    next piece (cut into chunks of ``chunk_bytes``), so that chunks, and the pieces written from them,
    never overlap. ``start``: ``(offset, seqno)`` of the frame ``lo``, to walk from there instead (see
    ``chunks``)."""
    valid: dict[int, tuple] = {}  # start offset -> (key, path, end offset)
    for sc, p in pieces:
        end = sc.matches(view.buf, view.size)
        if end is not None and (sc.start not in valid or valid[sc.start][0].last < sc.last):
            valid[sc.start] = (sc, p, end)
    starts = sorted(valid)
    path = str(info.path)
    out: list[Chunk] = []
    pos, seq = SEGMENT_HEADER_SIZE, info.first_seqno
    if start is not None and _frame_is(view, *start) and not any(s < start[0] < v[2] for s, v in valid.items()):
        pos, seq = start

    def emit(cur) -> None:  # cur = [offset, first, last, end]
        nbytes = cur[3] - cur[0]
        out.append(Chunk(instance, path, cur[0], cur[1], cur[2], segment=info.index,
                         write_piece=write and nbytes >= min_bytes, nbytes=nbytes))

    while pos < view.size and (hi is None or seq <= hi):
        v = valid.get(pos)
        if v is not None and v[0].first == seq:
            sc, p, end = v
            if sc.last >= lo:
                first, last = max(seq, lo), sc.last if hi is None else min(sc.last, hi)
                rows = piece_rows(str(p)) * (last - first + 1) // (sc.last - sc.first + 1)
                out.append(Chunk(instance, path, pos, first, last, segment=info.index, piece=str(p),
                                 piece_first=sc.first, piece_last=sc.last, nbytes=end - pos, rows=rows))
            pos, seq = end, sc.last + 1
            continue
        stop = next((s for s in starts if s > pos), None)
        cur: list | None = None
        moved = False
        for off, hdr in view.headers(tail=not sealed, start=pos, seqno=seq):
            if (stop is not None and off >= stop) or (hi is not None and hdr.seqno > hi):
                break
            moved = True
            pos, seq = off + hdr.total, hdr.seqno + 1
            if hdr.seqno < lo:
                continue
            if cur is None:
                cur = [off, hdr.seqno, hdr.seqno, pos]
            elif off - cur[0] >= chunk_bytes:
                emit(cur)
                cur = [off, hdr.seqno, hdr.seqno, pos]
            else:
                cur[2], cur[3] = hdr.seqno, pos
        if cur is not None:
            emit(cur)
        if not moved:  # the end of the frames (or a torn tail) is reached
            break
    return out


def _frame_is(view: SegmentView, offset: int, seqno: int) -> bool:
    if view.size - offset < FRAME_HEADER_SIZE:
        return False
    hdr = parse_header(view.buf, offset)
    return hdr is not None and hdr.seqno == seqno


def group_chunks(cs: list[Chunk], partition_bytes: int, min_partitions: int, *,
                 chunk_bytes: int = CHUNK_BYTES) -> list[list[Chunk]]:
    """Partitions of chunks. Decoding is the heavy work, so a chunk to decode of a quarter of
    ``chunk_bytes`` or more is a partition of its own (on a first read, every core decodes). The rest
    (chunks read from the index, small chunks to decode such as the open segment's tail) go into at
    least ``min_partitions`` groups of at most ``partition_bytes`` each, of about equal cost: each
    Spark task of a Python source costs tens of milliseconds, and on a scan the JVM's work is per
    row, so the last task to finish, not the number of tasks, sets the time."""
    out: list[list[Chunk]] = []
    rest: list[Chunk] = []
    for c in cs:
        if c.piece or c.nbytes < chunk_bytes // 4:
            rest.append(c)
        else:
            out.append([c])
    if not rest:
        return out
    known = [c for c in rest if c.rows]
    per_byte = sum(c.rows for c in known) / sum(c.nbytes for c in known) if known else 1 / 80

    def cost(c: Chunk) -> float:
        return c.rows if c.piece and c.rows else c.nbytes * per_byte * (1 if c.piece else DECODE_COST)

    n = min(len(rest), max(min_partitions, -(-sum(c.nbytes for c in rest) // max(1, partition_bytes))))
    bins: list[tuple[float, int, list[Chunk]]] = [(0.0, i, []) for i in range(n)]
    for c in sorted(rest, key=cost, reverse=True):  # longest first, each to the least loaded group
        load, i, group = heapq.heappop(bins)
        group.append(c)
        heapq.heappush(bins, (load + cost(c), i, group))
    order = {id(c): k for k, c in enumerate(cs)}
    out.extend(sorted(g, key=lambda c: order[id(c)]) for _, _, g in sorted(bins, key=lambda b: b[1]))
    return out
