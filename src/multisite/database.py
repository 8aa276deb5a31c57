"""The embedded engine: an open instance, its transactions, and recovery on open.

How a commit works (GT.M's order, SPEC §1), all under one commit lock that also fixes seqno order:

1. each update is applied to the store's open SQLite transaction, reading its before-image first;
2. the journal record (seqno, stream tag, origin, time, updates with before-images) is framed and
   written to the journal; in ``fsync`` mode it is hardened here;
3. the frame is handed to commit listeners (the journal pool that feeds Source Servers).

Then, outside the lock, ``group`` mode waits for the shared fsync. The store's SQLite transaction is
committed in batches, and only after the journal is hard up to the same seqno, so the store is never
ahead of the journal. If a journal write fails (disk full) the store is reset to its last flush and
rolled forward from the journal again, so nothing committed is lost and the failed transaction leaves
no trace.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import (InstanceExists, JournalError, JournalGap, KeyTypeError, NotPrimary, RegionNotFound,
                     StorageFull, StoreLost, TransactionError, ConfigError)
from .fsutil import fsync_file
from .instance import instance_file as ifile
from .instance.layout import InstanceLock, Layout
from .journal.reader import iter_records
from .journal import records as journal_records
from .journal.records import KILL, SET, ZKILL, Record, Update, encode_payload, frame
from .journal.recovery import recover_journal
from .journal.writer import (DEFAULT_SEGMENT_BYTES, DURABILITY_MODES, MIN_SEGMENT_BYTES, JournalWriter,
                             create_segment)
from .keys import check_key, decode_key, encode_key
from .store.sqlite import Store

from .values import decode_value, encode_value  # noqa: F401 - re-exported for older imports

_log = logging.getLogger("multisite")
STORE_FLUSH_INTERVAL_S = 0.5
BATCH, REQUEST = "ms_batch", "ms_request"  # store savepoints: a commit or batch, one request in it
STORE_FLUSH_TXNS = 50_000
OPS = frozenset((SET, KILL, ZKILL))
_ABSENT = object()  # a key the store does not hold (None is a value a key can hold)


@dataclass
class RecoveryReport:
    journal_last_seqno: int = 0
    store_seqno: int = 0  # what the store held before roll-forward
    replayed: int = 0
    replay_seconds: float = 0.0
    torn_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"journal ends at seqno {self.journal_last_seqno}",
                 f"store was at {self.store_seqno}, rolled forward {self.replayed} transactions"]
        if self.replay_seconds > 0 and self.replayed:
            parts.append(f"at {self.replayed / self.replay_seconds:,.0f} records/s")
        return "; ".join(parts) + ("" if not self.notes else "; " + "; ".join(self.notes))


def create(path: str | os.PathLike, name: str, *, group: str = "default", supplementary: bool = False,
           durability: str = "fsync", segment_bytes: int = DEFAULT_SEGMENT_BYTES,
           journal_pool_bytes: int = 64 * 1024 * 1024) -> Path:
    """Create a new, empty instance directory named ``name`` in LMS group ``group``."""
    if not ifile.valid_name(name):
        raise ConfigError(f"instance name {name!r} must be letters, digits, '-', '_' or '.'")
    if durability not in DURABILITY_MODES:
        raise ConfigError(f"durability must be one of {', '.join(DURABILITY_MODES)}, got {durability!r}")
    for what, n, least in (("segment_bytes", segment_bytes, MIN_SEGMENT_BYTES), ("journal_pool_bytes",
                                                                                  journal_pool_bytes, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or not least <= n <= 1 << 40:
            raise ConfigError(f"{what} must be a whole number of bytes from {least} to 1 TiB, got {n!r}")
    lay = Layout(Path(path).absolute())
    if lay.instance_file.exists():
        raise InstanceExists(f"{lay.root} already holds an instance; choose another directory")
    if lay.root.exists() and not lay.root.is_dir():
        raise InstanceExists(f"{lay.root} exists and is a file, not a directory; choose an empty or new directory")
    if lay.root.exists() and any(lay.root.iterdir()):
        raise InstanceExists(f"{lay.root} exists and is not empty; choose an empty or new directory")
    for d in lay.dirs():
        d.mkdir(parents=True, exist_ok=True)
    create_segment(lay.journal, 1, 1, 0)
    Store(lay.store_file).close()
    inst = ifile.InstanceFile(name=name, group=group, supplementary=supplementary, created=time.time(),
                              durability=durability, segment_bytes=segment_bytes,
                              journal_pool_bytes=journal_pool_bytes)
    inst.add_history(1, name, "originating")
    ifile.save(lay.instance_file, inst)
    return lay.root


class Database:
    """An open instance. Thread-safe; one per process per instance (the instance lock)."""

    def __init__(self, path: str | os.PathLike, *, durability: str | None = None,
                 segment_bytes: int | None = None):
        self.layout = Layout.existing(path)
        self._lock_file = InstanceLock(self.layout)
        self._lock_file.acquire()
        try:
            self._open(durability, segment_bytes)
        except BaseException:
            self._lock_file.release()
            raise

    def _open(self, durability: str | None, segment_bytes: int | None) -> None:
        lay = self.layout
        self.info = ifile.load(lay.instance_file)
        self.name = self.info.name
        self._lock = threading.Lock()
        self._local = _ThreadState()
        self._closed = False
        self.commit_listeners: list[Callable[[int, bytes], None]] = []
        self.rollback_listeners: list[Callable[[int], None]] = []
        t0 = time.perf_counter()
        js = recover_journal(lay.journal)
        self.store = Store(lay.store_file)
        rep = RecoveryReport(journal_last_seqno=js.last_seqno, store_seqno=self.store.applied_seqno,
                             torn_bytes=js.torn_bytes, notes=list(js.notes))
        if self.store.applied_seqno > js.last_seqno:
            raise JournalError(f"the store of {lay.root} is at seqno {self.store.applied_seqno} but its journal "
                               f"ends at {js.last_seqno}: journal files are missing; restore from a backup")
        tail = js.segments[-1]
        self.journal = JournalWriter(lay.journal, index=tail.index, path=tail.path, last_seqno=js.last_seqno,
                                     durability=durability or self.info.durability,
                                     segment_bytes=segment_bytes or self.info.segment_bytes, size=js.tail_size)
        self._seqno = js.last_seqno
        self._stream_seqnos = self.store.stream_seqnos  # SI: last stream_seqno per stream (1..15)
        if self.store.applied_seqno < js.last_seqno:
            t1 = time.perf_counter()
            replay_from = self.store.applied_seqno + 1
            rep.replayed = self._roll_forward(replay_from, js.last_seqno)
            # Journal first, then database: the records just replayed may be in the page cache only
            # (the writer crashed before hardening them); a power loss must not leave the store ahead.
            for i, seg in enumerate(js.segments):
                if i + 1 == len(js.segments) or js.segments[i + 1].first_seqno > replay_from:
                    fsync_file(seg.path)
            self.store.flush()
            rep.replay_seconds = time.perf_counter() - t1
        self.recovery = rep
        self._last_flush = time.monotonic()
        self._q_lock = threading.Lock()
        self._queue: list[_Request] = []
        self._combining = False
        from .replication.rollback import finish_interrupted

        done = finish_interrupted(self)
        if done is not None:
            rep.notes.append(f"completed an interrupted rollback: {done.summary()}")
        self.open_seconds = time.perf_counter() - t0

    # -- recovery --------------------------------------------------------------------------------
    def _roll_forward(self, first: int, last: int) -> int:
        """Replay journal records ``first..last`` into the store (recovery). Sets are written in
        bulk; a kill or zkill first writes the sets before it, so the order of updates holds."""
        st = self.store
        regions = st.regions
        puts: list[tuple[int, bytes, bytes]] = []
        n = 0
        track_streams = self.info.supplementary
        last_in: dict[str, int] = {}  # region -> last seqno that touched it
        name, rid = None, 0
        # recover_journal has just checked every CRC of the newest segment, where a replay mostly is
        for rec in iter_records(self.layout.journal, first, last, tail_checked=True):
            for u in rec.updates:
                if u.region != name:
                    name = u.region
                    rid = (regions.get(name) or st.create_region(name, True)).id
                if u.op == SET:
                    puts.append((rid, encode_key(u.key), u.value))
                else:
                    if puts:
                        st.put_rows(puts)
                        puts = []
                    (st.delete_subtree if u.op == KILL else st.delete)(rid, encode_key(u.key))
                last_in[name] = rec.seqno
            if rec.stream or track_streams:
                self._stream_seqnos[rec.stream] = rec.stream_seqno
            n += 1
        if puts:
            st.put_rows(puts)
        for region, seqno in last_in.items():
            st.mark_applied(seqno, (region,))
        if n:
            st.mark_applied(last, ())
        if n != last - first + 1:
            raise JournalError(f"journal of {self.layout.root} is missing records {first}..{last} needed to "
                               f"roll the store forward")
        return n

    # -- properties ------------------------------------------------------------------------------
    @property
    def seqno(self) -> int:
        """The last committed seqno."""
        return self._seqno

    @property
    def role(self) -> str:
        return self.info.role

    def _check_open(self) -> None:
        if self._closed:
            raise TransactionError(f"instance {self.layout.root} is closed")

    # -- regions ---------------------------------------------------------------------------------
    def create_region(self, name: str, replicated: bool = True, schema: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"region name must be a non-empty string, got {name!r}")
        with self._lock:
            self._check_open()
            if name in self.store.regions:
                r = self.store.regions[name]
                if r.replicated != replicated:
                    raise ConfigError(f"region {name!r} exists and is {'' if r.replicated else 'un'}replicated")
                return
            self.store.create_region(name, replicated, schema)
            self.journal.sync()
            self.store.flush()

    def regions(self) -> dict[str, bool]:
        return {n: r.replicated for n, r in self.store.regions.items()}

    def _region(self, name: str):
        r = self.store.regions.get(name)
        if r is None:
            raise RegionNotFound(f"region {name!r} does not exist in instance {self.name}; create it with "
                                 f"db.create_region({name!r})")
        return r

    # -- reads -----------------------------------------------------------------------------------
    def get(self, region: str, key: tuple) -> Any:
        kb = encode_key(check_key(key))
        with self._lock:
            self._check_open()
            vb = self.store.get(self._region(region).id, kb)
        return None if vb is None else decode_value(vb)

    def items(self, region: str, start: tuple | None = None, stop: tuple | None = None,
              batch: int = 1000) -> Iterator[tuple[tuple, Any]]:
        """``(key, value)`` in key order from ``start`` (inclusive) to ``stop`` (exclusive)."""
        lo = encode_key(check_key(start)) if start is not None else b""
        hi = encode_key(check_key(stop)) if stop is not None else None
        inclusive = True
        while True:
            with self._lock:
                self._check_open()
                rows = self.store.page(self._region(region).id, lo, hi, batch, inclusive=inclusive)
            for kb, vb in rows:
                yield decode_key(kb), decode_value(vb)
            if len(rows) < batch:
                return
            lo, inclusive = rows[-1][0], False

    # -- writes ----------------------------------------------------------------------------------
    def transaction(self) -> "Transaction":
        return Transaction(self)

    def set(self, region: str, key: tuple, value: Any) -> int:
        return self._single(SET, region, key, encode_value(value))

    def kill(self, region: str, key: tuple) -> int:
        return self._single(KILL, region, key, None)

    def zkill(self, region: str, key: tuple) -> int:
        return self._single(ZKILL, region, key, None)

    def _single(self, op: int, region: str, key: Any, vb: bytes | None) -> int:
        """One update as a transaction of its own (the fast path of db.set/kill/zkill)."""
        if self._local.tx is not None:
            raise TransactionError("db.set/kill/zkill inside an open transaction would nest transactions: "
                                   "use tx.set/kill/zkill on the transaction instead")
        self._check_open()
        if not isinstance(region, str):
            raise RegionNotFound(f"region must be a region name, got {region!r}")
        self._region(region)
        return self._commit([(op, region, check_key(key), vb)])

    def _commit(self, ops: list[tuple[int, str, tuple, bytes | None]], **kw: Any) -> int:
        """Apply ``ops`` atomically; return the seqno (0 if nothing replicated was touched)."""
        if self.journal.durability == "group":
            wake = self._local.wake
            if wake is None:  # one wake lock per thread, kept acquired between commits
                wake = self._local.wake = threading.Lock()
                wake.acquire()
            return self._commit_grouped(_Request(ops, kw, wake))
        with self._lock:
            self._check_open()
            snap = self._savepoint()
            try:
                seqno, data = self._prepare(ops, **kw)
                if data:
                    self._write([(seqno, data)])
            except BaseException:
                self._rollback_to(snap)
                raise
            self.store.release(BATCH)
            self._maybe_flush()
        return seqno

    def _savepoint(self) -> tuple:
        """Open the savepoint a commit (or a batch of them) can be undone to, with the in-memory
        positions to restore: a failed journal write or an oversized record then leaves no trace,
        and nothing else unflushed is lost."""
        self.store.savepoint(BATCH)
        return self._seqno, dict(self._stream_seqnos), self.store.positions()

    def _rollback_to(self, snap: tuple) -> None:
        # In-memory positions first: if the store cannot roll back (StoreLost), they still must not
        # count what was undone.
        self._seqno = snap[0]
        self._stream_seqnos.clear()
        self._stream_seqnos.update(snap[1])
        self.store.restore_positions(snap[2])
        self.store.rollback_to(BATCH)

    def _prepare(self, ops: list[tuple[int, str, tuple, bytes | None]], *, origin: str | None = None,
                 stream: int = 0, stream_seqno: int | None = None, replicated_apply: bool = False,
                 commit_time: float | None = None) -> tuple[int, bytes]:
        """Under the commit lock: apply to the store, assign the seqno, frame the journal record."""
        self._check_open()
        st = self.store
        regions = st.regions
        for op in ops:
            if op[0] not in OPS:
                raise TransactionError(f"update {op[0]!r} to region {op[1]!r} is not one of set ({SET}), kill "
                                       f"({KILL}) or zkill ({ZKILL})")
            r = regions.get(op[1])
            if r is None:
                if not replicated_apply:
                    self._region(op[1])
            elif r.replicated and not replicated_apply and self.info.role != "primary":
                raise NotPrimary(f"instance {self.name} is a replicating secondary: it accepts no "
                                 f"application updates to replicated region {op[1]!r}; write to its primary")
        updates: list[Update] = []
        touched: set[str] = set()
        i, n = 0, len(ops)
        while i < n:
            opc, region, key, vb = ops[i]
            r = regions.get(region) or st.create_region(region, True)
            if opc == SET:  # a run of sets in one region: one read of before-images, one write
                j = i + 1
                while j < n and ops[j][0] == SET and ops[j][1] == region:
                    j += 1
                run = ops[i:j]
                kbs = [encode_key(o[2]) for o in run]
                if r.replicated:
                    cur = st.get_many(r.id, kbs)
                    add = updates.append
                    for o, kb in zip(run, kbs):
                        vb = o[3]
                        add(Update(SET, region, o[2], vb, cur.get(kb)))
                        cur[kb] = vb
                    st.put_values(r.id, cur)  # now every key of the run with its last value
                else:
                    st.put_values(r.id, {kb: o[3] for o, kb in zip(run, kbs)})
                i = j
            else:
                kb = encode_key(key)
                if opc == KILL:
                    if r.replicated:
                        killed = [(decode_key(k), v) for k, v in st.subtree(r.id, kb)]
                        updates.append(Update(KILL, region, key, None, None, killed))
                    st.delete_subtree(r.id, kb)
                else:
                    if r.replicated:
                        updates.append(Update(ZKILL, region, key, None, st.get(r.id, kb)))
                    st.delete(r.id, kb)
                i += 1
            if r.replicated:
                touched.add(region)
        return self._seal(updates, touched, origin=origin, stream=stream, stream_seqno=stream_seqno,
                          commit_time=commit_time)

    def _seal(self, updates: list[Update], touched: set[str], *, origin: str | None = None, stream: int = 0,
              stream_seqno: int | None = None, commit_time: float | None = None) -> tuple[int, bytes]:
        """Under the commit lock: give applied ``updates`` the next seqno and frame their journal
        record; a record over the journal's limit is a TransactionError and takes no seqno."""
        if not updates:
            return 0, b""
        st = self.store
        seqno = self._seqno + 1
        if stream_seqno is None:  # a local transaction: stream 0
            # A supplementary instance counts its own transactions on stream 0 (GT.M's {102,0,11});
            # elsewhere the stream seqno of a local transaction is its seqno.
            stream_seqno = self._stream_seqnos.get(0, 0) + 1 if self.info.supplementary else seqno
        rec = Record(seqno, stream, stream_seqno, origin or self.name, commit_time or time.time(), updates)
        payload = encode_payload(rec)
        limit = journal_records.MAX_RECORD_BYTES
        if len(payload) > limit:
            raise TransactionError(f"transaction of {len(payload):,} bytes exceeds the journal's record limit of "
                                   f"{limit:,} bytes; split it into smaller transactions")
        self._seqno = seqno
        if stream or self.info.supplementary:
            self._stream_seqnos[stream] = stream_seqno
        st.mark_applied(seqno, touched)
        return seqno, frame(seqno, payload)

    def _write(self, frames: list[tuple[int, bytes]]) -> None:
        """Under the commit lock: journal prepared frames, then hand them to the commit listeners."""
        self.journal.append(frames[0][1] if len(frames) == 1 else b"".join(f for _, f in frames), frames[-1][0])
        for seqno, data in frames:
            for listener in self.commit_listeners:
                listener(seqno, data)

    def _commit_grouped(self, req: "_Request") -> int:
        """Group commit by combining, pipelined: one committer at a time (the combiner) takes every
        queued request, applies them as one batch and writes one buffer; it then hands the combiner
        role to the oldest waiting request *before* its fdatasync, so the next batch is prepared
        while this one is being hardened. Each caller is woken exactly once: when its batch is
        hard, or when it becomes the combiner."""
        with self._q_lock:
            self._queue.append(req)
            lead = not self._combining
            self._combining = True
        if not lead:
            req.wake.acquire()
            if not req.promoted:
                if req.error is not None:
                    raise req.error
                return req.seqno
        with self._q_lock:
            batch, self._queue = self._queue, []
        try:
            token, err = self._prepare_batch(batch)
        except BaseException as e:  # whatever happens, the batch and the next combiner must be woken
            token, err = None, e
            _fail_all(batch, e)
        finally:
            with self._q_lock:  # the next batch may start now
                if self._queue:
                    nxt = self._queue[0]
                    nxt.promoted = True
                    nxt.wake.release()
                else:
                    self._combining = False
        if token is not None and err is None:
            try:
                self.journal.harden(token)
            except BaseException as e:
                err = e
        for r in batch:
            if err is not None and r.error is None and r.seqno:
                r.error = err
            r.done = True
            if r is not req:
                r.wake.release()
        if req.error is not None:
            raise req.error
        return req.seqno

    def _prepare_batch(self, batch: list["_Request"]) -> tuple[tuple | None, BaseException | None]:
        """Under the commit lock: apply and journal a batch; returns what ``harden`` needs."""
        frames: list[tuple[int, bytes]] = []
        st = self.store
        with self._lock:
            if self._closed:  # closed while these waited: the store is gone
                e = TransactionError(f"instance {self.layout.root} was closed before this commit")
                _fail_all(batch, e)
                return None, e
            snap = self._savepoint()
            token = None
            try:
                if not self._prepare_sets(batch, frames):
                    self._prepare_each(batch, frames)
                if frames:
                    self._write(frames)
                    token = self.journal.sync_token()
            except BaseException as e:
                # The whole batch is undone, including requests that journal nothing (updates of
                # unreplicated regions only): every one of them must fail, not only those with a seqno.
                self._rollback_to(snap)
                _fail_all(batch, e)
                return None, e
            st.release(BATCH)
            self._maybe_flush()
        return token, None

    def _prepare_each(self, batch: list["_Request"], frames: list[tuple[int, bytes]]) -> None:
        """Under the commit lock: prepare a batch request by request, each in a savepoint of its
        own, so that a request that fails leaves nothing behind and the others go on."""
        st = self.store
        for r in batch:
            st.savepoint(REQUEST)
            try:
                r.seqno, data = self._prepare(r.ops, **r.kw)
                if data:
                    frames.append((r.seqno, data))
                st.release(REQUEST)
            except Exception as e:  # this request only: it leaves nothing behind
                st.rollback_to(REQUEST)
                r.error, r.seqno = e, 0

    def _prepare_sets(self, batch: list["_Request"], frames: list[tuple[int, bytes]]) -> bool:
        """Under the commit lock, the common batch (on a primary, every request only sets keys of
        existing regions): read the batch's before-images with one query per region and write its
        values with one statement per region, instead of a savepoint, a read and a write for each
        request. Every SQLite call lets the GIL go, and with many committing threads the combiner
        then waits for its turn to take it back: the calls per batch, more than their work, bound
        group commit. Returns False, having done nothing, for any other batch."""
        st = self.store
        regions = st.regions
        if self.info.role != "primary":
            return False
        for r in batch:
            if r.kw:
                return False
            for op in r.ops:
                if op[0] != SET or op[1] not in regions:
                    return False
        keyed: list[tuple[_Request, list[bytes]]] = []
        for r in batch:
            try:
                keyed.append((r, [encode_key(op[2]) for op in r.ops]))
            except KeyTypeError as e:  # a string subscript that is not text: this request only
                r.error, r.seqno = e, 0
        wanted: dict[int, list[bytes]] = {}
        for r, kbs in keyed:
            for op, kb in zip(r.ops, kbs):
                reg = regions[op[1]]
                if reg.replicated:
                    wanted.setdefault(reg.id, []).append(kb)
        current = {rid: st.get_many(rid, kbs) for rid, kbs in wanted.items()}  # before-images, kept current
        written: dict[int, dict[bytes, bytes]] = {}
        for r, kbs in keyed:
            undo: list[tuple[dict, bytes, Any]] = []  # what to put back if the request fails
            updates: list[Update] = []
            touched: set[str] = set()
            for (_, region, key, vb), kb in zip(r.ops, kbs):
                reg = regions[region]
                if reg.replicated:
                    cur = current[reg.id]
                    before = cur.get(kb, _ABSENT)
                    updates.append(Update(SET, region, key, vb, None if before is _ABSENT else before))
                    touched.add(region)
                    undo.append((cur, kb, before))
                    cur[kb] = vb
                w = written.setdefault(reg.id, {})
                undo.append((w, kb, w.get(kb, _ABSENT)))
                w[kb] = vb
            try:
                r.seqno, data = self._seal(updates, touched)
            except Exception as e:  # this request only (a record over the limit): undo its sets
                for d, kb, old in reversed(undo):
                    if old is _ABSENT:
                        del d[kb]
                    else:
                        d[kb] = old
                r.error, r.seqno = e, 0
                continue
            if data:
                frames.append((r.seqno, data))
        for rid, w in written.items():
            if w:
                st.put_values(rid, w)
        return True

    def apply_records(self, recs: list[Record], *, si_stream: int | None = None) -> int:
        """Apply transactions received from upstream, in order, with one journal write and one
        fsync (the Update Process).

        BC (``si_stream`` None): each keeps its seqno, stream tag and origin. SI: a supplementary
        instance gives each its own next seqno and tags it ``si_stream`` with the originating seqno
        as ``stream_seqno``. Either way a record already applied is skipped, so a replay after any
        restart applies exactly once."""
        with self._lock:
            self._check_open()
            frames = []
            snap = self._savepoint()
            try:
                self._prepare_received(recs, si_stream, frames)
                if frames:
                    self._write(frames)
            except BaseException:
                self._rollback_to(snap)
                raise
            self.store.release(BATCH)
            if frames and self.journal.durability == "group":
                self.journal.sync()
            self._maybe_flush()
            return self._seqno

    def _prepare_received(self, recs: list[Record], si_stream: int | None, frames: list) -> None:
        """Under the commit lock: prepare received records not applied yet, checking continuity."""
        for rec in recs:
            if si_stream is None:
                pos, num, kw = self._seqno, rec.seqno, {"stream": rec.stream, "stream_seqno": rec.stream_seqno}
            else:
                pos, num = self._stream_seqnos.get(si_stream, 0), rec.seqno
                kw = {"stream": si_stream, "stream_seqno": rec.seqno}
            if num <= pos:
                continue
            if num != pos + 1:
                raise JournalGap(f"instance {self.name} is at {'seqno' if si_stream is None else 'stream seqno'} "
                                 f"{pos}; received seqno {num} leaves a gap")
            ops = [(u.op, u.region, tuple(u.key), u.value) for u in rec.updates]
            seqno, data = self._prepare(ops, origin=rec.origin, replicated_apply=True, commit_time=rec.time, **kw)
            frames.append((seqno, data))

    def stream_seqno(self, stream: int) -> int:
        """SI: the last originating seqno received on ``stream``."""
        return self._stream_seqnos.get(stream, 0)

    def set_stream_seqno(self, stream: int, seqno: int) -> None:
        """SI ``--noresync``: continue ``stream`` from ``seqno`` without rolling anything back."""
        with self._lock:
            self._stream_seqnos[stream] = seqno
            self.store._begin()
            self._flush_locked()

    def apply_record(self, rec: Record) -> int:
        """Apply one transaction received from upstream, keeping its seqno (BC); it must be the next."""
        if rec.seqno != self._seqno + 1:
            raise JournalGap(f"instance {self.name} is at seqno {self._seqno}; cannot apply seqno {rec.seqno}")
        return self.apply_records([rec])

    def _maybe_flush(self) -> None:
        """After commits: flush the store now and then. The commits are in the journal already, so a
        store that cannot flush (a full disk) must not make them look failed to their callers, who
        would retry and apply them twice: it is logged, and the next flush tries again (or, the
        store lost, every later operation says so)."""
        st = self.store
        if not st.dirty:
            return
        if (st.applied_seqno - st.flushed_seqno >= STORE_FLUSH_TXNS
                or time.monotonic() - self._last_flush >= STORE_FLUSH_INTERVAL_S):
            try:
                self._flush_locked()
            except (StorageFull, StoreLost) as e:
                _log.warning("instance %s: the store could not be flushed after commits that are in the "
                             "journal: %s", self.name, e)

    def _flush_locked(self) -> None:
        self.journal.sync()
        self.store.flush()
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        """Harden the journal and commit the store now."""
        with self._lock:
            self._check_open()
            self._flush_locked()

    # -- instance file ---------------------------------------------------------------------------
    def save_info(self) -> None:
        """Write the instance file (with the current seqno) crash-safely."""
        self.info.seqno = self._seqno
        ifile.save(self.layout.instance_file, self.info)

    def update_info(self, fn: Callable[[ifile.InstanceFile], None]) -> None:
        with self._lock:
            fn(self.info)
            self.save_info()

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.journal.sync()
                self.store.close()
                self.journal.close()
                self.save_info()
            finally:
                self._lock_file.release()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<multisite.Database {self.name} at {self.layout.root} seqno={self._seqno}>"


