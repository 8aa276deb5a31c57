"""The columns of the Spark sources, and the region schema notation for typed value columns.

A region may declare a schema (``db.create_region("acct", schema='{"owner": "string", "n": "long"}')``):
a JSON object mapping a field of the region's (dict) values to a Spark type name among
:data:`FIELD_TYPES`. The sources then add one ``fields`` struct column holding the union of the
declared fields of the regions read (a field declared by two regions must have one type); a value
that is not a dict, or a field whose value does not fit the type, gives NULL there (the JSON
``value`` column always has the whole value).

Column sets are plain lists of names: a reader computes only the columns of the schema it was given,
so internal jobs pass a narrow schema and pay only for what they use.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterable

from ..errors import ConfigError

# Spark type name (DDL) for each notation name.
FIELD_TYPES = {
    "string": "string", "long": "bigint", "bigint": "bigint", "int": "int", "integer": "int",
    "double": "double", "float": "float", "boolean": "boolean", "bool": "boolean",
    "timestamp": "timestamp", "date": "date", "binary": "binary",
}

KEY_TYPE = "array<struct<i:bigint,s:string>>"

# name -> Spark DDL type. Order is the default schema's order.
JOURNAL_COLUMNS: dict[str, str] = {
    "instance": "string",
    "seqno": "bigint",
    "stream": "int",
    "stream_seqno": "bigint",
    "origin": "string",
    "commit_time": "timestamp",
    "ord": "int",
    "region": "string",
    "op": "string",
    "key": KEY_TYPE,
    "key_text": "string",
    "value": "string",
    "value_size": "int",
    "before": "string",
    "value_raw": "binary",
}
# Available when asked for in a user schema, not in the default one.
JOURNAL_EXTRA_COLUMNS: dict[str, str] = {"key_bytes": "binary", "txn_crc": "bigint", "before_raw": "binary"}

STATE_COLUMNS: dict[str, str] = {
    "instance": "string",
    "seqno": "bigint",
    "region": "string",
    "key": KEY_TYPE,
    "key_text": "string",
    "value": "string",
    "value_size": "int",
    "value_raw": "binary",
}
STATE_EXTRA_COLUMNS: dict[str, str] = {"key_bytes": "binary"}


def parse_region_schema(text: str | None, region: str = "?") -> dict[str, str]:
    """``'{"n": "long"}'`` -> ``{"n": "bigint"}`` (Spark DDL names); ConfigError if malformed."""
    if not text:
        return {}
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"schema of region {region!r} is not JSON ({e}); write it as a JSON object mapping "
                          f"field names to types, e.g. '{{\"owner\": \"string\", \"n\": \"long\"}}'") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"schema of region {region!r} must be a JSON object of field -> type, got {text!r}")
    out = {}
    for field, typ in spec.items():
        t = FIELD_TYPES.get(str(typ).lower())
        if t is None:
            raise ConfigError(f"schema of region {region!r}: field {field!r} has type {typ!r}; use one of "
                              f"{', '.join(sorted(FIELD_TYPES))}")
        out[str(field)] = t
    return out


def merge_fields(schemas: Iterable[tuple[str, dict[str, str]]]) -> dict[str, str]:
    """Union of the regions' declared fields; a field must have one type across regions."""
    merged: dict[str, str] = {}
    origin: dict[str, str] = {}
    for region, fields in schemas:
        for f, t in fields.items():
            if f in merged and merged[f] != t:
                raise ConfigError(f"field {f!r} is {merged[f]} in region {origin[f]!r} but {t} in region "
                                  f"{region!r}; read the regions separately (option regions=...)")
            merged.setdefault(f, t)
            origin.setdefault(f, region)
    return merged


def fields_ddl(fields: dict[str, str]) -> str:
    return "struct<" + ",".join(f"`{f}`:{t}" for f, t in fields.items()) + ">"


def ddl(columns: dict[str, str], fields: dict[str, str] | None = None) -> str:
    cols = [f"`{n}` {t}" for n, t in columns.items()]
    if fields:
        cols.append(f"`fields` {fields_ddl(fields)}")
    return ", ".join(cols)


# -- coercion of decoded values into typed fields ------------------------------------------------
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _to_ts(v: Any):
    """Seconds since the epoch or ISO text -> an aware UTC datetime; None for anything else, and for an
    instant outside years 1..9999 UTC (NaN, 1e15 s, ...): Python's and Spark's timestamp range, well
    inside Arrow's microsecond one, so that every value given to Arrow fits."""
    if isinstance(v, bool):
        return None
    try:
        if isinstance(v, (int, float)):
            return _EPOCH + dt.timedelta(seconds=v)
        if isinstance(v, str):
            t = dt.datetime.fromisoformat(v)
            return t.astimezone(dt.timezone.utc) if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    except (OverflowError, ValueError):
        return None
    return None


def _to_date(v: Any):
    if isinstance(v, str):
        try:
            return dt.date.fromisoformat(v[:10])
        except ValueError:
            return None
    return None


def _int(v: Any):
    return v if type(v) is int else None


def _num(v: Any):
    return float(v) if type(v) in (int, float) else None


COERCE = {
    "string": lambda v: v if type(v) is str else None,
    "bigint": lambda v: v if type(v) is int and -(2**63) <= v < 2**63 else None,
    "int": lambda v: v if type(v) is int and -(2**31) <= v < 2**31 else None,
    "double": _num,
    "float": _num,
    "boolean": lambda v: v if type(v) is bool else None,
    "timestamp": _to_ts,
    "date": _to_date,
    "binary": lambda v: v if type(v) is bytes else None,
}
