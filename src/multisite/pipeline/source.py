"""The journal as a Spark data source: ``spark.read.format("multisite").load(DIR or [DIRS])``.

One row per update (see ``columns.JOURNAL_COLUMNS``). Options:

- ``from_seqno`` / ``to_seqno``: the seqno range (inclusive); filters on ``seqno`` are pushed down too;
- ``regions``: comma-separated region names (``region = 'x'`` / ``IN`` filters are pushed down too);
- ``chunk_bytes``: journal bytes per partition (default 32 MiB);
- ``index``: ``auto`` (default) reads runs of frames from the journal index where it has them and adds
  what it decodes to it; ``read`` only reads it; ``off`` decodes (and checks) every frame
  (see ``segment_index``); ``index_min_bytes``: smallest run of the open segment to index (8 MiB);
- ``partition_bytes`` (256 MiB) and ``min_partitions`` (this machine's cores): how indexed chunks are
  grouped into partitions;
- streams: ``starting`` (``earliest`` default, ``latest`` or a seqno: the last one *not* to read),
  ``consumer`` (name under which ``commit`` records the consumed seqno in each instance, default
  ``spark``; ``none`` to record nothing), ``max_transactions_per_batch``.

A user schema (``.schema("region string, value_size int")``) naming a subset of the columns makes the
reader build only those columns: a much cheaper scan when only a few are needed.
"""

from __future__ import annotations

import os
from typing import Iterator

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, EqualTo,
                                    GreaterThan, GreaterThanOrEqual, In, InputPartition, LessThan,
                                    LessThanOrEqual)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from ..errors import ConfigError, PipelineError
from ..instance import consumers
from ..instance.layout import Layout
from . import columns as C
from .decode import Chunk
from .offsets import JournalOffset
from .plan import (CHUNK_BYTES, PARTITION_BYTES, InstanceRef, TailWalker, chunks, fields_for, group_chunks,
                   instance_refs, ref_bounds, region_filter)
from .segment_index import INDEX_MIN_BYTES, check_mode, chunk_batches


class ChunkPartition(InputPartition):
    """Chunks of one instance's journal, read in order; carries all ``read()`` needs (it may run in
    another process). A chunk to decode is a partition of its own; chunks read from the journal
    index are cheap and are grouped, since each Spark task costs tens of milliseconds."""

    def __init__(self, chunks: list[Chunk], regions: frozenset | None, region_schemas: dict, fields: dict):
        super().__init__(chunks[0].path)
        self.chunks = chunks
        self.regions = regions
        self.region_schemas = region_schemas  # of the chunks' instance: region -> {field: ddl type}
        self.fields = fields


def _int_option(options, name: str, default: int | None) -> int | None:
    v = options.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {v!r}") from None


def _check_schema(schema, known: dict[str, str], fields: dict[str, str]) -> None:
    allowed = set(known) | ({"fields"} if fields else set())
    unknown = [f.name for f in schema.fields if f.name not in allowed]
    if unknown:
        raise ConfigError(f"unknown column(s) {', '.join(unknown)} in the schema given to the multisite source; "
                          f"columns are {', '.join(sorted(allowed))}")


def _arrow_schema(schema):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def read_partition(part: ChunkPartition, schema) -> Iterator:
    if not isinstance(part, ChunkPartition):
        # A plan with no partitions (a range past the end, an empty journal): Spark still runs one
        # task, with a plain InputPartition of its own.
        return
    target = _arrow_schema(schema)
    for chunk in part.chunks:
        yield from chunk_batches(chunk, target, regions=part.regions, region_schemas=part.region_schemas,
                                 fields=part.fields)


class JournalDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "multisite"

    def _refs(self) -> list[InstanceRef]:
        if not hasattr(self, "_refs_cache"):
            self._refs_cache = instance_refs(self.options)
        return self._refs_cache

    def schema(self) -> str:
        fields = fields_for(self._refs(), region_filter(self.options))
        return C.ddl(C.JOURNAL_COLUMNS, fields)

    def reader(self, schema) -> "JournalReader":
        return JournalReader(self.options, schema, self._refs())

    def streamReader(self, schema) -> "JournalStreamReader":
        return JournalStreamReader(self.options, schema, self._refs())


