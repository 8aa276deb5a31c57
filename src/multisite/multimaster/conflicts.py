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
- **Merge** (9c): if the winner's form has merge on and neither is a deletion, find the last version
  both lines share (the common ancestor ``c``); the fields each side changed are those with a field
  sequence number above ``c``. If the sets do not overlap, the result is one merged version made
  deterministically from the two (sequence number winner+1, time max+1, an origin derived from both),
  so two servers merging the same pair make the identical document.
- **Conflict document** (9d): otherwise the server holding the loser keeps the winner and writes a
  conflict document: the loser's fields plus ``$Conflict`` and ``$Ref`` (the UNID), with a UNID and
  an OID derived from the losing version only (and the loser's line), so it is identical wherever it
  is made. A conflict document whose version the document or another conflict document later
  descends from is deleted (``superseded``): its losing line went on elsewhere.
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
    MERGED = "merged"  # diverged, merged field by field


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


def try_merge(w: Doc, l: Doc) -> Doc | None:  # noqa: E741 - w/l: winner/loser
    """The merged version of winner ``w`` and loser ``l`` if the form allows it and their changes since
    the common ancestor touch different fields; None otherwise."""
    if not w.merge or w.deleted or l.deleted or w.is_conflict or l.is_conflict:
        return None
    c = common_seq(w, l)
    if c == 0:
        return None
    cw, cl = changed_fields(w, c), changed_fields(l, c)
    if cw & cl:
        return None
    seq = w.seq + 1
    fields = dict(w.fields)
    fs = dict(w.field_seqs)
    for f in cl:
        if f in l.fields:
            fields[f] = l.fields[f]
        fs[f] = seq
    h = hashlib.sha256(f"merge|{w.unid}|{tuple(w.stamp)}|{tuple(l.stamp)}".encode()).hexdigest()[:16]
    absorbed = tuple(Stamp(*l.stamp_at(k)) for k in range(c + 1, l.seq + 1))  # the loser's line after divergence
    merged = tuple(dict.fromkeys(w.merged + l.merged + absorbed))  # ordered, no repeats
    return Doc(w.unid, w.form, fields, seq, max(w.time_us, l.time_us) + 1, "m" + h[1:],
               w.revisions + ((w.time_us, w.origin),), fs, False, True, merged)


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
    """Conflict document ``c`` deleted because its version is no longer a losing leaf (``superseded``):
    the next version, a deletion made from ``c`` only, so the same wherever it is made."""
    h = hashlib.sha256(f"superseded|{c.unid}|{tuple(c.stamp)}".encode()).hexdigest()[:15]
    return replace(c.next_version(c.time_us, "d" + h, deleted=True), merge=c.merge)


def superseded(current: Doc | None, conflicts: Iterable[Doc]) -> list[Doc]:
    """The deletions (``retired``) of the live conflict documents of one document that no longer lose to
    it: its version the document, or another conflict document, descends from (that losing line went on
    there: a conflict found at version 2 of a line and again at its version 3, a loser that later won, a
    line that was deleted), or the document is deleted (it takes its conflicts with it; CouchDB would
    otherwise make a conflict the winner)."""
    conflicts = list(conflicts)
    gone = current is not None and current.deleted
    return [retired(c) for c in conflicts if not c.deleted and (gone or (current is not None and knows(current, c.stamp))
                                                               or any(o is not c and knows(o, c.stamp) for o in conflicts))]


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
    merged = try_merge(w, loser)
    if merged is not None:
        return Outcome(Kind.MERGED, merged)
    if w is current:
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
    version of it is ``superseded``. None when nothing is dropped (two live versions: a conflict)."""
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
