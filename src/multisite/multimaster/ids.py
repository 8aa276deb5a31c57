"""Identifiers of the document world: UNIDs, OIDs, version stamps, replica and database IDs.

- **UNID** (16 bytes, 32 hex digits in text): 8 bytes of creation time (microseconds since the
  epoch, big-endian, so UNIDs sort by creation) and 8 bytes of a unique random number. Every replica
  of a document has the same UNID.
- **Stamp** ``(seq, time_us, origin)``: one version of a document. ``seq`` counts its versions,
  ``time_us`` is when the version was made (the seed's "sequence time"), ``origin`` is the database
  identifier of the replica that made it. The seed compares times only; two replicas that edit in
  the same microsecond (a test clock does that all the time) would then look identical, so the
  origin is part of the version.
- **OID** (28 bytes): the UNID, the sequence number (u32) and the sequence time (u64), as the seed.
- A **conflict document**'s UNID is derived from the document's UNID and the losing version, so the
  same conflict found on two servers yields the same conflict document.

Pure functions; randomness and time are parameters.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

from ..errors import MalformedDocument

UNID_BYTES = 16
OID = struct.Struct(">16sIQ")  # 28 bytes
MAX_SEQ = 2**32 - 1


class Stamp(NamedTuple):
    """One version of a document: sequence number, sequence time (µs), origin database identifier."""

    seq: int
    time_us: int
    origin: str


def new_unid(now_us: int, rand64: int) -> str:
    """A UNID made at ``now_us`` with the unique number ``rand64``, as 32 hex digits."""
    return (now_us.to_bytes(8, "big") + rand64.to_bytes(8, "big")).hex()


def check_unid(unid: object) -> str:
    """``unid`` if it is 32 lowercase hex digits; MalformedDocument naming it otherwise."""
    if not isinstance(unid, str) or len(unid) != 2 * UNID_BYTES:
        raise MalformedDocument(f"UNID {unid!r:.60} is not 32 hex digits")
    try:
        bytes.fromhex(unid)
    except ValueError:
        raise MalformedDocument(f"UNID {unid!r} is not 32 hex digits") from None
    if unid != unid.lower():
        raise MalformedDocument(f"UNID {unid!r} must be lowercase hex")
    return unid


def unid_time_us(unid: str) -> int:
    """The creation time in a UNID (µs since the epoch)."""
    return int(unid[:16], 16)


def encode_oid(unid: str, seq: int, time_us: int) -> bytes:
    """The 28-byte OID: UNID, sequence number, sequence time."""
    return OID.pack(bytes.fromhex(unid), seq, time_us)


def decode_oid(oid: bytes) -> tuple[str, int, int]:
    if len(oid) != OID.size:
        raise MalformedDocument(f"an OID is {OID.size} bytes, got {len(oid)}")
    u, seq, t = OID.unpack(oid)
    return u.hex(), seq, t


def conflict_unid(unid: str, loser: Stamp) -> str:
    """The UNID of the conflict document holding version ``loser`` of document ``unid``: the loser's
    time, then 8 bytes of a hash of the document and the version; the same wherever it is made."""
    h = hashlib.sha256(f"conflict|{unid}|{loser.seq}|{loser.time_us}|{loser.origin}".encode()).digest()
    return (loser.time_us.to_bytes(8, "big") + h[:8]).hex()


def new_id(rand64: int) -> str:
    """A replica ID or database identifier: 16 hex digits."""
    return rand64.to_bytes(8, "big").hex()


def check_id(what: str, value: object) -> str:
    if not isinstance(value, str) or len(value) != 16:
        raise MalformedDocument(f"{what} {value!r:.60} is not 16 hex digits")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise MalformedDocument(f"{what} {value!r} is not 16 hex digits") from None
    return value
