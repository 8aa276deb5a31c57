"""Journal frames -> Arrow record batches: the hot path of the Spark source (no pyspark here).

How it stays fast: the per-update loop only gathers the decoded objects it is handed by msgspec
(region, op, key, value bytes, ...) into plain lists; every output column is then built from those
lists at batch end, either vectorized (numpy ``repeat`` for the per-transaction columns, Arrow
``take`` for ``op``, Arrow compute for the key text brackets) or by one list comprehension over a
C-level codec call (msgpack -> JSON). A column that the reader's schema does not name is not built.

A chunk is a run of frames in one segment: ``[first_seqno, last_seqno]`` starting at a byte offset
found at planning time by walking headers. Reading checks every frame again (header CRC, payload CRC,
seqno continuity), and a damaged frame is ``JournalCorrupt`` naming the file and offset.
"""

from __future__ import annotations

import mmap
import os
import zlib
from dataclasses import dataclass
from typing import Iterator

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import JournalCorrupt
from ..journal.records import FRAME_HEADER_SIZE, KILL, decode_payload, parse_header
from ..keys import encode_key
from .columns import COERCE

BATCH_ROWS = 65_536  # updates per Arrow batch handed to Spark

_mdec = msgspec.msgpack.decode
_jenc = msgspec.json.encode
_OPS = pa.array([None, "set", "kill", "zkill"], pa.string())


@dataclass(frozen=True)
class Chunk:
    """Frames ``first_seqno..last_seqno`` of one segment, the first at byte ``offset``."""

    instance: str
    path: str
    offset: int
    first_seqno: int
    last_seqno: int


def _key_text_column(keys: list, typ: pa.DataType) -> pa.Array:
    arr = pa.array([_jenc(k) for k in keys], pa.binary()).cast(pa.string())
    arr = pc.utf8_replace_slice(arr, start=0, stop=1, replacement="(")
    arr = pc.utf8_replace_slice(arr, start=-1, stop=2**31 - 1, replacement=")")
    return arr.cast(typ) if arr.type != typ else arr


def key_column(keys: list, typ: pa.DataType) -> pa.Array:
    """``array<struct<i: bigint, s: string>>``: one struct per subscript, the other field NULL."""
    lens = np.fromiter((len(k) for k in keys), dtype=np.int32, count=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    parts = [p for k in keys for p in k]
    struct_t = typ.value_type
    ints = pa.array([p if type(p) is int else None for p in parts], struct_t.field("i").type)
    strs = pa.array([p if type(p) is str else None for p in parts], struct_t.field("s").type)
    child = pa.StructArray.from_arrays([ints, strs], fields=list(struct_t))
    return pa.ListArray.from_arrays(pa.array(offsets), child, type=typ)


def key_text_column(keys: list, typ: pa.DataType = pa.string()) -> pa.Array:
    return _key_text_column(keys, typ)


def json_column(blobs: list, typ: pa.DataType) -> pa.Array:
    return pa.array([None if b is None else _jenc(_mdec(b)) for b in blobs], pa.binary()).cast(typ)


def fields_column(objs: list, regions: list, region_fields: dict[str, frozenset], fields: dict[str, str],
                  typ: pa.StructType) -> pa.Array:
    """Typed columns of the declared fields; NULL where the region does not declare the field."""
    arrays = []
    for f in typ:
        coerce = COERCE[fields[f.name]]
        vals = [coerce(o.get(f.name)) if type(o) is dict and f.name in region_fields.get(r, ()) else None
                for o, r in zip(objs, regions)]
        arrays.append(pa.array(vals, f.type))
    return pa.StructArray.from_arrays(arrays, fields=list(typ))


class JournalBatchBuilder:
    """Accumulates decoded records and emits Arrow batches with the columns of ``schema``."""

    def __init__(self, instance: str, schema: pa.Schema, *, regions: frozenset | None = None,
                 region_fields: dict[str, frozenset] | None = None, fields: dict[str, str] | None = None):
        self.instance = instance
        self.schema = schema
        self.names = set(schema.names)
        self.regions = regions
        self.region_fields = region_fields or {}
        self.fields = fields or {}
        self._reset()

    def _reset(self) -> None:
        self.t_seqno: list[int] = []
        self.t_stream: list[int] = []
        self.t_sseq: list[int] = []
        self.t_origin: list[str] = []
        self.t_time: list[float] = []
        self.t_crc: list[int] = []
        self.t_count: list[int] = []
        self.u_ord: list[int] = []
        self.u_region: list[str] = []
        self.u_op: list[int] = []
        self.u_key: list[tuple] = []
        self.u_value: list = []
        self.u_before: list = []
        self.rows = 0

    def add(self, rec, crc: int = 0) -> None:
        ups = rec.updates
        rf = self.regions
        if rf is None:
            n = len(ups)
            self.u_ord.extend(range(n))
            self.u_region.extend([u.region for u in ups])
            self.u_op.extend([u.op for u in ups])
            self.u_key.extend([u.key for u in ups])
            self.u_value.extend([u.value for u in ups])
            self.u_before.extend([u.killed if u.op == KILL else u.before for u in ups])
        else:
            sel = [(i, u) for i, u in enumerate(ups) if u.region in rf]
            n = len(sel)
            if not n:
                return
            self.u_ord.extend([i for i, _ in sel])
            self.u_region.extend([u.region for _, u in sel])
            self.u_op.extend([u.op for _, u in sel])
            self.u_key.extend([u.key for _, u in sel])
            self.u_value.extend([u.value for _, u in sel])
            self.u_before.extend([u.killed if u.op == KILL else u.before for _, u in sel])
        self.t_seqno.append(rec.seqno)
        self.t_stream.append(rec.stream)
        self.t_sseq.append(rec.stream_seqno)
        self.t_origin.append(rec.origin)
        self.t_time.append(rec.time)
        self.t_crc.append(crc)
        self.t_count.append(n)
        self.rows += n

    def _per_txn(self, values: list, dtype) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=dtype), self.t_count)

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        n = self.rows
        cols = []
        objs = None
        for f in self.schema:
            name, typ = f.name, f.type
            if name == "instance":
                a = pa.array([self.instance] * n, typ)
            elif name == "seqno":
                a = pa.array(self._per_txn(self.t_seqno, np.int64), typ)
            elif name == "stream":
                a = pa.array(self._per_txn(self.t_stream, np.int32), typ)
            elif name == "stream_seqno":
                a = pa.array(self._per_txn(self.t_sseq, np.int64), typ)
            elif name == "txn_crc":
                a = pa.array(self._per_txn(self.t_crc, np.int64), typ)
            elif name == "origin":
                idx = np.repeat(np.arange(len(self.t_origin)), self.t_count)
                a = pa.array(self.t_origin, typ).take(pa.array(idx))
            elif name == "commit_time":
                us = np.round(np.asarray(self.t_time, dtype=np.float64) * 1e6).astype(np.int64)
                a = pa.array(np.repeat(us, self.t_count), pa.int64()).cast(typ)
            elif name == "ord":
                a = pa.array(self.u_ord, typ)
            elif name == "region":
                a = pa.array(self.u_region, typ)
            elif name == "op":
                a = _OPS.take(pa.array(self.u_op, pa.int8())).cast(typ)
            elif name == "key":
                a = key_column(self.u_key, typ)
            elif name == "key_text":
                a = _key_text_column(self.u_key, typ)
            elif name == "key_bytes":
                a = pa.array([encode_key(k) for k in self.u_key], typ)
            elif name == "value":
                if objs is None and "fields" in self.names:
                    objs = [None if v is None else _mdec(v) for v in self.u_value]
                if objs is not None:
                    a = pa.array([None if o is None and v is None else _jenc(o)
                                  for o, v in zip(objs, self.u_value)], pa.binary()).cast(typ)
                else:
                    a = json_column(self.u_value, typ)
            elif name == "value_raw":
                a = pa.array(self.u_value, typ)
            elif name == "value_size":
                a = pc.binary_length(pa.array(self.u_value, pa.binary())).cast(typ)
            elif name == "before":
                a = pa.array([_before_json(b) for b in self.u_before], pa.binary()).cast(typ)
            elif name == "before_raw":
                a = pa.array([_before_raw(b) for b in self.u_before], typ)
            elif name == "fields":
                if objs is None:
                    objs = [None if v is None else _mdec(v) for v in self.u_value]
                a = fields_column(objs, self.u_region, self.region_fields, self.fields, typ)
            else:  # the source checks names at planning; this is a bug
                raise AssertionError(f"unknown column {name}")
            cols.append(a)
        self._reset()
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def _before_json(b):
    if b is None:
        return None
    if type(b) is bytes:
        return _jenc(_mdec(b))
    return _jenc([[k, _mdec(v)] for k, v in b])  # a kill: [[subscripts], value] per node removed


