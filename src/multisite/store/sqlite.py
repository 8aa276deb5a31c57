"""The materialized state in SQLite (WAL mode), behind a narrow interface.

The journal is the truth; the store is a cache of it that recovery rolls forward. So the store keeps
one long SQLite transaction open and commits it in batches (``flush``), recording in the same commit
the last applied seqno overall and per region. The engine only flushes after the journal is hardened
up to that seqno, so the store is never ahead of the journal.

Tables: ``regions`` (id, name, replicated, seqno, schema) and ``kv`` (region id, encoded key, msgpack
value), keys in a BLOB primary key whose byte order is the key order (see ``multisite.keys``).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..errors import MultisiteError, StorageFull, StoreCorrupt, StoreLost
from ..fsutil import create_file, make_dir
from ..keys import KILL_END

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS regions (
    id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, replicated INTEGER NOT NULL,
    seqno INTEGER NOT NULL DEFAULT 0, schema TEXT);
CREATE TABLE IF NOT EXISTS kv (r INTEGER NOT NULL, k BLOB NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (r, k)) WITHOUT ROWID;
"""


_MAX_ROWS = 256  # rows per multi-row INSERT (768 parameters)
_EXACT_ROWS = 32  # up to this many rows go in one INSERT of their count (32 texts more in the statement cache)


@functools.lru_cache(maxsize=None)
def _insert_sql(n: int) -> str:
    return "INSERT OR REPLACE INTO kv VALUES " + ",".join(["(?, ?, ?)"] * n)


@functools.lru_cache(maxsize=512)
def _select_sql(n: int) -> str:
    return f"SELECT k, v FROM kv WHERE r=? AND k IN ({','.join('?' * n)})"


@dataclass
class RegionInfo:
    id: int
    name: str
    replicated: bool
    seqno: int
    schema: str | None = None


