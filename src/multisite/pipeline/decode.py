"""Journal frames -> Arrow record batches: the hot path of the Spark source (no pyspark here).

How it stays fast: the per-update loop only gathers the decoded objects it is handed by msgspec
(region, op, key, value bytes, ...) into plain lists; every output column is then built from those
lists at batch end, either vectorized (numpy ``repeat`` for the per-transaction columns, Arrow
``take`` for ``op``, Arrow compute for the key text brackets) or by one list comprehension over a
C-level codec call (msgpack -> JSON). Typed ``fields`` are built per region that declares them, and
handed to Arrow in one call per field when the values already have the declared Python type (the
per-value coercion runs only for the fields that need it). A column that the reader's schema does not
name is not built. The cyclic garbage collector is paused while a chunk is decoded: the lists hold
hundreds of thousands of tuples that it would otherwise walk again and again.

A chunk is a run of frames in one segment: ``[first_seqno, last_seqno]`` starting at a byte offset
found at planning time by walking headers. Reading checks every frame again (header CRC, payload CRC,
seqno continuity), and a damaged frame is ``JournalCorrupt`` naming the file and offset. A chunk may
instead name a piece of the journal index (``segment_index``) to read its rows from, or ask for one
to be written from what it decodes.
"""

from __future__ import annotations

import gc
import mmap
import os
import zlib
from dataclasses import dataclass
from itertools import repeat
from typing import Iterator

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import JournalCorrupt, JournalGap
from ..journal.records import FRAME_HEADER_SIZE, KILL, decode_payload, parse_header
from .columns import COERCE

BATCH_ROWS = 65_536  # updates per Arrow batch handed to Spark

_mdec = msgspec.msgpack.decode
_jenc = msgspec.json.encode
_OPS = pa.array([None, "set", "kill", "zkill"], pa.string())


@dataclass(frozen=True)
class Chunk:
    """Frames ``first_seqno..last_seqno`` of one segment, the first at byte ``offset``.

    ``piece``: a journal-index file holding these frames (read it instead of decoding);
    ``write_piece``: decode, and write the frames' rows as a new piece; ``segment``: the segment's index.
    """

    instance: str
    path: str
    offset: int
    first_seqno: int
    last_seqno: int
    segment: int = 0
    piece: str = ""
    piece_first: int = 0
    piece_last: int = 0
    write_piece: bool = False
    nbytes: int = 0  # journal bytes of the frames (planning weight)
    rows: int = 0  # rows (updates), where the planner knows them (from a piece's footer)
    # A chunk of a journal archive (``archive``): ``path`` and ``piece`` are the archived files' URLs
    # (or local paths), fetched and checked against the manifest's sizes and CRC-32s before reading.
    archived: bool = False
    file_bytes: int = 0
    file_crc: int = 0
    piece_bytes: int = 0
    piece_crc: int = 0


@dataclass
class FrameRun:
    """What :func:`read_chunk` saw, for the validity key of a piece written from it."""

    header_crc: int = 0
    last_offset: int = 0
    last_crc: int = 0


def msgpack_objects(blobs: list) -> list:
    return [None if b is None else _mdec(b) for b in blobs]


def _key_text_column(keys: list, typ: pa.DataType) -> pa.Array:
    arr = pa.array(list(map(_jenc, keys)), pa.binary()).cast(pa.string())
    arr = pc.utf8_replace_slice(arr, start=0, stop=1, replacement="(")
    arr = pc.utf8_replace_slice(arr, start=-1, stop=2**31 - 1, replacement=")")
    return arr.cast(typ) if arr.type != typ else arr


