"""Conflict detection, the winner, field merge and conflict documents (the seed's step 9 a-d). Pure.

``reconcile(current, incoming)`` is the whole decision a replica takes when a version of a document
arrives from another replica; it returns what to write. The parts:

- **Same or descended** (step 9a). Take the version with the higher sequence number; look up, in its
  ``$Revisions``, the entry for the other's sequence number; if it is the other's version (time and
  origin) the higher one descends from the other and simply replaces it. Equal sequence numbers with
  equal stamps are the same version. A version a merge absorbed (``Doc.merged``) counts as an
  ancestor too. Anything else has **diverged**.
- **Winner** (9b), fully deterministic so every server picks the same one: the higher sequence number,
  then the later sequence time (the seed's rule), then a deletion over an update, then the greater
  origin (database identifier). A deletion is a version like any other: Domino's extra rule (a
  deletion wins unless the update is newer, whatever the sequence numbers) is not transitive, and with
  three replicas the outcome then depended on the order sessions met the versions (they never
  converged). The update that loses to a deletion is dropped, as in Domino.
- **Merge** (9c) is not made by a session (issue 28): a pairwise field merge is not associative over
  three lines (X and Y merge when they meet first; met by a third line Z first, each loses to it on
  its own), and any merge made on what one replica knows can be split so by a line it has not seen.
  Whatever the order sessions meet the lines, a replica ends with the same winner and conflict
  documents only if reconcile never makes a version of its own from two. A form with merge on gets
  its field merge as an edit instead: ``merge_conflicts`` (``DocDB.merge_conflicts``) makes, on one
  replica, the next version of the document with the changes of its live conflict documents that
  touch other fields, absorbing them (``Doc.merged``): a user's edit, replicated like any other.
- **Conflict document** (9d): the server holding the loser keeps the winner and writes a conflict
  document: the loser's fields plus ``$Conflict`` and ``$Ref`` (the UNID), with a UNID and an OID
  derived from the losing version only (and the loser's line), so it is identical wherever it is made.
- **Leaves only** (``settle``): a conflict document stands for a losing *leaf* of the union of the
  lines. One that turns out not to be one (its version, or for a retirement the version it retired,
  is an ancestor of the document or of another conflict document: a conflict found at version 2 of a
  line and again at 3, a loser that later won, the ancestor of the winner that met a third line
  first) is removed with no trace: a record of it would exist or not by the order sessions met the
  lines. A live conflict document of a deleted document is retired (a deletion made from it only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import Enum
from typing import Iterable

from .document import CONFLICT_FIELD, REF_FIELD, Doc
from .ids import Stamp, conflict_unid


class Kind(str, Enum):
    NEW = "new"  # the replica had no such document
    UPDATED = "updated"  # the incoming version descends from the current one
    DELETED = "deleted"  # ... and is a deletion stub
    SAME = "same"  # already this version
    OLDER = "older"  # the current version descends from the incoming one
    KEPT = "kept"  # diverged, the current version won: nothing changes here (the other side holds the loser)
    CONFLICT = "conflict"  # diverged, the current version lost: winner written, conflict document made
    MERGED = "merged"  # not made by reconcile since issue 28 (see Merge above); kept in the reports' shape


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    write: Doc | None = None  # the new version of the document on this replica
    conflict_doc: Doc | None = None  # a conflict document to create on this replica
    record: Doc | None = None  # a deleted conflict document recording the version dropped (``dropped_record``)


def descends(hi: Doc, lo: Doc) -> bool:
    """True if version ``lo`` is ``hi`` or one of its ancestors."""
    return knows(hi, lo.stamp)


def diverged(a: Doc, b: Doc) -> bool:
    return not descends(a, b) and not descends(b, a)


def winner(a: Doc, b: Doc) -> Doc:
    """The winning version of two diverged versions: the higher sequence number, then the later
    sequence time, then a deletion over an update, then the origin. One total order, so the outcome
    does not depend on the order sessions meet the versions in: Domino's own pairwise rule (a
    deletion wins unless the update is newer, whatever the sequence numbers) is not transitive, and
    three replicas could then keep different versions for good (found by a review; see DESIGN.md)."""
    return a if _rank(a) >= _rank(b) else b


def _rank(d: Doc) -> tuple:
    return (d.seq, d.time_us, d.deleted, d.origin)


def common_seq(a: Doc, b: Doc) -> int:
    """The sequence number of the last version both lines share (0 if none)."""
    for k in range(min(a.seq, b.seq), 0, -1):
        if a.stamp_at(k) == b.stamp_at(k):
            return k
    return 0


def changed_fields(d: Doc, since: int) -> set[str]:
    return {f for f, s in d.field_seqs.items() if s > since}


def merge_conflicts(current: Doc, conflicts: Iterable[Doc], time_us: int, origin: str) -> Doc | None:
    """The field merge of the seed's step 9c, as an edit: the next version of ``current`` (made at
    ``time_us`` by ``origin``) with the changes of each live conflict document of it whose fields since
    their last common version touch none that ``current`` (or a conflict merged before it, best first)
    changed; it absorbs their lines (``Doc.merged``), so they are ancestors of it and ``settle`` removes
    their conflict documents. None if the form's merge is off, the document is deleted or a conflict
    document, or no conflict document merges. Not called by ``reconcile``: a merge made by a session
    depends on which lines met first (see the module's note); made by one replica as an edit, it is
    history like any other edit, and replicates as one."""
    if not current.merge or current.deleted or current.is_conflict:
        return None
    fields: dict = {}
    removed: set[str] = set()  # fields a conflict's line took out (a CouchDB client's edit can)
    absorbed: list[Stamp] = []
    for c in sorted((c for c in conflicts if not c.deleted and c.is_conflict), key=_rank, reverse=True):
        k = common_seq(current, c)
        if k == 0:
            continue
        mine = changed_fields(current, k) | set(fields) | removed
        theirs = changed_fields(c, k) - {CONFLICT_FIELD, REF_FIELD}
        if mine & theirs:
            continue
        fields.update((f, c.fields[f]) for f in theirs if f in c.fields)
        removed |= {f for f in theirs if f not in c.fields}
        absorbed += [Stamp(*c.stamp_at(j)) for j in range(k + 1, c.seq + 1)] + list(c.merged)
    if not absorbed:
        return None
    m = current.next_version(time_us, origin, fields)
    if removed:  # the change that removal was goes into the merge too, as ``couch.new_edit`` records one
        m = replace(m, fields={f: v for f, v in m.fields.items() if f not in removed},
                    field_seqs={**m.field_seqs, **{f: m.seq for f in removed}})
    return replace(m, merged=tuple(dict.fromkeys(current.merged + tuple(absorbed))))


def conflict_document(loser: Doc) -> Doc:
    """The conflict document for a losing version: its fields, ``$Conflict``, ``$Ref``; it keeps the
    loser's line (sequence number, ``$Revisions``, merged versions), so that it is the same branch that
    a CouchDB client holds as a ``_conflicts`` leaf (``couch.py``), and a later edit or deletion of it
    continues that branch."""
    fields = {**loser.fields, CONFLICT_FIELD: 1, REF_FIELD: loser.unid}
    fs = {**loser.field_seqs, CONFLICT_FIELD: loser.seq, REF_FIELD: loser.seq}
    return Doc(conflict_unid(loser.unid, loser.stamp), loser.form, fields, loser.seq, loser.time_us, loser.origin,
               loser.revisions, fs, loser.deleted, False, loser.merged)


def retired(c: Doc) -> Doc:
    """Conflict document ``c`` deleted with its deleted document, or the record of an update a deletion
    beat: the next version, a deletion made from ``c`` only (its origin derived from ``c``'s stamp, so
    the same wherever it is made and ``retirement_of`` knows it)."""
    return replace(c.next_version(c.time_us, _retired_origin(c.unid, tuple(c.stamp)), deleted=True), merge=c.merge)


def _retired_origin(unid: str, s: tuple | None) -> str:
    return "d" + hashlib.sha256(f"superseded|{unid}|{tuple(s) if s else None}".encode()).hexdigest()[:15]


def retirement_of(c: Doc) -> tuple | None:
    """The version a retirement (a deletion ``retired`` made) retired, as ``(seq, time_us, origin)``;
    None if ``c`` is not one (its origin is derived from its parent, so this is a test of the stamp)."""
    if not c.deleted or c.seq < 2:
        return None
    parent = c.stamp_at(c.seq - 1)
    return parent if c.origin == _retired_origin(c.unid, parent) else None


def knows_retirement(unid: str, st: tuple, docs: Iterable[Doc | None]) -> bool:
    """True if ``st`` (``(seq, time_us, origin)``) is the retirement (``retired``) of a version that one
    of ``docs`` (a family of document ``unid``) holds on its line or among its merged versions: the
    record ``settle`` removes once the version it retired is not a leaf. A CouchDB client that pulled it
    while it was one still holds it; the family must know it, or the client pushes it back as a
    deletion that lost (``couch.plan``), a record of its own that this family never had."""
    seq, t, origin = st
    if seq < 2:
        return False
    for d in docs:
        if d is None:
            continue
        p = d.stamp_at(seq - 1)
        if p is not None and p[1] == t:  # the conflict document it retired was made for p or, edited, for an ancestor
            line = (d.stamp_at(j) for j in range(seq - 1, 0, -1))
            if any(a is not None and origin == _retired_origin(conflict_unid(unid, Stamp(*a)), tuple(p)) for a in line):
                return True
        for m in d.merged:
            if m[0] == seq - 1 and m[1] == t and origin == _retired_origin(conflict_unid(unid, m), tuple(m)):
                return True
    return False


def not_a_leaf(c: Doc, current: Doc | None, conflicts: Iterable[Doc]) -> bool:
    """True if conflict document ``c`` stands for no losing leaf: the version it was made for (for a
    retirement, the version retired) is an ancestor of ``current`` or of another conflict document."""
    s = retirement_of(c) or c.stamp_at(c.seq)
    return (current is not None and knows(current, s)) or any(o.unid != c.unid and knows(o, s) for o in conflicts)


@dataclass(frozen=True)
class Settled:
    """What ``settle`` says to do with a document's conflict documents."""

    retire: tuple[Doc, ...] = ()  # deletions to write (``retired``)
    remove: tuple[str, ...] = ()  # UNIDs of conflict documents to remove with no trace


def settle(current: Doc | None, conflicts: Iterable[Doc]) -> Settled:
    """The conflict documents of one document brought in line with it (run with every write that
    touches the family): those that stand for no losing leaf (``not_a_leaf``) are removed with no
    trace, so the records a family holds are a function of the union of its lines and not of the
    order the lines met (issue 28: a record made for the winner's ancestor that met a third line
    first, and retired when the winner came, existed only in that order). A live conflict document is
    retired (``retired``) if the document is deleted (it takes them with it: CouchDB would otherwise
    make a conflict the winner of a deleted document), or if a deletion that lost ranks above it
    (``deletion_record``): Domino drops an update a deletion beats, and that update met the deletion
    first on some replica and not on another (seed 1128), so whether it was dropped must not depend on
    which it met first."""
    conflicts = list(conflicts)
    remove = [c.unid for c in conflicts if not_a_leaf(c, current, conflicts)]
    kept = [c for c in conflicts if c.unid not in remove]
    gone = current is not None and current.deleted
    top_deletion = max((_rank(c) for c in kept if deletion_record(c)), default=None)
    retire = [retired(c) for c in kept if not c.deleted
              and (gone or (top_deletion is not None and top_deletion > _rank(c)))]
    return Settled(tuple(retire), tuple(remove))


def deletion_record(c: Doc) -> bool:
    """True if conflict document ``c`` is the record of a deletion of its document that lost (its own
    stamp names it: ``conflict_document`` of that deletion), not a retirement or a deleted conflict."""
    ref = c.fields.get(REF_FIELD)
    return c.deleted and isinstance(ref, str) and c.unid == conflict_unid(ref, c.stamp)


def reconcile(current: Doc | None, incoming: Doc) -> Outcome:
    """What a replica holding ``current`` (None: nothing) does when ``incoming`` arrives."""
    if current is None:
        return Outcome(Kind.DELETED if incoming.deleted else Kind.NEW, incoming)
    if current.stamp == incoming.stamp:
        return Outcome(Kind.SAME)
    if descends(incoming, current):
        return Outcome(Kind.DELETED if incoming.deleted else Kind.UPDATED, incoming)
    if descends(current, incoming):
        return Outcome(Kind.OLDER)
    w = winner(current, incoming)
    loser = incoming if w is current else current
    if w is current:  # (no merge here: see the module's note on step 9c)
        return Outcome(Kind.KEPT)
    # This replica holds the loser: it takes the winner and keeps the loser as a conflict document,
    # unless a deletion is involved (a deleted loser has nothing to keep; Domino drops an update that
    # a later deletion beat); what is dropped leaves a deleted record (``dropped_record``).
    conflict = None if (loser.deleted or w.deleted) else conflict_document(loser)
    return Outcome(Kind.CONFLICT if conflict else (Kind.DELETED if w.deleted else Kind.UPDATED), w, conflict,
                   dropped_record(loser, w))


def dropped_record(loser: Doc, w: Doc) -> Doc | None:
    """The record a dropped losing version leaves: a deleted conflict document (a deletion that lost: its
    conflict document, deleted; an update a deletion beat: its conflict document, retired at once). Its
    line is the dropped line, ended by a deletion, so the line reads dead wherever it went (a CouchDB
    client holding it gets a tombstone under it: ``couch.py``) and a conflict document found later for a
    version of it is not a leaf (``settle``). None when nothing is dropped (two live versions: a conflict)."""
    if loser.deleted:
        return conflict_document(loser)
    if w.deleted:
        return retired(conflict_document(loser))
    return None


def knows(current: Doc | None, incoming: tuple) -> bool:
    """Quick test on a change list entry: True if a replica holding ``current`` already has version
    ``incoming`` or a descendant of it, so the document need not be fetched."""
    if current is None or incoming[0] > current.seq:
        return False
    return current.stamp_at(incoming[0]) == incoming or (bool(current.merged) and incoming in current.merged)
