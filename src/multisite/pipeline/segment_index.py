"""The journal index: columnar (Parquet) copies of runs of journal frames, read instead of the frames.

Decoding msgpack in Python is the journal source's main cost, and sealed journal data never changes:
so the first read of a run of frames also writes its rows, every column the source can produce, to a
*piece* ``<instance>/journal/index/<validity key>.parquet`` (see :mod:`multisite.journal.sidecars`
for the key), and later reads of those frames read the piece's columns (only the ones asked for)
instead of decoding. Pieces are a cache: a missing, stale or unreadable piece only costs a decode.

Which runs get a piece: every run read from a sealed segment, and runs of the open (newest)
segment of at least ``index_min_bytes`` (so that a stream polling the tail does not leave a piece
per micro-batch). Pieces never overlap: the planner walks a segment from its start, takes a valid
piece where one begins and cuts the frames between pieces into new runs.

What a piece holds: every journal column but ``instance`` (a read adds it), with the ``fields``
struct typed by the region schemas of the instance when the piece was written (kept in the file's
metadata; a read under other schemas recomputes ``fields`` from ``value_raw``).

Reading a piece does not re-check the frames' payload CRCs (they were checked when it was written);
the option ``index=off`` reads and checks every frame as before.
"""

from __future__ import annotations

import functools

import json
import mmap
import os
import zlib
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ConfigError, JournalCorrupt
from ..fsutil import create_file, make_dir
from ..journal.segments import SEGMENT_HEADER_SIZE
from ..journal.sidecars import Sidecar, index_dir
from . import columns as C
from .decode import (BATCH_ROWS, Chunk, FrameRun, JournalBatchBuilder, fields_column, msgpack_objects,
                     open_segment, read_chunk)

INDEX_MODES = ("auto", "read", "off")  # use and write pieces / only use them / ignore them
INDEX_MIN_BYTES = 8 * 1024 * 1024  # smallest run of the open segment worth a piece
PIECE_ROW_GROUP_ROWS = 65_536
# LZ4 reads about twice as fast as snappy for a similar size; dictionaries only where values repeat
# (elsewhere the writer tries one, gives up and the file gets larger and slower to read).
PIECE_COMPRESSION = "lz4"
PIECE_DICTIONARY_COLUMNS = ["origin", "region", "op"]
_META_KEY = b"multisite.index"

# Every column of the journal source but ``instance``, in the source's order.
PIECE_COLUMNS: dict[str, str] = {n: t for n, t in {**C.JOURNAL_COLUMNS, **C.JOURNAL_EXTRA_COLUMNS}.items()
                                 if n != "instance"}

_KEY_ARROW = pa.list_(pa.field("element", pa.struct([("i", pa.int64()), ("s", pa.string())])))
_ARROW = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(),
          "float": pa.float32(), "boolean": pa.bool_(), "binary": pa.binary(), "date": pa.date32(),
          "timestamp": pa.timestamp("us", tz="UTC"), C.KEY_TYPE: _KEY_ARROW}


def arrow_type(ddl: str) -> pa.DataType:
    """The Arrow type Spark uses for one of our DDL types (what ``to_arrow_schema`` gives)."""
    return _ARROW[ddl]


def piece_schema(fields: dict[str, str]) -> pa.Schema:
    cols = [pa.field(n, arrow_type(t)) for n, t in PIECE_COLUMNS.items()]
    if fields:
        cols.append(pa.field("fields", pa.struct([(f, arrow_type(t)) for f, t in fields.items()])))
    return pa.schema(cols)


def index_fields(region_schemas: dict) -> dict[str, str]:
    """The ``fields`` a piece carries: the union over every region (none if two regions disagree)."""
    try:
        return C.merge_fields(sorted(region_schemas.items()))
    except ConfigError:
        return {}


def piece_fields_serve(meta: dict, region_schemas: dict, fields: dict[str, str]) -> bool:
    """Can the ``fields`` column of a piece written with ``meta`` give a read's typed ``fields``? Only if
    the piece was written under the same region schemas and holds every field asked for, with the type
    asked for: where two regions declare a field with different types the piece has no ``fields`` at
    all, though a read of one of them (option ``regions``) has a ``fields`` column."""
    if meta.get("region_schemas") != region_schemas:
        return False
    stored = meta.get("fields") or {}
    return all(stored.get(f) == t for f, t in fields.items())