_menc = msgspec.msgpack.encode


def _before_raw(b):
    if b is None or type(b) is bytes:
        return b
    return _menc(b)  # a kill: msgpack array of [key, value bytes]


def read_chunk(chunk: Chunk, builder: JournalBatchBuilder, *, batch_rows: int = BATCH_ROWS
               ) -> Iterator[pa.RecordBatch]:
    """Decode the chunk's frames, checking each, into batches of about ``batch_rows`` rows."""
    path = chunk.path
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= chunk.offset:
            raise JournalCorrupt(f"journal segment {path} ends at byte {size}, before seqno {chunk.first_seqno} "
                                 f"expected at offset {chunk.offset} (was it truncated or replaced?)",
                                 path=path, offset=chunk.offset)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            off, seqno, last = chunk.offset, chunk.first_seqno, chunk.last_seqno
            crc32 = zlib.crc32
            while seqno <= last:
                hdr = parse_header(buf, off) if size - off >= FRAME_HEADER_SIZE else None
                if hdr is None or off + hdr.total > size:
                    raise JournalCorrupt(f"journal segment {path} is corrupt at offset {off}: frame header is "
                                         f"damaged or truncated (seqno {seqno} expected)", path=path, offset=off)
                if hdr.seqno != seqno:
                    raise JournalCorrupt(f"journal segment {path} offset {off}: seqno {hdr.seqno} where {seqno} "
                                         f"was expected", path=path, offset=off)
                start = off + FRAME_HEADER_SIZE
                payload = buf[start:start + hdr.length]
                if crc32(payload) != hdr.payload_crc:
                    raise JournalCorrupt(f"journal segment {path} is corrupt at offset {off}: payload checksum "
                                         f"mismatch (seqno {seqno})", path=path, offset=off)
                builder.add(decode_payload(payload), hdr.payload_crc)
                if builder.rows >= batch_rows:
                    yield builder.flush()
                off += hdr.total
                seqno += 1
        finally:
            buf.close()
    tail = builder.flush()
    if tail is not None:
        yield tail
