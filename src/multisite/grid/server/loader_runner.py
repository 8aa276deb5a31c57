"""The grid's Loaders: write-through of a primary's transactions to a real database (issue 16).

``Loader`` is the contract (a protocol class in ``grid/loader.py``, public as ``multisite.grid.Loader``); ``SQLiteLoader`` (a file, the embedded default) and
``PostgresLoader`` (psycopg 3) implement it; ``"module:Class"`` in ``grid.toml`` names any other.
``ShardLoader`` is what a primary shard holds: it decodes the frames of a batch into changes, runs the
Loader in a thread of its own, keeps its ``LoaderHealth`` (up, or down with a reconnect backoff) and
replays a new primary's journal before it serves (``grid/loader.replay_plan``).

Tables: one per map (``key TEXT PRIMARY KEY`` — the key tuple as a JSON array — and ``value``:
JSONB in PostgreSQL, JSON text in SQLite), and ``multisite_applied(partition, seqno, digest)``, the ids
of the applied transactions, written in the same database transaction as their rows: that is what
makes a replay idempotent (a transaction whose id is there is skipped).

Crash points for the fault tests: ``MULTISITE_GRID_LOADER_CRASH=POINT:N`` SIGKILLs the process the
``N``-th time a primary reaches ``POINT`` (``a``: frames sent to the replicas, before the database
commit; ``b``: after the database commit, before the grid's; ``c``: after the grid's commit, before
its outcome is sent).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from ..loader import (Change, Loader, LoaderDown, LoaderHealth, LoaderRefused, ReplayKind,
                      ReplicaBuffer, TxnId, replay_plan)
from ..shipping import digest
from ...journal.reader import iter_runs
from ...journal.records import FRAME_HEADER_SIZE, KILL, SET, ZKILL, decode_payload
from ...journal.segments import list_segments

log = logging.getLogger("multisite.container")

APPLIED_TABLE = "multisite_applied"
REPLAY_CHUNK = 1000  # transactions per database transaction in a replay


def _json(value: Any) -> str:
    return json.dumps(value, default=_jsonable, separators=(",", ":"))


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$bytes": bytes(v).hex()}
    raise TypeError(f"{type(v).__name__} is not JSON")


def key_text(key: tuple) -> str:
    return json.dumps(list(key), separators=(",", ":"))


class SQLiteLoader:
    """A SQLite file (``path``); WAL, one connection, ``synchronous = FULL``."""

    def __init__(self, path: str, tables: dict[str, str], synchronous: str = "FULL") -> None:
        self.path, self.tables, self.synchronous = path, tables, synchronous
        self.conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self.conn is None:
            try:
                c = sqlite3.connect(self.path, isolation_level=None, timeout=5.0)
                c.execute("PRAGMA journal_mode=WAL")
                c.execute(f"PRAGMA synchronous={self.synchronous}")
                c.execute(f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} (partition INTEGER NOT NULL, seqno INTEGER "
                          f"NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (partition, seqno, digest))")
                for t in self.tables.values():
                    c.execute(f'CREATE TABLE IF NOT EXISTS "{t}" (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)')
            except sqlite3.Error as e:
                raise LoaderDown(f"sqlite {self.path}: {e}") from e
            self.conn = c
        return self.conn

    def apply(self, txns: list[tuple[TxnId, list[Change]]]) -> int:
        c = self._connect()
        n = 0
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                for tid, changes in txns:
                    cur = c.execute(f"INSERT OR IGNORE INTO {APPLIED_TABLE} VALUES (?, ?, ?)", tuple(tid))
                    if cur.rowcount == 0:
                        continue  # applied before: no operation
                    n += 1
                    for table, key, value in changes:
                        if value is None:
                            c.execute(f'DELETE FROM "{self.tables[table]}" WHERE key = ?', (key,))
                        else:
                            c.execute(f'INSERT INTO "{self.tables[table]}" (key, value) VALUES (?, ?) ON CONFLICT '
                                      f'(key) DO UPDATE SET value = excluded.value', (key, _json(value)))
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        except (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError) as e:
            raise LoaderRefused(f"sqlite refused the write: {e}") from e
        except sqlite3.Error as e:
            self.close()
            raise LoaderDown(f"sqlite {self.path}: {e}") from e
        return n

    def last_applied(self, partition: int) -> TxnId | None:
        try:
            row = self._connect().execute(f"SELECT partition, seqno, digest FROM {APPLIED_TABLE} WHERE partition = ? "
                                          f"ORDER BY seqno DESC LIMIT 1", (partition,)).fetchone()
        except sqlite3.Error as e:
            self.close()
            raise LoaderDown(f"sqlite {self.path}: {e}") from e
        return TxnId(*row) if row else None

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except sqlite3.Error as e:
                log.info("closing the loader's SQLite connection: %s", e)
            self.conn = None


class PostgresLoader:
    """A PostgreSQL server through psycopg 3 (``dsn``, a libpq connection string)."""

    def __init__(self, dsn: str, tables: dict[str, str], connect_timeout_s: float = 3.0,
                 statement_timeout_ms: int = 5000) -> None:
        self.dsn, self.tables = dsn, tables
        self.connect_timeout_s, self.statement_timeout_ms = connect_timeout_s, statement_timeout_ms
        self.conn = None

    def _connect(self):
        import psycopg
        if self.conn is None or self.conn.closed:
            try:
                c = psycopg.connect(self.dsn, autocommit=False, connect_timeout=max(1, int(self.connect_timeout_s)),
                                    options=f"-c statement_timeout={self.statement_timeout_ms} "
                                            f"-c lock_timeout={self.statement_timeout_ms}")
                with c.cursor() as cur:
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} (partition INTEGER NOT NULL, seqno "
                                f"BIGINT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (partition, seqno, digest))")
                    for t in self.tables.values():
                        cur.execute(f'CREATE TABLE IF NOT EXISTS "{t}" (key TEXT PRIMARY KEY, value JSONB NOT NULL)')
                c.commit()
            except psycopg.Error as e:
                raise LoaderDown(f"postgresql: {e}".strip()) from e
            self.conn = c
        return self.conn

    def apply(self, txns: list[tuple[TxnId, list[Change]]]) -> int:
        import psycopg
        if not txns:
            return 0
        c = self._connect()
        n = 0
        try:
            with c.cursor() as cur:
                # which ids the table has: one round trip; then the rest in pipeline mode (no round trip
                # per statement), all in one database transaction
                cur.execute(f"SELECT seqno, digest FROM {APPLIED_TABLE} WHERE partition = %s AND seqno = ANY(%s)",
                            (txns[0][0].partition, [t.seqno for t, _ in txns]))
                have = {(s, d) for s, d in cur.fetchall()}
                with c.pipeline():
                    for tid, changes in txns:
                        if (tid.seqno, tid.digest) in have:
                            continue  # applied before: no operation
                        n += 1
                        cur.execute(f"INSERT INTO {APPLIED_TABLE} VALUES (%s, %s, %s)", tuple(tid))
                        for table, key, value in changes:
                            if value is None:
                                cur.execute(f'DELETE FROM "{self.tables[table]}" WHERE key = %s', (key,))
                            else:
                                cur.execute(f'INSERT INTO "{self.tables[table]}" (key, value) VALUES (%s, %s::jsonb) '
                                            f'ON CONFLICT (key) DO UPDATE SET value = excluded.value',
                                            (key, _json(value)))
            c.commit()
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            self.close()
            raise (LoaderRefused if _is_timeout(e) else LoaderDown)(f"postgresql: {e}".strip()) from e
        except psycopg.Error as e:
            try:
                c.rollback()
            except psycopg.Error:
                self.close()
            raise LoaderRefused(f"postgresql refused the write: {e}".strip()) from e
        return n

    def last_applied(self, partition: int) -> TxnId | None:
        import psycopg
        c = self._connect()
        try:
            with c.cursor() as cur:
                cur.execute(f"SELECT partition, seqno, digest FROM {APPLIED_TABLE} WHERE partition = %s "
                            f"ORDER BY seqno DESC LIMIT 1", (partition,))
                row = cur.fetchone()
            c.commit()
        except psycopg.Error as e:
            self.close()
            raise LoaderDown(f"postgresql: {e}".strip()) from e
        return TxnId(*row) if row else None

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception as e:  # noqa: BLE001 - closing a broken connection
                log.info("closing the loader's PostgreSQL connection: %s", e)
            self.conn = None


def journal_first(db) -> int:
    segs = list_segments(db.layout.journal)
    return segs[0].first_seqno if segs else db.seqno + 1


def _runs(db, lo: int, hi: int):
    return iter_runs(db.layout.journal, lo, 1 << 20, to_seqno=hi)


def _frames(db, lo: int, hi: int) -> list[tuple[int, bytes]]:
    return [(s, bytes(f)) for run in _runs(db, lo, hi) for s, f in run.frames()]


def _is_timeout(e: Exception) -> bool:
    """A statement or lock timeout (a held lock): the server is up and the write is refused."""
    return getattr(e, "sqlstate", None) in ("57014", "55P03")


def make_loader(maps: dict[str, dict]) -> Loader | None:
    """The loader of a grid's maps (``{map: {"loader": kind, **settings}}``); None if no map has one.
    The policy checked that they share one database."""
    with_loader = {m: s for m, s in maps.items() if s.get("loader")}
    if not with_loader:
        return None
    tables = {m: s.get("table", m) for m, s in with_loader.items()}
    first = next(iter(with_loader.values()))
    kind = first["loader"]
    settings = {k: v for k, v in first.items() if k not in ("loader", "table")}
    if kind == "sqlite":
        return SQLiteLoader(settings["path"], tables, **{k: v for k, v in settings.items() if k != "path"})
    if kind == "postgresql":
        return PostgresLoader(settings["dsn"], tables, **{k: v for k, v in settings.items() if k != "dsn"})
    mod, _, cls = kind.partition(":")
    return getattr(importlib.import_module(mod), cls)(tables=tables, **settings)


def frame_changes(frame: bytes, tables: Iterable[str]) -> list[Change]:
    """The changes of one journal frame to the maps in ``tables``."""
    rec = decode_payload(memoryview(frame)[FRAME_HEADER_SIZE:])
    out: list[Change] = []
    for u in rec.updates:
        if u.region not in tables:
            continue
        if u.op == SET:
            out.append((u.region, key_text(u.key), msgspec.msgpack.decode(u.value) if u.value is not None else None))
        elif u.op in (KILL, ZKILL):
            if u.killed:
                out.extend((u.region, key_text(k), None) for k, _ in u.killed)
            else:
                out.append((u.region, key_text(u.key), None))
    return out


def buffer_frames(buf: ReplicaBuffer, run, voted: bool) -> None:
    """A replica's received frames into its buffer: a sync prepare (``voted``) waits for its outcome,
    committed frames (catch-up, asynchronous) are committed at once."""
    if voted:
        for seqno, f in run.frames():
            buf.receive(TxnId(buf.partition, seqno, digest(f).hex()))
    else:
        buf.outcome(True, run.last_seqno)


_crash = os.environ.get("MULTISITE_GRID_LOADER_CRASH", "")
_crash_point, _, _crash_n = _crash.partition(":")
_crash_count = {"a": 0, "b": 0, "c": 0}


def crash_point(point: str) -> None:
    """SIGKILL this process at ``point`` the N-th time (fault tests only; see the module docstring)."""
    if _crash_point != point:
        return
    _crash_count[point] += 1
    if _crash_count[point] == int(_crash_n or 1):
        log.warning("crash point %s reached: SIGKILL", point)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


class ShardLoader:
    """A primary shard's Loader: its thread, its health, its replay (see the module docstring)."""

    def __init__(self, partition: int, loader: Loader, tables: Iterable[str]) -> None:
        self.partition, self.loader, self.tables = partition, loader, frozenset(tables)
        self.health = LoaderHealth()
        self.ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"loader-p{partition}")
        self.state = "starting"  # starting, replaying, ready, diverged
        self.replayed = 0
        self.replay_s = 0.0
        self.last_id: TxnId | None = None
        self.writes = 0  # batches written through
        self.write_s = 0.0  # their time, hand-off to the loader's thread included

    def txns(self, frames: list[tuple[int, bytes]]) -> list[tuple[TxnId, list[Change]]]:
        return [(TxnId(self.partition, s, digest(f).hex()), frame_changes(f, self.tables)) for s, f in frames]

    async def write(self, frames: list[tuple[int, bytes]]) -> None:
        """Commit a batch's transactions in the database (one database transaction); LoaderError if not."""
        loop = asyncio.get_running_loop()
        if not self.health.may_try(time.monotonic()):
            raise LoaderDown(f"the loader's database is down (next attempt in "
                             f"{self.health.retry_at - time.monotonic():.1f} s): {self.health.last_error}")
        txns = self.txns(frames)
        t0 = time.monotonic()
        try:
            await loop.run_in_executor(self.ex, self.loader.apply, txns)
        except LoaderDown as e:
            if self.health.failures == 0:
                log.warning("partition %d: the loader's database is down: %s", self.partition, e)
            self.health.down(time.monotonic(), str(e))
            raise
        except LoaderRefused as e:
            self.health.refused_write(str(e))
            log.info("partition %d: the database refused a write: %s", self.partition, e)
            raise
        if self.health.failures:
            log.info("partition %d: the loader's database answers again (after %d failed attempt(s))",
                     self.partition, self.health.failures)
        self.health.ok()
        self.writes += 1
        self.write_s += time.monotonic() - t0
        self.last_id = txns[-1][0]

    async def replay(self, db, stopping) -> bool:
        """Before a new primary serves: hand the Loader every journal transaction the database may
        lack, retrying while the database is down (backoff); False if ``stopping()`` ended it or the
        two diverged (the shard then refuses commits)."""
        loop = asyncio.get_running_loop()
        self.state = "replaying"
        t0 = time.monotonic()
        while not stopping():
            try:
                last = await loop.run_in_executor(self.ex, self.loader.last_applied, self.partition)
                lo = max(journal_first(db), last.seqno if last else 1)  # from the database's last id on
                frames = await loop.run_in_executor(None, _frames, db, lo, db.seqno)
                plan = replay_plan(self.partition, last, {s: digest(f).hex() for s, f in frames}, db.seqno,
                                   journal_first(db))
                if plan.kind is ReplayKind.DIVERGED:
                    self.state = "diverged"
                    self.health.last_error = plan.why
                    log.error("partition %d: the loader's database and the shard diverged: %s", self.partition,
                              plan.why)
                    return False
                by_seqno = dict(frames)
                todo = list(plan.txns)
                while todo:  # REPLAY_CHUNK transactions per database transaction; one by one after a refusal
                    chunk, todo = todo[:REPLAY_CHUNK], todo[REPLAY_CHUNK:]
                    txns = self.txns([(t.seqno, by_seqno[t.seqno]) for t in chunk])
                    try:
                        self.replayed += await loop.run_in_executor(self.ex, self.loader.apply, txns)
                        self.last_id = chunk[-1]
                        continue
                    except LoaderRefused:
                        pass
                    refused = await self._replay_one_by_one(db, txns)
                    if refused:
                        break
                self.health.ok()
                self.replay_s = time.monotonic() - t0
                log.info("partition %d: loader replay: %s; %d applied in %.3f s", self.partition, plan.why,
                         self.replayed, self.replay_s)
                self.state = "ready"
                return True
            except LoaderDown as e:
                retry = self.health.down(time.monotonic(), str(e))
                log.warning("partition %d: loader replay waits for the database: %s", self.partition, e)
                await asyncio.sleep(max(0.0, retry - time.monotonic()))
        return False

    async def _replay_one_by_one(self, db, txns) -> bool:
        """True if the database refused one: it and those after it are taken off the shard (never
        acknowledged: the old primary answered no client of them)."""
        loop = asyncio.get_running_loop()
        for tid, changes in txns:
            try:
                self.replayed += await loop.run_in_executor(self.ex, self.loader.apply, [(tid, changes)])
            except LoaderRefused as e:
                log.warning("partition %d: the database refuses buffered transaction %s: %s; the shard "
                            "rolls back to seqno %d", self.partition, tid, e, tid.seqno - 1)
                await loop.run_in_executor(None, functools.partial(
                    db.rollback, tid.seqno - 1, reason=f"the loader's database refused it on failover: {e}"))
                return True
            self.last_id = tid
        return False

    def status(self) -> dict:
        return {"state": self.state, "replayed": self.replayed, "replay_s": round(self.replay_s, 3),
                "batches": self.writes, "batch_ms": round(1000 * self.write_s / self.writes, 3) if self.writes else 0,
                "last_id": str(self.last_id) if self.last_id else None, **self.health.status(time.monotonic())}

    def close(self) -> None:
        self.ex.submit(self.loader.close)
        self.ex.shutdown(wait=False)
