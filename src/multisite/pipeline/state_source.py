"""An instance's materialized state as a Spark data source: ``spark.read.format("multisite_state")``.

One row per key of every region (``columns.STATE_COLUMNS``; ``key_bytes`` on request), read from the
SQLite store through read-only connections, one partition per key range of about
``rows_per_partition`` keys. ``seqno`` is the store's applied seqno: the state is as of that seqno.

Every partition must see the same committed state. A closed instance cannot change under us; for a
live one (its lock is held) the reader first copies the store with SQLite's backup API (a consistent
snapshot) and reads the copy (option ``store_file`` names an existing copy instead). Options:
``regions`` (comma-separated), ``rows_per_partition``.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..instance.layout import Layout, is_locked
from ..keys import decode_key
from . import columns as C
from .decode import fields_column, json_column, key_column, key_text_column
from .plan import fields_for, instance_refs, region_filter
from .source import _arrow_schema, _check_schema, _int_option

ROWS_PER_PARTITION = 500_000
FETCH_ROWS = 65_536
_mdec = msgspec.msgpack.decode


@dataclass(frozen=True)
class KeyRange:
    instance: str
    store_file: str
    seqno: int
    region: str
    region_id: int
    lo: bytes | None
    hi: bytes | None


class RangePartition(InputPartition):
    def __init__(self, rng: KeyRange, region_fields: tuple, fields: dict):
        super().__init__(rng.region)
        self.rng = rng
        self.region_fields = region_fields
        self.fields = fields


def consistent_store(layout: Layout) -> str:
    """The store file to read: the store itself, or a backup copy if the instance is live."""
    if not is_locked(layout):
        return str(layout.store_file)
    dest = Path(tempfile.gettempdir()) / f"multisite-state-{uuid.uuid4().hex}.sqlite"
    src = sqlite3.connect(f"file:{layout.store_file}?mode=ro", uri=True)
    dst = sqlite3.connect(str(dest))
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return str(dest)


def _ro(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def plan_ranges(instance: str, store_file: str, regions: frozenset | None, rows_per_part: int) -> list[KeyRange]:
    conn = _ro(store_file)
    try:
        row = conn.execute("SELECT v FROM meta WHERE k='applied_seqno'").fetchone()
        seqno = row[0] if row else 0
        out = []
        for rid, name in conn.execute("SELECT id, name FROM regions ORDER BY name").fetchall():
            if regions is not None and name not in regions:
                continue
            n = conn.execute("SELECT count(*) FROM kv WHERE r=?", (rid,)).fetchone()[0]
            if n == 0:
                continue
            bounds: list[bytes | None] = [None]
            for i in range(1, -(-n // rows_per_part)):
                k = conn.execute("SELECT k FROM kv WHERE r=? ORDER BY k LIMIT 1 OFFSET ?",
                                 (rid, i * rows_per_part)).fetchone()
                if k:
                    bounds.append(k[0])
            bounds.append(None)
            for lo, hi in zip(bounds, bounds[1:]):
                out.append(KeyRange(instance, store_file, seqno, name, rid, lo, hi))
        return out
    finally:
        conn.close()


def read_range(part: RangePartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    r = part.rng
    conn = _ro(r.store_file)
    try:
        sql, args = "SELECT k, v FROM kv WHERE r=?", [r.region_id]
        if r.lo is not None:
            sql, args = sql + " AND k>=?", args + [r.lo]
        if r.hi is not None:
            sql, args = sql + " AND k<?", args + [r.hi]
        cur = conn.execute(sql + " ORDER BY k", args)
        rf = {r.region: frozenset(part.region_fields)}
        while True:
            rows = cur.fetchmany(FETCH_ROWS)
            if not rows:
                return
            yield _state_batch(r, rows, schema, rf, part.fields)
    finally:
        conn.close()


def _state_batch(r: KeyRange, rows: list, schema: pa.Schema, rf: dict, fields: dict) -> pa.RecordBatch:
    n = len(rows)
    kbs = [k for k, _ in rows]
    vbs = [v for _, v in rows]
    keys = None
    objs = None
    cols = []
    for f in schema:
        name, typ = f.name, f.type
        if name in ("key", "key_text") and keys is None:
            keys = [decode_key(k) for k in kbs]
        if name in ("value", "fields") and objs is None:
            objs = [_mdec(v) for v in vbs]
        if name == "instance":
            a = pa.array([r.instance] * n, typ)
        elif name == "seqno":
            a = pa.array([r.seqno] * n, typ)
        elif name == "region":
            a = pa.array([r.region] * n, typ)
        elif name == "key":
            a = key_column(keys, typ)
        elif name == "key_text":
            a = key_text_column(keys, typ)
        elif name == "key_bytes":
            a = pa.array(kbs, typ)
        elif name == "value":
            a = json_column(vbs, typ, objs)
        elif name == "value_raw":
            a = pa.array(vbs, typ)
        elif name == "value_size":
            a = pa.array([len(v) for v in vbs], typ)
        elif name == "fields":
            a = fields_column(objs, [r.region] * n, rf, fields, typ)
        else:
            raise AssertionError(name)
        cols.append(a)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


class StateDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "multisite_state"

    def _refs(self):
        if not hasattr(self, "_refs_cache"):
            self._refs_cache = instance_refs(self.options)
        return self._refs_cache

    def schema(self) -> str:
        return C.ddl(C.STATE_COLUMNS, fields_for(self._refs(), region_filter(self.options)))

    def reader(self, schema) -> "StateReader":
        return StateReader(self.options, schema, self._refs())


class StateReader(DataSourceReader):
    def __init__(self, options, schema, refs):
        self.schema = schema
        self.refs = refs
        self.regions = region_filter(options)
        self.fields = fields_for(refs, self.regions)
        _check_schema(schema, {**C.STATE_COLUMNS, **C.STATE_EXTRA_COLUMNS}, self.fields)
        self.rows_per_part = _int_option(options, "rows_per_partition", ROWS_PER_PARTITION)
        files = json.loads(options["store_files"]) if options.get("store_files") else {}
        self.store_files = {ref.name: files.get(ref.name) or consistent_store(Layout.existing(ref.path))
                            for ref in refs}

    def partitions(self):
        parts = []
        for ref in self.refs:
            for rng in plan_ranges(ref.name, self.store_files[ref.name], self.regions, self.rows_per_part):
                parts.append(RangePartition(rng, tuple(ref.region_schemas.get(rng.region, {})), self.fields))
        return parts

    def read(self, partition):
        if not isinstance(partition, RangePartition):  # a plan of no partitions: Spark reads one of its own
            return iter(())
        return read_range(partition, _arrow_schema(self.schema))