def check_mode(mode: str) -> str:
    m = (mode or "auto").lower()
    if m not in INDEX_MODES:
        raise ConfigError(f"option index must be one of {', '.join(INDEX_MODES)}, got {mode!r}")
    return m


# -- writing ------------------------------------------------------------------------------------------
class PieceWriter:
    """Writes the batches of one run to a temporary file, published by :meth:`commit` under the
    run's validity key; :meth:`abort` leaves nothing behind. Failing to write (read-only instance
    directory, full disk) silently disables the writer: a piece is only ever a cache."""

    def __init__(self, journal_dir: str, schema: pa.Schema, meta: dict):
        self.dir = index_dir(Path(journal_dir))
        self.schema = schema.with_metadata({_META_KEY: json.dumps(meta).encode()})
        self.tmp: Path | None = None
        self._w = None
        try:
            make_dir(self.dir)
            self.tmp = create_file(self.dir / f".piece-{os.getpid()}-{id(self):x}.tmp")  # the journal's mode
            self._w = pq.ParquetWriter(self.tmp, self.schema, compression=PIECE_COMPRESSION,
                                       use_dictionary=PIECE_DICTIONARY_COLUMNS)
        except OSError:
            self.abort()

    def write(self, batch: pa.RecordBatch) -> None:
        if self._w is None:
            return
        try:
            self._w.write_batch(batch, row_group_size=PIECE_ROW_GROUP_ROWS)
        except OSError:
            self.abort()

    def commit(self, key: Sidecar) -> None:
        if self._w is None:
            return
        try:
            self._w.close()
            self._w = None
            os.replace(self.tmp, self.dir / key.name)
        except OSError:
            self.abort()

    def abort(self) -> None:
        if self._w is not None:
            try:
                self._w.close()
            except Exception:  # noqa: BLE001 - cleaning up a cache file
                pass
            self._w = None
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def segment_header_crc(buf) -> int:
    return zlib.crc32(buf[:SEGMENT_HEADER_SIZE])


