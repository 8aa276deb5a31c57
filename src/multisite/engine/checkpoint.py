"""Checkpoint copy: an instance's state at its store's seqno, read while it keeps committing, and a new
instance made from it (the grid brings a new replica shard online so, seed 002 "The memory cost of
replication").

**Reading** (``read_state``) opens the store file read-only in a SQLite read transaction: WAL mode
gives that connection the state as of its first read (a consistent state at the store's applied
seqno C) while the instance goes on committing through its own connection. Rows are streamed in
batches, so the reader's memory is one batch, whatever the partition's size; transactions committed
during the copy are not held in memory either: they stay in the journal, which the replica replays
from C + 1 after the copy (WAL pages behind the reader's snapshot wait on disk until it ends).

**Installing** (``install_state``) creates an instance whose store holds the rows, whose journal
starts at C + 1 and whose instance file says it is at C: the frames after C then apply to it as to
any replica (``Database.apply_frames``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import StoreCorrupt
from ..instance import instance_file as ifile
from ..instance.layout import Layout
from ..journal.writer import create_segment
from ..store.sqlite import Store
from .database import create

Row = tuple[str, bytes, bytes]  # (region, encoded key, encoded value)


class StateReader:
    """The consistent state of a live instance's store (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        row = conn.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
        self.seqno = int(row[0]) if row else 0
        self._names = {}
        self.regions: dict[str, tuple[bool, str | None]] = {}
        for rid, name, replicated, schema in conn.execute("SELECT id, name, replicated, schema FROM regions"):
            self.regions[name] = (bool(replicated), schema)
            if replicated:
                self._names[rid] = name
        ids = ",".join(str(i) for i in self._names) or "NULL"
        self.keys = conn.execute(f"SELECT count(*) FROM kv WHERE r IN ({ids})").fetchone()[0]

    def batches(self, rows_per_batch: int = 5000) -> Iterator[list[Row]]:
        """The replicated regions' rows (unreplicated ones are each instance's own), in key order."""
        names = self._names
        cur = self._conn.execute(f"SELECT r, k, v FROM kv WHERE r IN ({','.join(map(str, names)) or 'NULL'}) "
                                 f"ORDER BY r, k")
        while True:
            rows = cur.fetchmany(rows_per_batch)
            if not rows:
                return
            yield [(names[r], k, v) for r, k, v in rows]


@contextmanager
def read_state(path: str | Path) -> Iterator[StateReader]:
    """The state of the instance at ``path`` as of now (its store's applied seqno), consistent while
    the instance commits on; call ``Database.flush`` first for a recent seqno."""
    lay = Layout.existing(path)
    conn = sqlite3.connect(f"file:{lay.store_file}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("BEGIN")
        try:
            yield StateReader(conn)
        except sqlite3.DatabaseError as e:
            raise StoreCorrupt(f"the store {lay.store_file} cannot be read for a checkpoint: {e}") from None
        finally:
            conn.execute("COMMIT")
    finally:
        conn.close()


def install_state(path: str | Path, name: str, *, group: str, durability: str, seqno: int,
                  regions: dict[str, tuple[bool, str | None]], batches: Iterable[list[Row]],
                  role: str = "secondary") -> int:
    """Create instance ``name`` at ``path`` holding ``batches``' rows as its state at ``seqno``; the
    number of keys written. The journal starts at ``seqno + 1``."""
    root = create(path, name, group=group, durability=durability)
    lay = Layout.existing(root)
    for seg in lay.journal.glob("*.msj"):
        seg.unlink()
    create_segment(lay.journal, 1, seqno + 1, 0)
    store = Store(lay.store_file)
    keys = 0
    try:
        rids = {n: store.create_region(n, repl, schema).id for n, (repl, schema) in sorted(regions.items())}
        for batch in batches:
            store.put_rows([(rids[r], k, v) for r, k, v in batch])
            keys += len(batch)
        store.mark_applied(seqno, [n for n, (repl, _) in regions.items() if repl])
        store.touch()
        store.flush()
    finally:
        store.close()
    inst = ifile.load(lay.instance_file)
    inst.seqno = seqno
    inst.role = role
    ifile.save(lay.instance_file, inst)
    return keys