def _fail_all(batch: list["_Request"], err: BaseException) -> None:
    """Give every request of a batch that was not applied the error (keeping its own, if it had one)."""
    for r in batch:
        if r.error is None:
            r.error = err
        r.seqno = 0


class _ThreadState(threading.local):
    """Per thread: the open transaction, and the lock group commit wakes the thread with. Class
    defaults, so that reading them in a thread that never set them raises nothing (an AttributeError
    inside getattr costs more than the rest of the lookup)."""

    tx: "Transaction | None" = None
    wake: threading.Lock | None = None


class _Request:
    """One transaction waiting in the group-commit queue."""

    __slots__ = ("ops", "kw", "wake", "seqno", "error", "done", "promoted")

    def __init__(self, ops: list, kw: dict, wake: threading.Lock):
        self.ops, self.kw, self.wake = ops, kw, wake
        self.seqno = 0
        self.error: BaseException | None = None
        self.done = False
        self.promoted = False


class Transaction:
    """``with db.transaction() as tx:`` — updates commit atomically with one seqno."""

    def __init__(self, db: Database):
        self.db = db
        self.ops: list[tuple[int, str, tuple, bytes | None]] = []
        self.seqno = 0
        self._state = "new"

    def __enter__(self) -> "Transaction":
        local = self.db._local
        if local.tx is not None:
            raise TransactionError("nested transactions are not supported: commit the outer transaction first")
        self.db._check_open()
        local.tx = self
        self._state = "open"
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db._local.tx = None
        if exc_type is not None:
            self._state = "aborted"
            return
        self.commit()

    def commit(self) -> int:
        return commit_once(self, self.db._commit)

    def _add(self, op: int, region: str, key: Any, vb: bytes | None) -> None:
        self._check(region)
        self.ops.append((op, region, check_key(key), vb))

    def _check(self, region: Any) -> None:
        if self._state != "open":
            raise TransactionError(f"transaction is {self._state}; start a new one with db.transaction()")
        if not isinstance(region, str):
            raise RegionNotFound(f"region must be a region name, got {region!r}")
        self.db._region(region)

    def set(self, region: str, key: tuple, value: Any) -> None:
        # The hot path of large transactions: the checks of _add, inlined for the common case.
        if self._state != "open" or region not in self.db.store.regions:
            self._check(region)
        self.ops.append((SET, region, check_key(key), encode_value(value)))

    def kill(self, region: str, key: tuple) -> None:
        self._add(KILL, region, key, None)

    def zkill(self, region: str, key: tuple) -> None:
        self._add(ZKILL, region, key, None)


def commit_once(tx: Any, commit: Callable[[list], int]) -> int:
    """Commit ``tx.ops`` through ``commit`` once, for an embedded or a remote transaction: a second
    call, even from another thread while the first runs, is refused, and so is one after a failure
    (a new transaction, not this one, is what a caller retries with)."""
    if tx._state in ("committing", "committed", "failed"):
        raise TransactionError(f"transaction already {tx._state}; start a new one with db.transaction()")
    tx._state = "committing"
    try:
        if tx.ops:
            tx.seqno = commit(tx.ops)
    except BaseException:
        tx._state = "failed"
        raise
    tx._state = "committed"
    return tx.seqno


def open(path: str | os.PathLike, **kwargs: Any) -> Database:  # noqa: A001 - the public name
    """Open (and recover) the instance at ``path``."""
    return Database(path, **kwargs)
