"""``Database``: an open instance, the engine's public facade (``multisite.open``).

It owns the instance lock and a ``Core`` (the shared state; see ``core.py``), recovers on open, and
gives every other package what it may do with an instance as public operations: reads, commits,
the apply of received transactions, rollback, flush, the instance file. The work is done by the
engine's modules: ``commit`` and ``group`` (local commits), ``apply`` (received ones),
``recovery`` and ``rollback``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ConfigError, InstanceExists, JournalGap, RegionNotFound, TransactionError
from ..fsutil import make_dir, make_root
from ..instance import instance_file as ifile
from ..instance.layout import InstanceLock, Layout
from ..journal.durability import Durability
from ..journal.records import KILL, SET, ZKILL, FrameRun, Record
from ..journal.writer import DEFAULT_SEGMENT_BYTES, MIN_SEGMENT_BYTES, JournalWriter, create_segment
from ..keys import check_key, decode_key, encode_key
from ..store.sqlite import RegionInfo, Store
from ..values import decode_value, encode_value
from . import apply, commit, prepared, rollback as _rollback
from .group import GroupCommit
from .recovery import abandon, recover
from .rollback import RollbackReport
from .streams import seqno_as_of
from .transaction import ThreadState, Transaction


def create(path: str | os.PathLike, name: str, *, group: str = "default", supplementary: bool = False,
           durability: str | Durability = Durability.FSYNC, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
           journal_pool_bytes: int = 64 * 1024 * 1024, group_read: bool = False) -> Path:
    """Create a new, empty instance directory named ``name`` in LMS group ``group``: 0700 and its files
    0600, or with ``group_read`` 0750 and 0640 (its group may read the data: a backup or a monitor
    running as another user of that group)."""
    if not ifile.valid_name(name):
        raise ConfigError(f"instance name {name!r} must be letters, digits, '-', '_' or '.'")
    durability = Durability.parse(durability)
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
    make_root(lay.root, group_read=group_read)
    for d in lay.dirs():
        make_dir(d)
    create_segment(lay.journal, 1, 1, 0)
    Store(lay.store_file).close()
    inst = ifile.InstanceFile(name=name, group=group, supplementary=supplementary, created=time.time(),
                              durability=durability.value, segment_bytes=segment_bytes,
                              journal_pool_bytes=journal_pool_bytes)
    inst.add_history(1, name, "originating")
    ifile.save(lay.instance_file, inst)
    return lay.root


class Database:
    """An open instance. Thread-safe; one per process per instance (the instance lock)."""

    def __init__(self, path: str | os.PathLike, *, durability: str | Durability | None = None,
                 segment_bytes: int | None = None):
        self.layout = Layout.existing(path)
        self._lock_file = InstanceLock(self.layout)
        self._lock_file.acquire()
        try:
            t0 = time.perf_counter()
            self._core, self.recovery = recover(self.layout, durability and Durability.parse(durability),
                                                segment_bytes)
            self._local = ThreadState()
            self._group = GroupCommit(self._core)
            self._grouped = self._core.journal.durability is Durability.GROUP  # fixed while open
            try:
                done = _rollback.finish_interrupted(self._core)
            except BaseException:
                abandon(self._core)
                raise
            if done is not None:
                self.recovery.notes.append(f"completed an interrupted rollback: {done.summary()}")
            self.open_seconds = time.perf_counter() - t0
        except BaseException:
            self._lock_file.release()
            raise

    # -- what the instance is --------------------------------------------------------------------
    @property
    def seqno(self) -> int:
        """The last committed seqno."""
        return self._core.seqno

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def info(self) -> ifile.InstanceFile:
        """The instance file as this process holds it (change it with ``update_info``)."""
        return self._core.info

    @property
    def role(self) -> str:
        return self._core.info.role

    @property
    def store(self) -> Store:
        return self._core.store

    @property
    def journal(self) -> JournalWriter:
        return self._core.journal

    @property
    def durability(self) -> Durability:
        return self._core.journal.durability

    @property
    def commit_listeners(self) -> list[Callable[[int, list[bytes]], None]]:
        """Called under the commit lock, in seqno order, with ``(first seqno, journal frames)`` of each
        commit or batch of commits (consecutive seqnos)."""
        return self._core.commit_listeners

    @property
    def rollback_listeners(self) -> list[Callable[[int], None]]:
        """Called with the new seqno after a rollback."""
        return self._core.rollback_listeners

    def stream_seqno(self, stream: int) -> int:
        """SI: the last originating seqno received on ``stream``."""
        return self._core.stream_seqnos.get(stream, 0)

    def stream_seqnos(self) -> dict[int, int]:
        """SI: a copy of the last stream seqno per stream."""
        return dict(self._core.stream_seqnos)

    @property
    def hardened_seqno(self) -> int:
        """The last seqno the journal hardened (wrote, with durability none): what a secondary may
        confirm. Received transactions move ``seqno`` before their journal write and fdatasync."""
        return min(self._core.seqno, self._core.hardened_seqno())

    def hardened_stream_seqno(self, stream: int) -> int:
        """SI: received ``stream``'s (1..15) seqno as of the journal's hardened position: what a
        supplementary instance may confirm on it. Without the commit lock (see ``streams``)."""
        core = self._core
        current = core.stream_seqnos.get(stream, 0)  # in this order: the seqno, its marks, the position
        marks = core.stream_marks.get(stream, ())
        return seqno_as_of(marks, current, hard=core.hardened_seqno())

    # -- regions ---------------------------------------------------------------------------------
    def create_region(self, name: str, replicated: bool = True, schema: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"region name must be a non-empty string, got {name!r}")
        core = self._core
        with core.lock:
            core.check_open()
            if name in core.store.regions:
                r = core.store.regions[name]
                if r.replicated != replicated:
                    raise ConfigError(f"region {name!r} exists and is {'' if r.replicated else 'un'}replicated")
                return
            core.store.create_region(name, replicated, schema)
            core.journal.sync()
            core.store.flush()

    def regions(self) -> dict[str, bool]:
        return {n: r.replicated for n, r in self._core.store.regions.items()}

    def region(self, name: str) -> RegionInfo:
        """The region named ``name``; RegionNotFound naming how to create it otherwise."""
        return self._core.region(name)

    # -- reads -----------------------------------------------------------------------------------
    def get(self, region: str, key: tuple) -> Any:
        kb = encode_key(check_key(key))
        core = self._core
        with core.lock:
            core.check_open()
            vb = core.store.get(core.region(region).id, kb)
        return None if vb is None else decode_value(vb)

    def get_encoded(self, region: str, key: bytes) -> bytes | None:
        """The encoded value of an encoded key (a server answering a client), None if absent or if the
        region does not exist."""
        core = self._core
        with core.lock:
            core.check_open()
            r = core.store.regions.get(region)
            return None if r is None else core.store.get(r.id, key)

    def get_encoded_many(self, region: str, keys: list[bytes]) -> dict[bytes, bytes]:
        """The encoded values of those encoded keys that exist, in a few queries (not one per key)."""
        core = self._core
        with core.lock:
            core.check_open()
            return core.store.get_many(core.region(region).id, keys)

    def page(self, region: str, lo: bytes, hi: bytes | None, limit: int, *, inclusive: bool = True
             ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` encoded ``(key, value)`` rows in key order from ``lo`` to ``hi`` (exclusive)."""
        core = self._core
        with core.lock:
            core.check_open()
            return core.store.page(core.region(region).id, lo, hi, limit, inclusive=inclusive)

    def items(self, region: str, start: tuple | None = None, stop: tuple | None = None,
              batch: int = 1000) -> Iterator[tuple[tuple, Any]]:
        """``(key, value)`` in key order from ``start`` (inclusive) to ``stop`` (exclusive)."""
        lo = encode_key(check_key(start)) if start is not None else b""
        hi = encode_key(check_key(stop)) if stop is not None else None
        inclusive = True
        while True:
            rows = self.page(region, lo, hi, batch, inclusive=inclusive)
            for kb, vb in rows:
                yield decode_key(kb), decode_value(vb)
            if len(rows) < batch:
                return
            lo, inclusive = rows[-1][0], False

    # -- writes ----------------------------------------------------------------------------------
    def transaction(self) -> Transaction:
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
        core = self._core
        core.check_open()
        if not isinstance(region, str):
            raise RegionNotFound(f"region must be a region name, got {region!r}")
        core.region(region)
        ops = [(op, region, check_key(key), vb)]
        return self._group.commit(ops) if self._grouped else commit.commit(core, ops)

    def commit_updates(self, ops: list[tuple[int, str, tuple, bytes | None]]) -> int:
        """Commit ``(opcode, region, key, encoded value or None)`` updates atomically, as one
        transaction, by the instance's durability; the seqno (0 if nothing replicated was touched)."""
        return self._group.commit(ops) if self._grouped else commit.commit(self._core, ops)

    def prepare(self, txns: list[list[tuple[int, str, tuple, bytes | None]]]) -> prepared.Prepared:
        """The first half of a voted commit (a grid primary): apply ``txns`` and frame them, keeping
        the commit lock until the returned batch is ``commit()``-ed or ``abort()``-ed (see ``prepared``)."""
        return prepared.prepare_batch(self._core, txns)

    def set_lease(self, until: float | None) -> None:
        """Commit only until the monotonic time ``until`` (a leader lease, ``ha/``): past it every local
        commit raises NotPrimary, checked under the commit lock. None: no lease (the default)."""
        self._core.lease_until = until

    @property
    def fenced(self) -> bool:
        """True once the leader lease has ended (``set_lease``): a primary that takes no local commit."""
        return self._core.lease_ended()

    def flush_if_due(self) -> None:
        """Commit the store now if enough commits or time passed since the last flush (as every commit
        does by itself unless it was written with ``flush_store=False``)."""
        core = self._core
        with core.lock:
            core.check_open()
            core.maybe_flush()

    def harden(self, token: tuple) -> None:
        """fdatasync up to a prepared batch's ``write()`` token, without the commit lock."""
        self._core.journal.harden(token)

    # -- replication -----------------------------------------------------------------------------
    def apply_frames(self, runs: list[FrameRun]) -> int:
        """BC: apply received journal frames, checked, keeping their bytes (see ``apply``); the seqno."""
        return apply.apply_frames(self._core, runs)

    def apply_records(self, recs: list[Record], *, si_stream: int | None = None) -> int:
        """Apply received transactions, in order, exactly once. BC (``si_stream`` None): each keeps
        its seqno, stream tag and origin. SI: each gets this instance's next seqno and is tagged
        ``si_stream`` with the originating seqno as ``stream_seqno``."""
        return apply.apply_records(self._core, recs, si_stream)

    def apply_record(self, rec: Record) -> int:
        """Apply one transaction received from upstream, keeping its seqno (BC); it must be the next."""
        if rec.seqno != self.seqno + 1:
            raise JournalGap(f"instance {self.name} is at seqno {self.seqno}; cannot apply seqno {rec.seqno}")
        return self.apply_records([rec])

    def set_stream_seqno(self, stream: int, seqno: int) -> None:
        """SI ``--noresync``: continue ``stream`` from ``seqno`` without rolling anything back."""
        core = self._core
        with core.lock:
            core.stream_seqnos[stream] = seqno
            core.store.touch()
            core.flush()

    def rollback(self, to_seqno: int, *, reason: str = "rollback", common_seqno: int | None = None,
                 common_stream: int | None = None) -> RollbackReport:
        """Take every transaction after ``to_seqno`` off this instance, into a lost-transaction file
        (see ``rollback``); a no-op if the instance is not ahead of it."""
        return _rollback.rollback(self._core, to_seqno, reason=reason, common_seqno=common_seqno,
                                  common_stream=common_stream)

    def flush(self) -> None:
        """Harden the journal and commit the store now."""
        core = self._core
        with core.lock:
            core.check_open()
            core.flush()

    # -- instance file ---------------------------------------------------------------------------
    def save_info(self) -> None:
        """Write the instance file (with the current seqno) crash-safely."""
        with self._core.lock:
            self._core.save_info()

    def update_info(self, fn: Callable[[ifile.InstanceFile], None]) -> None:
        """Change the instance file under the commit lock and save it."""
        with self._core.lock:
            fn(self._core.info)
            self._core.save_info()

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        core = self._core
        with core.lock:
            if core.closed:
                return
            core.closed = True
            try:
                if core.journal.broken is None:
                    core.journal.sync()
                    core.store.close()
                else:  # an fdatasync failed: the store must not commit what the journal may not hold
                    core.store.abandon()
                core.journal.close()
                core.save_info()
            finally:
                self._lock_file.release()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<multisite.Database {self.name} at {self.layout.root} seqno={self.seqno}>"


def open(path: str | os.PathLike, **kwargs: Any) -> Database:  # noqa: A001 - the public name
    """Open (and recover) the instance at ``path``."""
    return Database(path, **kwargs)
