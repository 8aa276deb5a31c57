"""The replicated state of a small instance (or snapshot) at a seqno, in this process, without Spark.

``verify`` of two small instances should take about a second, and starting Spark alone takes several.
For inputs under ``LOCAL_MAX_KEYS`` keys in the store and ``LOCAL_MAX_JOURNAL_BYTES`` of journal to
roll forward, the state is computed here with the same rules as ``seeding.state_df`` (the Spark path):

- at S >= the store's seqno P: the store's replicated keys (read from a consistent copy of a live
  instance's store), rolled forward with the journal's ``(P, S]``;
- at S < P: the journal ``[1, S]`` from nothing (refused on a pruned journal, as on Spark).

Rolling forward applies the records in order: a set writes the key, a zkill removes it, a kill
removes the key and every key below it. Below-ness is a byte-prefix test on the encoded key (an
encoded key is its subscripts' self-delimiting encodings joined, see ``keys``), so a kill is a range
of one region's sorted keys; the keys are kept per region in a dict plus a sorted list of the keys
added since the last kill, merged when a kill needs the order.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from pathlib import Path

from ..errors import ConfigError, PipelineError
from ..instance.layout import Layout
from ..instance.maintenance import store_file_seqno, store_seqno as store_seqno_of
from ..journal.reader import iter_records
from ..journal.records import KILL, SET, ZKILL
from ..keys import KILL_END, encode_key

LOCAL_MAX_KEYS = 100_000  # store keys (or snapshot rows) under which verify stays in this process
LOCAL_MAX_JOURNAL_BYTES = 16 * 1024 * 1024  # journal bytes to roll forward, at most, idem

State = dict  # (region, encoded key) -> msgpack value bytes


def is_snapshot(path: str) -> bool:
    return (Path(path) / "snapshot.json").exists()


def _snapshot_seqno(path: str) -> int:
    return json.loads((Path(path) / "snapshot.json").read_text())["seqno"]


def _store_keys(store_file: str, replicated: list[str]) -> int:
    conn = sqlite3.connect(f"file:{store_file}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(replicated))
        return conn.execute(f"SELECT count(*) FROM kv JOIN regions ON kv.r = regions.id WHERE regions.name IN "
                            f"({marks})", replicated).fetchone()[0] if replicated else 0
    finally:
        conn.close()


def journal_bytes(path: str, lo: int, hi: int) -> int:
    """Journal bytes of the frames ``[lo, hi]`` (headers walked, payloads not read)."""
    from .plan import chunks, instance_ref

    if hi < lo:
        return 0
    return sum(c.nbytes for c in chunks(instance_ref(path), lo, hi, index="off"))


def _replicated(lay: Layout) -> list[str]:
    from .plan import store_regions

    return sorted(name for name, (repl, _) in store_regions(lay).items() if repl)


def is_small(path: str, at: int) -> bool:
    """Whether the state of ``path`` at ``at`` is small enough to compute here (see the module doc)."""
    if is_snapshot(path):
        import pyarrow.parquet as pq

        files = sorted((Path(path) / "state").glob("*.parquet"))
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files) <= LOCAL_MAX_KEYS
    from .archive import is_archive, manifest
    from .plan import journal_bounds

    if is_archive(path):
        return sum(s["bytes"] for s in manifest(path)["segments"] if s["first_seqno"] <= at) \
            <= LOCAL_MAX_JOURNAL_BYTES
    lay = Layout.existing(path)
    store_seqno = store_seqno_of(lay)
    if at >= store_seqno:
        if _store_keys(str(lay.store_file), _replicated(lay)) > LOCAL_MAX_KEYS:
            return False
        lo = store_seqno + 1
    else:
        lo = journal_bounds(path)[0]
    return journal_bytes(path, lo, at) <= LOCAL_MAX_JOURNAL_BYTES


class _Region:
    """One region's keys: a dict, and the sorted order rebuilt only when a kill needs it."""

    __slots__ = ("kv", "order", "fresh")

    def __init__(self):
        self.kv: dict[bytes, bytes] = {}
        self.order: list[bytes] = []
        self.fresh: list[bytes] = []  # keys added since ``order`` was built

    def set(self, k: bytes, v: bytes) -> None:
        if k not in self.kv:
            self.fresh.append(k)
        self.kv[k] = v

    def kill(self, k: bytes) -> None:
        if self.fresh:
            self.order = sorted(set(self.order).union(self.fresh))
            self.fresh = []
        lo = bisect.bisect_left(self.order, k)
        hi = bisect.bisect_left(self.order, k + KILL_END)
        for key in self.order[lo:hi]:
            self.kv.pop(key, None)
        del self.order[lo:hi]