def key_column(keys: list, typ: pa.DataType) -> pa.Array:
    """``array<struct<i: bigint, s: string>>``: one struct per subscript, the other field NULL."""
    lens = np.fromiter(map(len, keys), dtype=np.int32, count=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    parts = [p for k in keys for p in k]
    kinds = set(map(type, parts))
    struct_t = typ.value_type
    if kinds == {int}:
        ints = pa.array(parts, struct_t.field("i").type)
        strs = pa.nulls(len(parts), struct_t.field("s").type)
    elif kinds == {str}:
        ints = pa.nulls(len(parts), struct_t.field("i").type)
        strs = pa.array(parts, struct_t.field("s").type)
    else:
        ints = pa.array([p if type(p) is int else None for p in parts], struct_t.field("i").type)
        strs = pa.array([p if type(p) is str else None for p in parts], struct_t.field("s").type)
    child = pa.StructArray.from_arrays([ints, strs], fields=list(struct_t))
    return pa.ListArray.from_arrays(pa.array(offsets), child, type=typ)


_KEY_ARROW = pa.list_(pa.field("element", pa.struct([("i", pa.int64()), ("s", pa.string())])))


def key_bytes_column(key: pa.ListArray) -> pa.Array:
    """``keys.encode_key`` of every key of a key column, vectorized: an int subscript is ``0x01`` + 8
    bytes big-endian of ``value + 2**63``, a str one ``0x02`` + UTF-8 (``0x00`` escaped as
    ``0x00 0xff``) + ``0x00``; a key is its subscripts' encodings joined."""
    parts = key.values
    ints, strs = parts.field("i"), parts.field("s")
    iv = ints.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    biased = (iv.view(np.uint64) ^ np.uint64(1 << 63)).byteswap()
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(parts), [None, pa.py_buffer(biased.tobytes())])
    ienc = pc.binary_join_element_wise(pa.scalar(b"\x01"), fixed.cast(pa.binary()), b"")
    sesc = pc.replace_substring(strs.cast(pa.binary()), b"\x00", b"\x00\xff")
    senc = pc.binary_join_element_wise(pa.scalar(b"\x02"), sesc, pa.scalar(b"\x00"), b"")
    enc = pc.if_else(ints.is_valid(), ienc, senc)
    return pc.binary_join(pa.ListArray.from_arrays(key.offsets, enc), b"")


def key_text_column(keys: list, typ: pa.DataType = pa.string()) -> pa.Array:
    return _key_text_column(keys, typ)


# -- values as JSON ---------------------------------------------------------------------------------
# A stored value may be a map whose keys JSON cannot take as they are: msgpack allows any key, and the
# engine stores dicts keyed by None, True or a tuple; msgspec's JSON encoder refuses those (TypeError).
# Such a key is written as a string, its own JSON text: True -> "true", None -> "null", (1, "a") ->
# "[1,\"a\"]". Keys msgspec does take keep its rendering (str as is, 1 -> "1", 1.5 -> "1.5", bytes as
# base64), so a value renders the same whichever of its keys needed the fallback. Keys that end up
# alike ({True: 1, "true": 2}) are both written, as ``json.dumps`` does. Only a value that the fast
# encoder refuses goes through the fallback; a column tries the fast encoder on every value at once.
_NATIVE_KEYS = (str, bytes, int, float)


def _json_key(k) -> bytes:
    if type(k) is str:
        return _jenc(k)
    if type(k) is not bool and isinstance(k, _NATIVE_KEYS):
        return _jenc({k: 0})[1:-3]  # msgspec's own rendering of the key: b'{"1.5":0}' -> b'"1.5"'
    return _jenc(_slow_json(k).decode())  # None, bool, tuple: the key's JSON, as a string


def _slow_json(o) -> bytes:
    try:
        return _jenc(o)
    except TypeError:
        pass
    if isinstance(o, dict):
        return b"{" + b",".join([_json_key(k) + b":" + _slow_json(v) for k, v in o.items()]) + b"}"
    if isinstance(o, (list, tuple)):
        return b"[" + b",".join([_slow_json(v) for v in o]) + b"]"
    raise TypeError(f"a {type(o).__name__} has no JSON form")


def value_json(obj) -> bytes:
    """The JSON of a decoded value (the ``value`` and ``before`` columns), whatever its dict keys."""
    try:
        return _jenc(obj)
    except TypeError:
        return _slow_json(obj)


def json_column(blobs: list, typ: pa.DataType, objs: list | None = None) -> pa.Array:
    """JSON of msgpack ``blobs``, NULL where a blob is None; ``objs``: the blobs already decoded."""
    try:
        if objs is None:
            out = [None if b is None else _jenc(_mdec(b)) for b in blobs]
        else:
            out = [None if b is None else _jenc(o) for o, b in zip(objs, blobs)]
    except TypeError:  # a value with keys JSON does not take: encode the values one by one
        if objs is None:
            objs = msgpack_objects(blobs)
        out = [None if b is None else value_json(o) for o, b in zip(objs, blobs)]
    return pa.array(out, pa.binary()).cast(typ)


# Python types that a declared field type takes as they are (anything else goes through COERCE).
_AS_IS = {"string": {str}, "bigint": {int}, "int": {int}, "double": {int, float}, "float": {int, float},
          "boolean": {bool}, "binary": {bytes}}
_NONE = type(None)