class Store:
    def __init__(self, path: Path):
        make_dir(path.parent)
        create_file(path)  # 0600, not SQLite's 0644; SQLite gives its -wal and -shm files the database's mode
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self.lost: StoreLost | None = None  # set when SQLite dropped the open transaction (see _failed)
        try:
            self._open(path)
        except sqlite3.DatabaseError as e:
            if self.conn is not None:
                self.conn.close()
            if (getattr(e, "sqlite_errorcode", 0) & 0xFF) not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                # busy, locked, cannot open, I/O: not a damaged file, and not to be moved aside
                raise MultisiteError(f"the store {path} cannot be opened ({e})") from None
            raise StoreCorrupt(
                f"the store {path} cannot be read ({e}). It is a cache of the journal: move it (with its -wal "
                f"and -shm files) aside and open the instance again to rebuild it from the journal, which "
                f"works when the journal reaches back to seqno 1 (unreplicated regions are not journaled and "
                f"are lost); otherwise restore the instance from a backup") from None

    def _open(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                                    cached_statements=256)
        c = self.conn
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA cache_size=-262144")  # 256 MiB page cache
        c.execute("PRAGMA temp_store=MEMORY")
        c.executescript(SCHEMA)
        self.regions: dict[str, RegionInfo] = {}
        for rid, name, repl, seqno, schema in c.execute("SELECT id, name, replicated, seqno, schema FROM regions"):
            self.regions[name] = RegionInfo(rid, name, bool(repl), seqno, schema)
        row = c.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
        self.applied_seqno: int = row[0] if row else 0
        self.stream_seqnos: dict[int, int] = self._load_streams()
        self.flushed_seqno = self.applied_seqno
        self._dirty_regions: set[str] = set()
        self._in_txn = False
        self.dirty = False

    # -- transactions ----------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._in_txn:
            self.conn.execute("BEGIN")
            self._in_txn = True
        self.dirty = True

    def _failed(self, e: sqlite3.Error) -> NoReturn:
        """Raise what an error of SQLite inside the open transaction means. When SQLite answered it by
        rolling that transaction back by itself (SQLITE_FULL, SQLITE_IOERR, ...), every change since
        the last flush is gone, while the engine would go on as if they were there, and a later flush
        would record an applied seqno over rows that are not: the store then refuses all work
        (StoreLost); the journal holds the changes, and reopening the instance rolls the store forward
        from it. A full disk that undid only the failing statement is StorageFull, like a full journal.
        (A try in each method rather than a decorator: no call added to the commit's hot path.)"""
        if self._in_txn and not self.conn.in_transaction:
            self.lost = StoreLost(
                f"SQLite rolled back the open transaction of the store {self.path} after '{e}' (a full "
                f"disk?): its changes since the last flush are gone from the store, though every committed "
                f"one is in the journal. Close the instance and open it again once the cause is fixed: "
                f"recovery rolls the store forward from the journal")
            raise self.lost from e
        if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:  # only the statement was undone
            raise StorageFull(f"the store {self.path} is full ({e}): the statement that failed was undone; "
                              f"free space and try again") from e
        raise e

    def flush(self) -> None:
        """Commit everything applied so far (the caller made sure the journal is hard up to here)."""
        if self.lost is not None:
            raise self.lost
        try:
            if not self._in_txn:
                return
            c = self.conn
            c.execute("INSERT OR REPLACE INTO meta VALUES ('applied_seqno', ?)", (self.applied_seqno,))
            if self.stream_seqnos:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('stream_seqnos', ?)",
                          (json.dumps({str(k): v for k, v in self.stream_seqnos.items()}),))
            for name in self._dirty_regions:
                r = self.regions[name]
                c.execute("UPDATE regions SET seqno=? WHERE id=?", (r.seqno, r.id))
            self._dirty_regions.clear()
            c.execute("COMMIT")
            self._in_txn = False
            self.dirty = False
            self.flushed_seqno = self.applied_seqno
        except sqlite3.Error as e:
            self._failed(e)

    # -- savepoints: undo one commit without losing the rest of the open transaction ------------
    def savepoint(self, name: str) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            self.conn.execute(f"SAVEPOINT {name}")
        except sqlite3.Error as e:
            self._failed(e)

    def release(self, name: str) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            self.conn.execute(f"RELEASE {name}")
        except sqlite3.Error as e:
            self._failed(e)

    def rollback_to(self, name: str) -> None:
        """Undo everything since ``savepoint(name)``; regions created since are forgotten too."""
        if self.lost is not None:
            raise self.lost
        try:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            known = {rid for (rid,) in self.conn.execute("SELECT id FROM regions")}
            for n in [n for n, r in self.regions.items() if r.id not in known]:
                del self.regions[n]
                self._dirty_regions.discard(n)
        except sqlite3.Error as e:
            self._failed(e)

    def positions(self) -> tuple:
        return self.applied_seqno, {n: r.seqno for n, r in self.regions.items()}, set(self._dirty_regions)

    def restore_positions(self, pos: tuple) -> None:
        self.applied_seqno = pos[0]
        for n, r in self.regions.items():
            r.seqno = pos[1].get(n, 0)
        self._dirty_regions = set(pos[2]) & set(self.regions)

    def _load_streams(self) -> dict[int, int]:
        """SI: the last seqno received per stream (1..15), as of the last flush."""
        row = self.conn.execute("SELECT v FROM meta WHERE k='stream_seqnos'").fetchone()
        return {int(k): v for k, v in json.loads(row[0]).items()} if row else {}

    def close(self) -> None:
        if self.lost is None:  # else nothing may be flushed: the journal has it all
            self.flush()
        self.conn.close()

    def abandon(self) -> None:
        """Close without committing (an open that failed half way): the journal has it all."""
        self.conn.close()

    # -- regions ---------------------------------------------------------------------------------
    def create_region(self, name: str, replicated: bool, schema: str | None = None) -> RegionInfo:
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            cur = self.conn.execute("INSERT INTO regions (name, replicated, schema) VALUES (?, ?, ?)",
                                    (name, int(replicated), schema))
            info = RegionInfo(cur.lastrowid, name, replicated, 0, schema)
            self.regions[name] = info
            return info
        except sqlite3.Error as e:
            self._failed(e)

    def cut_positions(self, seqno: int) -> None:
        """The store now stands at ``seqno`` (a rollback undid what came after): the next flush
        records it, and no region's seqno past it."""
        for r in self.regions.values():
            if r.seqno > seqno:
                r.seqno = seqno
                self._dirty_regions.add(r.name)
        self.applied_seqno = seqno
        self.touch()

    def touch(self) -> None:
        """Make the next flush commit the positions (applied seqno, stream seqnos) even if no row changed."""
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
        except sqlite3.Error as e:
            self._failed(e)

    def mark_applied(self, seqno: int, region_names) -> None:
        self.applied_seqno = seqno
        for name in region_names:
            self.regions[name].seqno = seqno
            self._dirty_regions.add(name)

    # -- data ------------------------------------------------------------------------------------
    def get(self, rid: int, kb: bytes) -> bytes | None:
        if self.lost is not None:
            raise self.lost
        try:
            row = self.conn.execute("SELECT v FROM kv WHERE r=? AND k=?", (rid, kb)).fetchone()
            return row[0] if row else None
        except sqlite3.Error as e:
            self._failed(e)

    def get_many(self, rid: int, kbs: list[bytes]) -> dict[bytes, bytes]:
        if self.lost is not None:
            raise self.lost
        try:
            if len(kbs) == 1:
                row = self.conn.execute("SELECT v FROM kv WHERE r=? AND k=?", (rid, kbs[0])).fetchone()
                return {kbs[0]: row[0]} if row else {}
            out: dict[bytes, bytes] = {}
            for i in range(0, len(kbs), 500):
                chunk = kbs[i : i + 500]
                out.update(self.conn.execute(_select_sql(len(chunk)), (rid, *chunk)).fetchall())
            return out
        except sqlite3.Error as e:
            self._failed(e)

    def put_many(self, rid: int, rows: list[tuple[bytes, bytes]]) -> None:
        self.put_values(rid, dict(rows))

    def put_values(self, rid: int, values: dict[bytes, bytes]) -> None:
        """Write ``{key: value}`` into region ``rid``."""
        if self.lost is not None:
            raise self.lost
        try:
            if len(values) == 1:  # a single-update commit: the common case
                self.put(rid, *next(iter(values.items())))
            else:
                self._begin()
                self._insert([x for k, v in values.items() for x in (rid, k, v)])
        except sqlite3.Error as e:
            self._failed(e)

    def put_rows(self, rows: list[tuple[int, bytes, bytes]]) -> None:
        """Bulk ``(region id, key, value)`` writes, in order (recovery)."""
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            last = {(r, k): v for r, k, v in rows}  # a key written twice keeps the last
            self._insert([x for (r, k), v in last.items() for x in (r, k, v)])
        except sqlite3.Error as e:
            self._failed(e)

    def _insert(self, flat: list) -> None:
        """Write rows given as ``[rid, key, value, rid, key, value, ...]`` (one row per key) with
        multi-row statements: a third less time per row than executemany, which steps once per row."""
        i, left = 0, len(flat) // 3
        if 0 < left <= _EXACT_ROWS:  # a streamed batch's few rows: one statement (a text per count, cached)
            self.conn.execute(_insert_sql(left), flat)
            return
        while left:  # chunks of power-of-two sizes (100 = 64 + 32 + 4): few SQL texts, all cached
            n = min(_MAX_ROWS, 1 << (left.bit_length() - 1))
            self.conn.execute(_insert_sql(n), flat[i : i + 3 * n])
            i, left = i + 3 * n, left - n

    def put(self, rid: int, kb: bytes, vb: bytes) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            self.conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (rid, kb, vb))
        except sqlite3.Error as e:
            self._failed(e)

    def delete_many(self, rid: int, kbs: list[bytes]) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            if kbs:
                self._begin()
                self.conn.executemany("DELETE FROM kv WHERE r=? AND k=?", [(rid, k) for k in kbs])
        except sqlite3.Error as e:
            self._failed(e)

    def delete(self, rid: int, kb: bytes) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            self.conn.execute("DELETE FROM kv WHERE r=? AND k=?", (rid, kb))
        except sqlite3.Error as e:
            self._failed(e)

    def subtree(self, rid: int, kb: bytes) -> list[tuple[bytes, bytes]]:
        if self.lost is not None:
            raise self.lost
        try:
            return self.conn.execute("SELECT k, v FROM kv WHERE r=? AND k>=? AND k<? ORDER BY k",
                                     (rid, kb, kb + KILL_END)).fetchall()
        except sqlite3.Error as e:
            self._failed(e)

    def delete_subtree(self, rid: int, kb: bytes) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            self._begin()
            self.conn.execute("DELETE FROM kv WHERE r=? AND k>=? AND k<?", (rid, kb, kb + KILL_END))
        except sqlite3.Error as e:
            self._failed(e)

    def page(self, rid: int, lo: bytes, stop: bytes | None, limit: int, *, inclusive: bool = True
             ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` rows in key order from ``lo`` (inclusive or not) to ``stop`` (exclusive)."""
        if self.lost is not None:  # the store no longer holds what was acknowledged
            raise self.lost
        op = ">=" if inclusive else ">"
        if stop is None:
            return self.conn.execute(f"SELECT k, v FROM kv WHERE r=? AND k{op}? ORDER BY k LIMIT ?",
                                     (rid, lo, limit)).fetchall()
        return self.conn.execute(f"SELECT k, v FROM kv WHERE r=? AND k{op}? AND k<? ORDER BY k LIMIT ?",
                                 (rid, lo, stop, limit)).fetchall()

    def count(self, rid: int) -> int:
        if self.lost is not None:  # the store no longer holds what was acknowledged
            raise self.lost
        return self.conn.execute("SELECT count(*) FROM kv WHERE r=?", (rid,)).fetchone()[0]