def _archived_records(url: str, lo: int, hi: int):
    """The records ``[lo, hi]`` of a journal archive, from its segments (fetched, checked by CRC)."""
    from ..journal.records import decode_payload
    from ..journal.segments import SegmentInfo, SegmentView, read_header
    from .archive import Target, local_copy, manifest

    tgt = Target(url)
    for rec in manifest(url)["segments"]:
        if rec["last_seqno"] < lo or rec["first_seqno"] > hi:
            continue
        local = Path(local_copy(tgt.display(rec["path"]), rec["bytes"], rec["crc32"], verify=True))
        with SegmentView(SegmentInfo(local, read_header(local))) as view:
            for off, hdr in view.frames(tail=False):
                if lo <= hdr.seqno <= hi:
                    yield decode_payload(view.payload(off, hdr))


def _roll(regions: dict[str, _Region], records, replicated: set[str] | None) -> None:
    for rec in records:
        for u in rec.updates:
            if replicated is not None and u.region not in replicated:
                continue
            reg = regions.setdefault(u.region, _Region())
            k = encode_key(tuple(u.key))
            if u.op == SET:
                reg.set(k, u.value)
            elif u.op == ZKILL:
                reg.kv.pop(k, None)
            elif u.op == KILL:
                reg.kill(k)


def state_at(path: str, at: int | None = None) -> tuple[State, int]:
    """``(state, seqno)`` of an instance or snapshot directory at ``at`` (default: its end)."""
    if is_snapshot(path):
        return _snapshot_state(path, at)
    from .archive import is_archive

    if is_archive(path):
        return _archive_state(path, at)
    return _instance_state(path, at)


def _snapshot_state(path: str, at: int | None) -> tuple[State, int]:
    """A snapshot's state: its Parquet rows as they are (it holds one seqno, so ``at`` can only be that)."""
    import pyarrow.parquet as pq

    seqno = _snapshot_seqno(path)
    if at is not None and at != seqno:
        raise ConfigError(f"snapshot {path} is at seqno {seqno}, not {at}")
    out: State = {}
    for f in sorted((Path(path) / "state").glob("*.parquet")):
        t = pq.read_table(f, columns=["region", "key_bytes", "value_raw"]).to_pydict()
        out.update(zip(zip(t["region"], t["key_bytes"]), t["value_raw"]))
    return out, seqno


def _archive_state(path: str, at: int | None) -> tuple[State, int]:
    """A journal archive's state: its journal from seqno 1 rolled forward (an archive has no store), as on
    Spark; refused when the archive no longer starts at 1."""
    from .plan import journal_bounds

    first, last = journal_bounds(path)
    at = last if at is None else at
    if at > last:
        raise ConfigError(f"the journal archive {path} ends at seqno {last}; cannot take its state at {at}")
    if first != 1 and at >= first:
        raise PipelineError(f"the journal archive {path} starts at seqno {first}: the state at {at} needs the "
                            f"journal from seqno 1")
    regions: dict[str, _Region] = {}
    _roll(regions, _archived_records(path, 1, at), None)
    return {(name, k): v for name, reg in regions.items() for k, v in reg.kv.items()}, at


def _instance_state(path: str, at: int | None) -> tuple[State, int]:
    """An instance's replicated state: its store (a consistent copy when live) rolled forward with the
    journal after the store's seqno, or, before that seqno, its journal from seqno 1 when it still has it."""
    from .plan import instance_ref, journal_bounds
    from .state_source import consistent_store

    ref = instance_ref(path)
    lay = Layout.existing(ref.path)
    first, last = journal_bounds(ref.path)
    if at is not None and at > last:
        raise ConfigError(f"instance {ref.name} ends at seqno {last}; cannot take its state at {at}")
    replicated = _replicated(lay)
    store_file = consistent_store(lay)
    try:
        store_seqno = store_file_seqno(store_file)
        at = max(last, store_seqno) if at is None else at
        regions = {r: _Region() for r in replicated}
        if at >= store_seqno:
            _load_store(store_file, regions)
            lo = store_seqno + 1
        elif first == 1:
            lo = 1
        else:
            raise PipelineError(f"the state of {ref.name} at seqno {at} is before its store's seqno {store_seqno} "
                                f"and its journal was pruned (it starts at {first}); compare at {store_seqno} or "
                                f"later")
    finally:
        if store_file != str(lay.store_file):
            Path(store_file).unlink(missing_ok=True)
    if at >= lo:
        _roll(regions, iter_records(lay.journal, lo, at), set(replicated))
    return {(name, k): v for name, reg in regions.items() for k, v in reg.kv.items()}, at


def _load_store(store_file: str, regions: dict[str, _Region]) -> None:
    """Fill each of ``regions`` with its keys in ``store_file``, in key order (the order a kill needs)."""
    conn = sqlite3.connect(f"file:{store_file}?mode=ro", uri=True)
    try:
        for name, reg in regions.items():
            reg.kv = dict(conn.execute("SELECT k, v FROM kv JOIN regions ON kv.r = regions.id "
                                       "WHERE regions.name = ? ORDER BY k", (name,)))
            reg.order = list(reg.kv)
    finally:
        conn.close()