# -- reading ------------------------------------------------------------------------------------------
def check_piece(path: str, segment_path: str) -> None:
    """Raise JournalCorrupt if the segment no longer holds what the piece was made from (it was cut or
    replaced between planning and reading)."""
    key = Sidecar.parse(os.path.basename(path))
    with open_segment(segment_path, key.first if key else 0, key.last if key else 0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            ok = key is not None and key.matches(buf, size) is not None
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()
    if not ok:
        raise JournalCorrupt(f"journal segment {segment_path} changed while it was being read (cut by a rollback or "
                             f"replaced?): frames {key.first if key else '?'}..{key.last if key else '?'} are no "
                             f"longer where they were planned; run the read again", path=segment_path,
                             offset=key.start if key else 0)


@functools.lru_cache(maxsize=4096)
def piece_rows(path: str) -> int:
    """Rows in a piece, from its footer (pieces never change: a new validity key is a new file)."""
    return pq.read_metadata(path).num_rows


def piece_meta(pf: pq.ParquetFile) -> dict:
    md = pf.schema_arrow.metadata or {}
    return json.loads(md.get(_META_KEY, b"{}"))


def _row_groups(pf: pq.ParquetFile, lo: int, hi: int) -> list[int]:
    md = pf.metadata
    col = pf.schema_arrow.get_field_index("seqno")
    out = []
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(col).statistics
        if st is None or not st.has_min_max or (st.max >= lo and st.min <= hi):
            out.append(i)
    return out


def read_piece(path: str, segment_path: str, *, first: int, last: int, piece_first: int, piece_last: int,
               out: "Projector", batch_rows: int, check: bool = True) -> Iterator[pa.RecordBatch]:
    """Rows of seqnos ``first..last`` of a piece, as batches of ``out``'s schema (``check``: that the
    segment still holds what the piece was made from; an archived piece was checked by its CRC)."""
    if check:
        check_piece(path, segment_path)
    pf = pq.ParquetFile(path)
    use_fields = out.fields_from_piece(piece_meta(pf))
    cols = out.source_columns(use_fields, cut=first > piece_first or last < piece_last)
    groups = _row_groups(pf, first, last) if (first > piece_first or last < piece_last) else None
    if groups == []:
        return
    for batch in pf.iter_batches(batch_size=batch_rows, columns=cols, row_groups=groups, use_threads=False):
        b = out.project(batch, first, last, use_fields)
        if b is not None and b.num_rows:
            yield b


class Projector:
    """Turns batches holding (a superset of) the piece columns into batches of the reader's schema:
    keeps seqnos ``first..last`` and the read's regions, adds ``instance``, picks ``fields``."""

    def __init__(self, target: pa.Schema, instance: str, *, regions: frozenset | None,
                 region_schemas: dict, region_fields: dict[str, frozenset], fields: dict[str, str]):
        self.target = target
        self.names = target.names
        self.instance = instance
        self.regions = regions
        self.region_schemas = region_schemas
        self.region_fields = region_fields
        self.fields = fields
        self._inst = None

    def fields_from_piece(self, meta: dict) -> bool:
        """Can the piece's ``fields`` column serve this read (else ``fields`` is made from ``value_raw``)?"""
        return "fields" in self.names and piece_fields_serve(meta, self.region_schemas, self.fields)

    def source_columns(self, use_fields: bool, cut: bool) -> list[str]:
        cols = [n for n in self.names if n not in ("instance", "fields")]
        if "fields" in self.names:
            cols += ["fields"] if use_fields else ["value_raw", "region"]
        if cut:
            cols.append("seqno")
        if self.regions is not None:
            cols.append("region")
        return list(dict.fromkeys(cols))

    def _instance_col(self, n: int) -> pa.Array:
        if self._inst is None or len(self._inst) < n:
            self._inst = pa.array([self.instance] * max(n, 65_536), pa.string())
        return self._inst.slice(0, n)

    def project(self, batch: pa.RecordBatch, first: int, last: int, use_fields: bool) -> pa.RecordBatch | None:
        mask = None
        if "seqno" in batch.schema.names:
            s = batch.column("seqno")
            if len(s) and (pc.min(s).as_py() < first or pc.max(s).as_py() > last):
                mask = pc.and_(pc.greater_equal(s, first), pc.less_equal(s, last))
        if self.regions is not None:
            m = pc.is_in(batch.column("region"), value_set=pa.array(sorted(self.regions), pa.string()))
            mask = m if mask is None else pc.and_(mask, m)
        if mask is not None:
            batch = batch.filter(mask)
        n = batch.num_rows
        if not n:
            return None
        cols = []
        for f in self.target:
            if f.name == "instance":
                a = self._instance_col(n).cast(f.type) if f.type != pa.string() else self._instance_col(n)
            elif f.name == "fields":
                a = self._fields(batch, f.type, use_fields)
            else:
                a = batch.column(f.name)
                if a.type != f.type:
                    a = a.cast(f.type)
            cols.append(a)
        return pa.RecordBatch.from_arrays(cols, schema=self.target)

    def _fields(self, batch: pa.RecordBatch, typ: pa.StructType, use_fields: bool) -> pa.Array:
        if use_fields:
            src = batch.column("fields")
            have = {f.name for f in src.type}
            n = batch.num_rows
            return pa.StructArray.from_arrays(
                [pc.struct_field(src, f.name) if f.name in have else pa.nulls(n, f.type) for f in typ],
                fields=list(typ))
        objs = msgpack_objects(batch.column("value_raw").to_pylist())
        return fields_column(objs, batch.column("region").to_pylist(), self.region_fields, self.fields, typ)


def existing_piece(chunk: Chunk) -> str | None:
    """A valid piece of exactly this chunk's frames written since it was planned (Spark plans a
    DataFrame's partitions once: a DataFrame planned before its journal was indexed reads the pieces
    its first run wrote)."""
    d = index_dir(Path(chunk.path).parent)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return None
    for n in names:
        key = Sidecar.parse(n)
        if (key is not None and key.segment == chunk.segment and key.start == chunk.offset
                and key.first == chunk.first_seqno and key.last == chunk.last_seqno):
            try:
                check_piece(str(d / n), chunk.path)
            except JournalCorrupt:
                continue
            return str(d / n)
    return None


def index_chunk(chunk: Chunk, target: pa.Schema, *, regions: frozenset | None, region_schemas: dict,
                fields: dict[str, str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Decode a chunk into every piece column, write them as a new piece, and yield the rows the
    read asked for (``target``'s columns, ``regions``)."""
    pfields = index_fields(region_schemas)
    schema = piece_schema(pfields)
    rf = {r: frozenset(fs) for r, fs in region_schemas.items()}
    builder = JournalBatchBuilder(chunk.instance, schema, region_fields=rf, fields=pfields)
    out = Projector(target, chunk.instance, regions=regions, region_schemas=region_schemas, region_fields=rf,
                    fields=fields)
    meta = {"format": 1, "region_schemas": region_schemas, "fields": pfields}
    use_fields = out.fields_from_piece(meta)
    writer = PieceWriter(str(Path(chunk.path).parent), schema, meta)
    run = FrameRun()
    done = False
    try:
        for batch in read_chunk(chunk, builder, batch_rows=batch_rows, run=run):
            writer.write(batch)
            b = out.project(batch, chunk.first_seqno, chunk.last_seqno, use_fields)
            if b is not None:
                yield b
        done = True
    finally:
        if done:
            writer.commit(Sidecar(chunk.segment, chunk.offset, run.last_offset, chunk.first_seqno,
                                  chunk.last_seqno, run.header_crc, run.last_crc))
        else:
            writer.abort()


def chunk_batches(chunk: Chunk, target: pa.Schema, *, regions: frozenset | None, region_schemas: dict,
                  fields: dict[str, str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The rows of one chunk as batches of ``target``: from its piece, or decoded (writing a piece if
    the chunk asks for one)."""
    rf = {r: frozenset(fs) for r, fs in region_schemas.items()}
    if chunk.archived:  # fetched (once per machine) and checked by CRC; archived files never change
        from .archive import local_files

        chunk = local_files(chunk)
    piece = chunk.piece or (existing_piece(chunk) if chunk.write_piece else None)
    if piece:
        out = Projector(target, chunk.instance, regions=regions, region_schemas=region_schemas, region_fields=rf,
                        fields=fields)
        yield from read_piece(piece, chunk.path, first=chunk.first_seqno, last=chunk.last_seqno,
                              piece_first=chunk.piece_first or chunk.first_seqno,
                              piece_last=chunk.piece_last or chunk.last_seqno, out=out, batch_rows=batch_rows,
                              check=not chunk.archived)
    elif chunk.write_piece:
        yield from index_chunk(chunk, target, regions=regions, region_schemas=region_schemas, fields=fields,
                               batch_rows=batch_rows)
    else:
        builder = JournalBatchBuilder(chunk.instance, target, regions=regions, region_fields=rf, fields=fields)
        yield from read_chunk(chunk, builder, batch_rows=batch_rows)


def journal_schema(columns: list[str], fields: dict[str, str]) -> pa.Schema:
    """The Arrow schema of the source's ``columns`` (as Spark would give it) without Spark."""
    every = {**C.JOURNAL_COLUMNS, **C.JOURNAL_EXTRA_COLUMNS}
    out = []
    for n in columns:
        if n == "fields":
            out.append(pa.field("fields", pa.struct([(f, arrow_type(t)) for f, t in fields.items()])))
        else:
            out.append(pa.field(n, arrow_type(every[n])))
    return pa.schema(out)


def index_state(journal_dir: str) -> dict:
    """How much of a journal has pieces: ``{"pieces": n, "bytes": piece bytes, "frames": frames}``."""
    d = index_dir(Path(journal_dir))
    n = size = frames = 0
    for p in (d.glob("*.parquet") if d.exists() else []):
        key = Sidecar.parse(p.name)
        if key is not None:
            n += 1
            size += p.stat().st_size
            frames += key.last - key.first + 1
    return {"pieces": n, "bytes": size, "frames": frames}