class _Common:
    def _setup(self, options, schema, refs: list[InstanceRef]) -> None:
        self.options = dict(options)
        self.schema = schema
        self.refs = refs
        self.regions = region_filter(options)
        self.fields = fields_for(refs, self.regions)
        _check_schema(schema, {**C.JOURNAL_COLUMNS, **C.JOURNAL_EXTRA_COLUMNS}, self.fields)
        self.chunk_bytes = _int_option(options, "chunk_bytes", CHUNK_BYTES)
        self.index = check_mode(options.get("index", "auto"))
        self.index_min_bytes = _int_option(options, "index_min_bytes", INDEX_MIN_BYTES)
        self.partition_bytes = _int_option(options, "partition_bytes", PARTITION_BYTES)
        self.min_partitions = _int_option(options, "min_partitions", os.cpu_count() or 2)

    def _parts(self, ref: InstanceRef, lo: int, hi: int | None, strict: bool,
               start_at: tuple[int, int, int] | None = None) -> list[ChunkPartition]:
        cs = chunks(ref, lo, hi, chunk_bytes=self.chunk_bytes, strict_start=strict, index=self.index,
                    index_min_bytes=self.index_min_bytes, start_at=start_at)
        return [ChunkPartition(g, self.regions, ref.region_schemas, self.fields)
                for g in group_chunks(cs, self.partition_bytes, self.min_partitions, chunk_bytes=self.chunk_bytes)]


class JournalReader(_Common, DataSourceReader):
    def __init__(self, options, schema, refs):
        self._setup(options, schema, refs)
        self.lo = _int_option(options, "from_seqno", 1)
        self.hi = _int_option(options, "to_seqno", None)
        self.instances: set[str] | None = None

    def pushFilters(self, filters):
        for f in filters:
            attr = getattr(f, "attribute", ())
            col = attr[0] if len(attr) == 1 else None
            v = getattr(f, "value", None)
            if col == "seqno" and isinstance(v, int):
                if isinstance(f, EqualTo):
                    self.lo, self.hi = max(self.lo, v), v if self.hi is None else min(self.hi, v)
                elif isinstance(f, GreaterThan):
                    self.lo = max(self.lo, v + 1)
                elif isinstance(f, GreaterThanOrEqual):
                    self.lo = max(self.lo, v)
                elif isinstance(f, LessThan):
                    self.hi = v - 1 if self.hi is None else min(self.hi, v - 1)
                elif isinstance(f, LessThanOrEqual):
                    self.hi = v if self.hi is None else min(self.hi, v)
                else:
                    yield f
                    continue
            elif col == "region" and isinstance(f, (EqualTo, In)):
                vals = frozenset([v] if isinstance(f, EqualTo) else v)
                self.regions = vals if self.regions is None else self.regions & vals
            elif col == "instance" and isinstance(f, (EqualTo, In)):
                vals = set([v] if isinstance(f, EqualTo) else v)
                self.instances = vals if self.instances is None else self.instances & vals
            else:
                yield f

    def partitions(self):
        parts: list[ChunkPartition] = []
        if self.hi is not None and self.hi < self.lo:
            return parts
        for ref in self.refs:
            if self.instances is None or ref.name in self.instances:
                parts.extend(self._parts(ref, self.lo, self.hi, strict=False))
        return parts

    def read(self, partition):
        return read_partition(partition, self.schema)


