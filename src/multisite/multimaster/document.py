"""A document version: the value type stored, sent and compared by the multi-master family.

A ``Doc`` is immutable. Besides its form and fields it carries what replication needs:

- the OID parts ``seq`` / ``time_us`` / ``origin`` (see ``ids.Stamp``);
- ``revisions``: the seed's ``$Revisions``, the ``(time_us, origin)`` of versions ``1 .. seq-1``
  of the line this version descends from, oldest first (so ``revisions[k-1]`` is version ``k``);
- ``field_seqs``: per field, the sequence number of the version that last changed it (the merge
  test: which fields changed since the versions diverged);
- ``deleted``: a deletion stub (fields dropped but those that name it, ``KEPT_WHEN_DELETED``; the OID moves
  on, and it replicates);
- ``merge``: the form's "merge replication conflicts" setting, copied in when the version was made,
  so that every server decides a conflict the same way without consulting its own form table;
- ``merged``: stamps of versions a merge absorbed (the loser's line after the divergence), so that a
  copy of any of them is recognised as an ancestor later and does not raise the conflict again.

``to_value``/``from_value`` give the stored (and sent) form, a msgpack-able list; ``from_value``
checks the shape and names the first thing wrong (MalformedDocument, RevisionsCorrupt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ..errors import MalformedDocument, RevisionsCorrupt
from .ids import MAX_SEQ, Stamp, check_unid, encode_oid

CONFLICT_FIELD = "$Conflict"
REF_FIELD = "$Ref"
COUCH_ID_FIELD = "$CouchId"  # the ``_id`` a CouchDB client gave a document, when it is not a UNID (couch.py)
KEPT_WHEN_DELETED = (COUCH_ID_FIELD, CONFLICT_FIELD, REF_FIELD)
MAX_FIELDS = 10_000


@dataclass(frozen=True)
class Doc:
    unid: str
    form: str
    fields: dict[str, Any]
    seq: int
    time_us: int
    origin: str
    revisions: tuple[tuple[int, str], ...] = ()
    field_seqs: dict[str, int] = field(default_factory=dict)
    deleted: bool = False
    merge: bool = False
    merged: tuple[Stamp, ...] = ()

    # -- identity ---------------------------------------------------------------------------------
    @cached_property
    def stamp(self) -> Stamp:  # cached: compared many times per reconcile (not a field: eq and repr skip it)
        return Stamp(self.seq, self.time_us, self.origin)

    @property
    def oid(self) -> bytes:
        """The 28-byte OID (UNID, sequence number, sequence time)."""
        return encode_oid(self.unid, self.seq, self.time_us)

    @property
    def is_conflict(self) -> bool:
        return CONFLICT_FIELD in self.fields

    def stamp_at(self, seq: int) -> tuple | None:
        """The stamp of version ``seq`` of this document's line (None past it or below 1), as a plain
        ``(seq, time_us, origin)`` tuple (equal to the ``Stamp``; the hot path of every comparison)."""
        if seq == self.seq:
            return (self.seq, self.time_us, self.origin)
        if 1 <= seq < self.seq:
            t, o = self.revisions[seq - 1]
            return (seq, t, o)
        return None

    # -- new versions -----------------------------------------------------------------------------
    def next_version(self, time_us: int, origin: str, fields: dict[str, Any] | None = None, *,
                     deleted: bool = False, merge: bool | None = None) -> "Doc":
        """The version after this one, made at ``time_us`` by ``origin``: ``fields`` updated (or the
        fields dropped, for a deletion stub)."""
        if self.seq >= MAX_SEQ:
            raise MalformedDocument(f"document {self.unid} reached the last sequence number {MAX_SEQ}")
        seq = self.seq + 1
        fs = dict(self.field_seqs)
        if deleted:  # a stub keeps only what names it: a client's ``_id``, a conflict's ``$Ref`` (couch.py)
            new_fields: dict[str, Any] = {k: self.fields[k] for k in KEPT_WHEN_DELETED if k in self.fields}
        else:
            new_fields = {**self.fields, **(fields or {})}
            for k in fields or {}:
                fs[k] = seq
        return replace(self, fields=new_fields, seq=seq, time_us=time_us, origin=origin,
                       revisions=self.revisions + ((self.time_us, self.origin),), field_seqs=fs,
                       deleted=deleted, merge=self.merge if merge is None else merge)

    # -- stored form ------------------------------------------------------------------------------
    def to_value(self) -> list:
        return [self.unid, self.form, self.fields, self.seq, self.time_us, self.origin,
                [[t, o] for t, o in self.revisions], self.field_seqs, self.deleted, self.merge,
                [list(s) for s in self.merged]]

    @classmethod
    def trusted(cls, v: list) -> "Doc":
        """A document this database stored itself (checked when it was written): no checks, fast."""
        unid, form, fields, seq, time_us, origin, revs, fs, deleted, merge, merged = v
        return cls(unid, form, fields, seq, time_us, origin, tuple((t, o) for t, o in revs), fs, deleted, merge,
                   tuple(Stamp(*m) for m in merged) if merged else ())

    @classmethod
    def from_value(cls, v: Any) -> "Doc":
        """The document stored as ``v``; MalformedDocument / RevisionsCorrupt naming what is wrong."""
        if not isinstance(v, (list, tuple)) or len(v) != 11:
            raise MalformedDocument(f"a document is a list of 11 parts, got {type(v).__name__} "
                                    f"{('of ' + str(len(v))) if isinstance(v, (list, tuple)) else ''}".strip())
        unid, form, fields, seq, time_us, origin, revs, fs, deleted, merge, merged = v
        unid = check_unid(unid)
        where = f"document {unid}"
        if not isinstance(form, str):
            raise MalformedDocument(f"{where}: form must be a string, got {form!r:.40}")
        if type(fields) is not dict or len(fields) > MAX_FIELDS or not _all_str(fields):
            raise MalformedDocument(f"{where}: fields must be a map of names (strings) to values")
        if type(seq) is not int or not 1 <= seq <= MAX_SEQ:
            raise MalformedDocument(f"{where}: sequence number {seq!r:.40} is not in 1..{MAX_SEQ}")
        if type(time_us) is not int or time_us < 0:
            raise MalformedDocument(f"{where}: sequence time {time_us!r:.40} is not a time in µs")
        if not isinstance(origin, str) or not origin:
            raise MalformedDocument(f"{where}: origin {origin!r:.40} is not a database identifier")
        if not isinstance(revs, (list, tuple)) or len(revs) != seq - 1:
            n = len(revs) if isinstance(revs, (list, tuple)) else type(revs).__name__
            raise RevisionsCorrupt(f"{where}: $Revisions holds {n} entries, but sequence number {seq} "
                                   f"needs {seq - 1} (one per earlier version)")
        revisions = []
        for r in revs:
            if type(r) not in _SEQ or len(r) != 2 or type(r[0]) is not int or r[0] < 0 or type(r[1]) is not str or not r[1]:
                raise RevisionsCorrupt(f"{where}: $Revisions entry {len(revisions) + 1} is {r!r:.60}, "
                                       f"not [time_us, origin]")
            revisions.append((r[0], r[1]))
        if type(fs) is not dict or not _all_str(fs) or not all(type(s) is int and 1 <= s <= seq for s in fs.values()):
            raise MalformedDocument(f"{where}: field sequence numbers must map names to 1..{seq}")
        if not fs.keys() >= fields.keys():
            missing = [k for k in fields if k not in fs]
            raise MalformedDocument(f"{where}: field {missing[0]!r} has no field sequence number")
        if type(deleted) is not bool or type(merge) is not bool:
            raise MalformedDocument(f"{where}: deleted and merge flags must be booleans")
        if not isinstance(merged, (list, tuple)):
            raise MalformedDocument(f"{where}: merged versions must be a list")
        stamps = []
        for m in merged:
            if (not isinstance(m, (list, tuple)) or len(m) != 3 or type(m[0]) is not int or type(m[1]) is not int
                    or not isinstance(m[2], str)):
                raise MalformedDocument(f"{where}: merged version {m!r:.60} is not [seq, time_us, origin]")
            stamps.append(Stamp(m[0], m[1], m[2]))
        return cls(unid, form, fields, seq, time_us, origin, tuple(revisions), fs, deleted, merge, tuple(stamps))

    def public(self) -> dict:
        """The document as a user (CLI, JSON) sees it."""
        return {"unid": self.unid, "form": self.form, "fields": self.fields, "seq": self.seq,
                "seq_time_us": self.time_us, "origin": self.origin, "oid": self.oid.hex(),
                "revisions": [{"seq": k, "time_us": t, "origin": o} for k, (t, o) in enumerate(self.revisions, 1)],
                "deleted": self.deleted,
                "conflict": self.is_conflict}


_SEQ = (list, tuple)


def _all_str(d: dict) -> bool:
    """Every key of ``d`` is a str (msgpack maps may have other keys)."""
    return all(type(k) is str for k in d)


def first_version(unid: str, form: str, fields: dict[str, Any], time_us: int, origin: str, merge: bool) -> Doc:
    return Doc(unid, form, dict(fields), 1, time_us, origin, (), {k: 1 for k in fields}, False, merge, ())
