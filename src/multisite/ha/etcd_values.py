"""The values of the etcd client and the watch (keys, reads, comparisons, operations, leases, events,
members' health) and their encoding for etcd's v3 JSON gateway, which sends keys and values in base64
and revisions as strings.

Why a module of their own: ``etcd_client`` (one request per call) and ``etcd_watch`` (one stream per
watch) both build on them, and neither needs the other's machinery to read an answer.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any


# -- values --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it; ``create_revision`` and ``mod_revision`` are what transactions compare."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class PrefixRead:
    """The keys under a prefix and the store's revision they were read at (watch from ``revision + 1``)."""

    kvs: list[KeyValue]
    revision: int


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``target`` (CREATE, MOD, VERSION, VALUE) of ``key`` ``result`` ``value``."""

    key: str
    target: str
    value: int | bytes
    result: str = "EQUAL"  # EQUAL, NOT_EQUAL, GREATER, LESS


@dataclass(frozen=True)
class Put:
    """A put inside a transaction (``lease`` 0: none)."""

    key: str
    value: str | bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    """A delete inside a transaction: one key, or every key under it when ``prefix``."""

    key: str
    prefix: bool = False


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held (the success ops ran) and the store's revision after the transaction."""

    succeeded: bool
    revision: int


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id and the TTL etcd gave it (etcd may raise a TTL below its minimum)."""

    id: int
    ttl_s: int


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix: ``kind`` is "put" or "delete" (a delete's value is empty)."""

    kind: str
    kv: KeyValue


@dataclass(frozen=True)
class MemberHealth:
    """One member as ``health()`` found it: ``healthy`` when it served a linearizable read in time."""

    url: str
    healthy: bool
    member_id: int = 0
    leader_id: int = 0
    raft_term: int = 0
    error: str = ""


def absent(key: str) -> Compare:
    """The key does not exist (its create revision is 0): the condition of "create if absent"."""
    return Compare(key, "CREATE", 0)


def created_at(key: str, revision: int) -> Compare:
    """The key is the one created at ``revision`` (not deleted and created again since)."""
    return Compare(key, "CREATE", revision)


def modified_at(key: str, revision: int) -> Compare:
    """The key was last written at ``revision``: nobody wrote it since it was read."""
    return Compare(key, "MOD", revision)


def value_is(key: str, value: str | bytes) -> Compare:
    """The key holds exactly ``value``."""
    return Compare(key, "VALUE", _bytes(value))


# -- encoding for the JSON gateway ----------------------------------------------------------------------
def _bytes(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def _b64(s: str | bytes) -> str:
    return base64.b64encode(_bytes(s)).decode()


def _prefix_end(prefix: str | bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (etcd's range_end for a prefix)."""
    b = bytearray(_bytes(prefix))
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"  # every key
    b[-1] += 1
    return bytes(b)


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(d["key"]).decode(), base64.b64decode(d.get("value", "")),
                    int(d.get("create_revision", 0)), int(d.get("mod_revision", 0)),
                    int(d.get("version", 0)), int(d.get("lease", 0)))


def _revision(res: dict[str, Any]) -> int:
    return int(res.get("header", {}).get("revision", 0))


def _compare_json(c: Compare) -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version", "VALUE": "value"}[c.target]
    value = _b64(c.value) if c.target == "VALUE" else int(c.value)
    return {"key": _b64(c.key), "target": c.target, "result": c.result, field: value}


def _op_json(op: Put | Delete) -> dict[str, Any]:
    if isinstance(op, Put):
        return {"request_put": {"key": _b64(op.key), "value": _b64(op.value), "lease": op.lease}}
    body = {"key": _b64(op.key)}
    if op.prefix:
        body["range_end"] = base64.b64encode(_prefix_end(op.key)).decode()
    return {"request_delete_range": body}


# -- failures, said short ---------------------------------------------------------------------------------
_REASONS = (("read timed out", "no answer in time"), ("connection refused", "connection refused"),
            ("connecttimeout", "connect timeout"), ("connect timeout", "connect timeout"),
            ("remotedisconnected", "connection closed"), ("connection aborted", "connection closed"))


def _summary(e: Exception) -> str:
    """A failure in a few words: what requests says at length, or what etcd answered."""
    detail = f"{getattr(e, 'detail_text', '') or ''} {e}".strip()
    low = detail.lower()
    for needle, reason in _REASONS:
        if needle in low:
            return reason
    return f"{type(e).__name__}: {detail[:160]}" if detail else type(e).__name__