class JournalStreamReader(_Common, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are :class:`JournalOffset` s; a batch ``(start, end]`` is the transactions after
    ``start`` up to ``end`` per instance, read deterministically from the journal, so a restart from
    a checkpoint replays exactly the batch it had planned."""

    def __init__(self, options, schema, refs):
        self._setup(options, schema, refs)
        archived = [r.archive for r in refs if not r.path]
        if archived:
            raise ConfigError(f"a stream follows a live instance: give its directory as well as its journal archive "
                              f"{archived[0]} (load([archive URL, instance directory]))")
        self.consumer = options.get("consumer", "spark")
        if self.consumer.lower() != "none":
            consumers.check_name(self.consumer)
        self.max_txns = _int_option(options, "max_transactions_per_batch", None)
        self.available_now: dict[str, int] | None = None
        self._claimed = False
        self._walkers = {ref.name: TailWalker(ref.path) for ref in self.refs}  # asked at every trigger

    def _latest(self) -> dict[str, int]:
        return {name: w.bounds()[1] for name, w in self._walkers.items()}

    def initialOffset(self) -> dict:
        starting = self.options.get("starting", "earliest").lower()
        out = {}
        for ref in self.refs:
            first, last = ref_bounds(ref)  # with its archive, the stream starts where the archive does
            if starting == "earliest":
                out[ref.name] = first - 1
            elif starting == "latest":
                out[ref.name] = last
            else:
                try:
                    out[ref.name] = int(starting)
                except ValueError:
                    raise ConfigError(f"option starting must be earliest, latest or a seqno, got {starting!r}") \
                        from None
        self._claim(out)
        self._record(out)  # hold the journal from here until the first commit
        self._claimed = True  # Spark may ask again in the same run
        return self._offset(out)

    def _claim(self, start: dict[str, int]) -> None:
        """A new stream (Spark asks for an initial offset only when there is no checkpoint) must not
        take over a position another stream keeps: the two would move one position back and forth,
        and prune could remove what the slower one has not read. A position at the very seqno this
        stream starts from is taken as its own, recorded by a start that failed before its first
        batch was checkpointed."""
        if self.consumer.lower() == "none" or self._claimed:
            return
        for ref in self.refs:
            held = {p.name: p for p in consumers.load_all(Layout.existing(ref.path))}.get(self.consumer)
            if held is not None and held.last_confirmed != start[ref.name]:
                raise ConfigError(
                    f"consumer name {self.consumer!r} already keeps a position in instance {ref.name} (seqno "
                    f"{held.last_confirmed}) for another stream, or for one whose checkpoint is gone. Give this "
                    f"stream a name of its own (option consumer=NAME), or, if that stream is gone, release its "
                    f"position: multisite journal consumers {ref.path} --forget {self.consumer}")

    def _offset(self, seqnos: dict[str, int]) -> dict:
        crcs = {name: self._walkers[name].crc(s) for name, s in seqnos.items()}
        return JournalOffset.of(seqnos, crcs).to_dict()

    def _check_not_rolled_back(self, begin: JournalOffset, latest: dict[str, int]) -> None:
        """Refuse to go on from an offset whose records the instance rolled back: the stream has
        delivered them, and reading on by seqno would skip the transactions that replaced them."""
        for ref in self.refs:
            s, crc = begin.get(ref.name), begin.crc(ref.name)
            if s <= 0:
                continue
            last = latest.get(ref.name, 0)
            if last < s:
                what = f"its journal now ends at seqno {last}"
            elif crc is not None and self._walkers[ref.name].crc(s) not in (None, crc):
                what = f"its record {s} is no longer the one the stream read"
            else:
                continue
            raise PipelineError(
                f"instance {ref.name} was rolled back under this stream: the stream has consumed its transactions "
                f"up to seqno {s}, but {what} (the rolled-off transactions are in the instance's lost-transaction "
                f"files). Going on would skip the transactions that took their place. Start the stream again from "
                f"a new checkpoint (option starting=SEQNO), or use `multisite pipeline export`, which retracts "
                f"rolled-off transactions.")

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self._latest()

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_txns) if self.max_txns else ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        begin = JournalOffset.from_dict(start)
        now = self._latest()
        self._check_not_rolled_back(begin, now)
        latest = self.available_now or now
        out = {}
        for name, last in latest.items():
            s = begin.get(name, 0)
            end = max(s, last)
            if isinstance(limit, ReadMaxRows):  # counted in transactions: offsets are per transaction
                end = min(end, s + max(1, limit.max_rows))
            out[name] = end
        return self._offset(out)

    def partitions(self, start: dict, end: dict):
        a, b = JournalOffset.from_dict(start), JournalOffset.from_dict(end)
        self._check_not_rolled_back(a, self._latest())
        parts: list[ChunkPartition] = []
        for ref in self.refs:
            lo, hi = a.get(ref.name, 0) + 1, b.get(ref.name, 0)
            if hi >= lo:  # the batch starts after the last one's end, whose place the walker knows
                at = self._walkers[ref.name].start_after(lo - 1)
                parts.extend(self._parts(ref, lo, hi, strict=True, start_at=at))
        return parts

    def read(self, partition):
        return read_partition(partition, self.schema)

    def _record(self, seqnos: dict[str, int]) -> None:
        if self.consumer.lower() == "none":
            return
        for ref in self.refs:
            if ref.name in seqnos:
                consumers.record(Layout.existing(ref.path), self.consumer, seqnos[ref.name])

    def commit(self, end: dict) -> None:
        self._record(dict(JournalOffset.from_dict(end).seqnos))
