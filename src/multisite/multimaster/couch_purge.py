"""``POST /{db}/_purge``: which stored versions go when a client purges revisions. Pure.

A purge removes leaf revisions completely, leaving no tombstone: in multisite terms, the stored
versions that are those leaves. A conflict document's leaf removes that conflict document. The
document's own leaf removes the document's version; if conflict documents remain, the best of them
(CouchDB's rank: live first, then position, then hash) becomes the document (its fields without
``$Conflict`` and ``$Ref``), as CouchDB's next leaf becomes the winner; with none left the document is
gone. A revision that is not a leaf, or a tombstone multisite derives (``couch.Tree``'s made-up
leaves), is not purged and not listed in the answer, as CouchDB ignores what it does not have.

A purge is local, in CouchDB as here: a replica (multisite's or a client's) that still holds the
purged version sends it back when it next replicates it (a new edit there, or a client that starts
over); purge it on every replica that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .couch import Family, Tree, parse_rev, rev_hash
from .couch_errors import bad_request
from .document import CONFLICT_FIELD, REF_FIELD, Doc

MAX_PURGE_DOCS = 100  # documents of one request (CouchDB's max_document_id_number)
MAX_PURGE_REVS = 1000  # revisions of one request (CouchDB's max_revisions_number)


@dataclass
class PurgePlan:
    """What purging revisions of one document does: the rows removed, the versions written."""

    purged: list[str] = field(default_factory=list)  # the revisions purged, as asked
    removes: list[str] = field(default_factory=list)  # UNIDs whose stored version goes
    writes: list[Doc] = field(default_factory=list)  # a conflict document become the document


def check_request(body: Any) -> dict[str, list[str]]:
    """The ``{doc id: [revisions]}`` of a ``_purge`` body; CouchError 400 naming what is wrong. The
    bounds are checked first, by counting alone (documents, then revisions), so that a body far past
    them costs no more than its length before it is refused; only then is each revision parsed."""
    if not isinstance(body, dict):
        raise bad_request("_purge takes a JSON object of document ids to lists of revisions")
    if len(body) > MAX_PURGE_DOCS:
        raise bad_request(f"_purge takes at most {MAX_PURGE_DOCS} documents a request")
    total = 0
    for doc_id, revs in body.items():
        if not isinstance(revs, list):
            raise bad_request(f"_purge: the revisions of {doc_id!r:.80} must be a list of revision ids")
        total += len(revs)
    if total > MAX_PURGE_REVS:
        raise bad_request(f"_purge takes at most {MAX_PURGE_REVS} revisions a request")
    for doc_id, revs in body.items():
        if not all(isinstance(r, str) for r in revs):
            raise bad_request(f"_purge: the revisions of {doc_id!r:.80} must be a list of revision ids")
        for r in revs:
            parse_rev(r)
    return body


def _rank(d: Doc) -> tuple:
    return (not d.deleted, d.seq, rev_hash(d.time_us, d.origin))


def plan_purge(fam: Family, revs: list[str]) -> PurgePlan:
    """Purge the leaves ``revs`` of ``fam`` (the document and its conflict documents)."""
    p = PurgePlan()
    tree = Tree(fam)
    gone: set[str] = set()
    for rev in dict.fromkeys(revs):
        lf = tree.leaf(rev)
        if lf is None or lf.doc is None or lf.doc.unid in gone:
            continue
        p.purged.append(rev)
        gone.add(lf.doc.unid)
    cur = fam.current
    if cur is not None and cur.unid in gone:
        left = sorted((c for c in fam.conflicts if c.unid not in gone), key=_rank, reverse=True)
        if left:
            best = left[0]
            gone.add(best.unid)
            keep = {k: v for k, v in best.fields.items() if k not in (CONFLICT_FIELD, REF_FIELD)}
            seqs = {k: v for k, v in best.field_seqs.items() if k in keep}
            p.writes.append(replace(best, unid=fam.unid, fields=keep, field_seqs=seqs))
            gone.discard(fam.unid)  # rewritten, not removed
    elif cur is not None and gone:
        p.writes.append(cur)  # the same version again: the document's tree changed, it is listed again
    p.removes = sorted(gone)
    return p