def _typed(vals: list, kind: str, typ: pa.DataType) -> pa.Array:
    kinds = set(map(type, vals))
    kinds.discard(_NONE)
    if kinds <= _AS_IS.get(kind, set()):
        try:
            return pa.array(vals, typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass  # out of range for the type: coerce value by value (NULL where it does not fit)
    coerce = COERCE[kind]
    return pa.array([coerce(v) for v in vals], typ)


def fields_column(objs: list, regions: list, region_fields: dict[str, frozenset], fields: dict[str, str],
                  typ: pa.StructType) -> pa.Array:
    """Typed columns of the declared fields; NULL where the region does not declare the field."""
    n = len(objs)
    codes = pa.array(regions, pa.string()).dictionary_encode()
    idx = codes.indices.to_numpy(zero_copy_only=False)
    names = codes.dictionary.to_pylist()
    groups = []  # (row indexes, their dict values, declared field names) per region declaring fields
    for code, r in enumerate(names):
        declared = region_fields.get(r)
        if declared:
            rows = np.flatnonzero(idx == code)
            sub = objs if len(rows) == n else [objs[i] for i in rows.tolist()]
            groups.append((rows, [o if type(o) is dict else {} for o in sub], declared))
    arrays = []
    for f in typ:
        name, ftype = f.name, f.type
        kind = fields[name]
        parts, where = [], []
        for rows, dicts, declared in groups:
            if name not in declared:
                continue
            parts.append(_typed(list(map(dict.get, dicts, repeat(name))), kind, ftype))
            where.append(rows)
        if not parts:
            arrays.append(pa.nulls(n, ftype))
            continue
        if len(parts) == 1 and len(where[0]) == n:
            arrays.append(parts[0])
            continue
        # scatter: row i takes element pos[i] of the concatenation, or the trailing NULL
        pos = np.full(n, sum(len(p) for p in parts), dtype=np.int64)
        base = 0
        for p, rows in zip(parts, where):
            pos[rows] = np.arange(base, base + len(p))
            base += len(p)
        cat = pa.concat_arrays([*parts, pa.nulls(1, ftype)])
        arrays.append(cat.take(pa.array(pos)))
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
        objs = keys = None
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
                a = keys = key_column(self.u_key, typ)
            elif name == "key_text":
                a = _key_text_column(self.u_key, typ)
            elif name == "key_bytes":
                if keys is None:
                    keys = key_column(self.u_key, _KEY_ARROW)
                a = key_bytes_column(keys)
                a = a.cast(typ) if a.type != typ else a
            elif name == "value":
                if objs is None and "fields" in self.names:
                    objs = msgpack_objects(self.u_value)
                a = json_column(self.u_value, typ, objs)
            elif name == "value_raw":
                a = pa.array(self.u_value, typ)
            elif name == "value_size":
                a = pc.binary_length(pa.array(self.u_value, pa.binary())).cast(typ)
            elif name == "before":
                a = pa.array(list(map(_before_json, self.u_before)), pa.binary()).cast(typ)
            elif name == "before_raw":
                a = pa.array(list(map(_before_raw, self.u_before)), typ)
            elif name == "fields":
                if objs is None:
                    objs = msgpack_objects(self.u_value)
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
        return value_json(_mdec(b))
    return value_json([[k, _mdec(v)] for k, v in b])  # a kill: [[subscripts], value] per node removed


_menc = msgspec.msgpack.encode


def _before_raw(b):
    if b is None or type(b) is bytes:
        return b
    return _menc(b)  # a kill: msgpack array of [key, value bytes]


def open_segment(path: str, first: int, last: int):
    """Open a planned segment for reading: JournalGap, saying so, if it was removed (a prune) since
    the read was planned, rather than a bare FileNotFoundError from a Spark task."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise JournalGap(f"journal segment {path} was removed after this read was planned (pruned?): seqnos "
                         f"{first}..{last} are no longer in the journal; run the read again") from None


def read_chunk(chunk: Chunk, builder: JournalBatchBuilder, *, batch_rows: int = BATCH_ROWS,
               run: FrameRun | None = None) -> Iterator[pa.RecordBatch]:
    """Decode the chunk's frames, checking each, into batches of about ``batch_rows`` rows."""
    path = chunk.path
    with open_segment(path, chunk.first_seqno, chunk.last_seqno) as f:
        size = os.fstat(f.fileno()).st_size
        if size <= chunk.offset:
            raise JournalCorrupt(f"journal segment {path} ends at byte {size}, before seqno {chunk.first_seqno} "
                                 f"expected at offset {chunk.offset} (was it truncated or replaced?)",
                                 path=path, offset=chunk.offset)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        gc_was = gc.isenabled()
        gc.disable()
        try:
            if run is not None:
                run.header_crc = zlib.crc32(buf[:64])
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
                if run is not None:
                    run.last_offset, run.last_crc = off, hdr.payload_crc
                if builder.rows >= batch_rows:
                    yield builder.flush()
                off += hdr.total
                seqno += 1
        finally:
            buf.close()
            if gc_was:
                gc.enable()
    tail = builder.flush()
    if tail is not None:
        yield tail
