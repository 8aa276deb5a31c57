"""One history, two vocabularies: multi-master documents as CouchDB sees them. Pure.

A CouchDB client (PouchDB, CouchDB's replicator) replicates with a document server over HTTP
(``server/couch_http.py``); this module decides everything that exchange needs, so that the I/O
around it only reads, writes and moves bytes.

**Names.** A document's ``_id`` is its UNID; a document a CouchDB client made under another ``_id``
gets the UNID ``unid_for(_id)`` (the id's first bytes and a hash of it, the same on every server) and
keeps its ``_id`` in the field ``$CouchId`` (which a deletion stub keeps too). The form travels as the body member ``$Form``,
left out for the form ``Document``, which a client's documents get.

**Revisions.** A version ``(seq, time_us, origin)`` is the revision ``seq-<time_us as 16 hex
digits><origin>`` (32 hex digits for a server's own edits); ``$Revisions`` gives the ancestors, so a
document's line is a path of the revision tree, and a revision a client made reads back as a version
whose time is the first 16 hex digits of its hash and whose origin is the rest. So CouchDB's winner
rule (the higher position, then the higher hash as a string) is the seed's (the higher sequence
number, then the later time, then the origin) on the same versions: both pick the same one.

**The tree of a document** (``Family``: the document and its conflict documents) is derived, never
stored: its line; each conflict document's line (``conflict_document`` keeps the loser's), a
``_conflicts`` leaf while live, a tombstone once deleted; and deleted leaves the seed's rule implies
but CouchDB's would not (``Leaf`` with no ``doc``): a tombstone under each version a merge absorbed
(``Doc.merged``) and, while the document is deleted, under each live conflict document. CouchDB
prefers any live leaf to every deleted one, while the seed lets a deletion beat an update; those
tombstones, and the records of dropped versions, are what make the two rules agree on every document.

**Writes from a client** (``plan``): a revision already in the tree changes nothing; otherwise it is
a version of the document, reconciled as a replica's would be (``conflicts.reconcile``), with what
the client's replica would keep, and a client cannot, kept here: a version that loses gets its
conflict document, or the deleted record of a dropped version (``conflicts.dropped_record``: a
deletion that lost, an update a deletion beat: so the client's leaf gets a tombstone); a deletion that
descends from a conflict document deletes that one (how a conflict is resolved in CouchDB); a conflict
document whose version the document (or another conflict) now descends from is removed
(``conflicts.settle``: it stands for no losing leaf). A tombstone on a branch already dead changes nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

import msgspec

from .conflicts import (
    Kind,
    conflict_document,
    descends,
    dropped_record,
    knows,
    knows_retirement,
    reconcile,
    settle,
)
from .couch_atts import ATT_PREFIX, has_stubs, incoming, render, resolve
from .couch_errors import CouchError, bad_request
from .document import CONFLICT_FIELD, COUCH_ID_FIELD, KEPT_WHEN_DELETED, REF_FIELD, Doc
from .ids import MAX_SEQ, Stamp

DEFAULT_FORM = "Document"  # the form of a document a CouchDB client made without ``$Form``
FORM_KEY = "$Form"
SYSTEM_FIELDS = frozenset({COUCH_ID_FIELD, CONFLICT_FIELD, REF_FIELD})
MAX_DOC_ID_BYTES = 2048
MAX_REV_HASH_CHARS = 80
MAX_DOCUMENT_BYTES = 8_000_000  # CouchDB's own default max_document_size
STEM = (0, "~")  # an ancestor a client's ``_revisions`` left out (stemmed): unknown, never sent
_HEX = frozenset("0123456789abcdef")
_UNID = re.compile(r"^[0-9a-f]{32}$")
_DB_NAME = re.compile(r"^[a-z][a-z0-9_$()+-]*$")
_encode_msgpack = msgspec.msgpack.Encoder().encode


# -- names ----------------------------------------------------------------------------------------
@lru_cache(maxsize=65536)  # the same ids come in _revs_diff, then _bulk_docs
def unid_for(doc_id: str) -> str:
    """The UNID of the document whose CouchDB ``_id`` is ``doc_id``: itself when it is one, else the
    id's first 8 bytes (zero-padded; a UNID's creation time elsewhere) and 8 bytes of a hash of all of
    it: ids that share a prefix (``order:2024-...``) keep their documents near one another on disk."""
    if _UNID.match(doc_id):
        return doc_id
    raw = doc_id.encode()
    return raw[:8].ljust(8, b"\0").hex() + hashlib.sha256(b"couch-id|" + raw).hexdigest()[:16]


def check_doc_id(doc_id: Any) -> str:
    if not isinstance(doc_id, str) or not doc_id:
        raise CouchError(400, "bad_request", "Document id must be a string")
    if doc_id.startswith("_") and not doc_id.startswith("_design/"):
        raise CouchError(400, "illegal_docid", "Only reserved document ids may start with underscore.")
    if len(doc_id.encode()) > MAX_DOC_ID_BYTES:
        raise CouchError(400, "illegal_docid", f"Document id is longer than {MAX_DOC_ID_BYTES} bytes")
    return doc_id


def couch_id(d: Doc) -> str:
    """The ``_id`` of ``d`` (a conflict document: that of the document it belongs to)."""
    cid = d.fields.get(COUCH_ID_FIELD)
    if isinstance(cid, str):
        return cid
    return d.fields[REF_FIELD] if d.is_conflict else d.unid


def db_name(title: str) -> str:
    """The name of a database in URLs: its title in lower case, each character CouchDB does not allow
    in a name made ``-``, ``db-`` in front unless it starts with a letter."""
    s = re.sub(r"[^a-z0-9_$()+-]", "-", title.strip().lower())
    return s if s[:1].isalpha() and s[:1].isascii() else "db-" + s


def check_db_name(name: str) -> str:
    if not _DB_NAME.match(name):
        raise CouchError(400, "illegal_database_name",
                         f"Name: '{name}'. Only lowercase characters (a-z), digits (0-9), and any of the characters "
                         f"_, $, (, ), +, - are allowed. Must begin with a letter.")
    return name


# -- revisions ------------------------------------------------------------------------------------
def rev_hash(time_us: int, origin: str) -> str:
    return f"{time_us:016x}{origin}"


def rev_of(seq: int, time_us: int, origin: str) -> str:
    return f"{seq}-{time_us:016x}{origin}"


def doc_rev(d: Doc) -> str:
    return rev_of(d.seq, d.time_us, d.origin)


def stamp_of_hash(h: Any) -> tuple[int, str]:
    """``(time_us, origin)`` of a revision hash; CouchError (CouchDB's "Invalid rev format") if it is
    not 16 hex digits and an origin (every hash CouchDB and PouchDB make is 32 hex digits)."""
    if (not isinstance(h, str) or not 17 <= len(h) <= MAX_REV_HASH_CHARS or not _HEX.issuperset(h[:16])
            or not h.isascii() or not h[16:].isprintable() or " " in h):
        raise bad_request("Invalid rev format")
    t = int(h[:16], 16)
    if t == 2**64 - 1:
        raise bad_request("Invalid rev format")
    return t, h[16:]


def parse_rev(rev: Any) -> Stamp:
    """The version ``(seq, time_us, origin)`` a revision id names; CouchError when malformed."""
    if not isinstance(rev, str):
        raise bad_request("Invalid rev format")
    pos, sep, h = rev.partition("-")
    if not sep or not pos.isdigit() or not pos.isascii() or not 1 <= len(pos) <= 10 or not 1 <= int(pos) <= MAX_SEQ:
        raise bad_request("Invalid rev format")
    t, o = stamp_of_hash(h)
    return Stamp(int(pos), t, o)


def line_hashes(d: Doc) -> list[str]:
    """The hashes of ``d``'s line, newest first, down to the oldest known ancestor (``_revisions.ids``)."""
    out = [rev_hash(d.time_us, d.origin)]
    for t, o in reversed(d.revisions):
        if (t, o) == STEM:
            break
        out.append(rev_hash(t, o))
    return out


# -- documents ------------------------------------------------------------------------------------
def body_of(d: Doc, atts: int | None = None) -> dict:
    """The CouchDB body of ``d``: its fields but the system ones, ``$Form`` unless it is the default,
    and its attachments (``couch_atts.render``: stubs, or data of those changed after ``atts``)."""
    out = {}
    has_atts = False
    for k, v in d.fields.items():
        if k.startswith("$"):
            if k.startswith(ATT_PREFIX):
                has_atts = True
                continue
            if k in SYSTEM_FIELDS:
                continue
        out[k] = v
    if has_atts and (rendered := render(d.fields, atts)) is not None:
        out["_attachments"] = rendered
    if d.form != DEFAULT_FORM:
        out[FORM_KEY] = d.form
    return out


def to_json(d: Doc, seq: int | None = None, h: str | None = None, *, deleted: bool | None = None,
            revs: bool = False, path: list[str] | None = None, extra: dict | None = None,
            atts: int | None = None) -> dict:
    """The document ``d`` as CouchDB sends it (``_id``, ``_rev``, the body, ``_revisions`` with ``revs``;
    attachments as ``body_of`` gives them for ``atts``)."""
    seq = d.seq if seq is None else seq
    h = rev_hash(d.time_us, d.origin) if h is None else h
    deleted = d.deleted if deleted is None else deleted
    out: dict[str, Any] = {"_id": couch_id(d), "_rev": f"{seq}-{h}"}
    if deleted:
        out["_deleted"] = True
    else:
        out.update(body_of(d, atts))
    if revs:
        out["_revisions"] = {"start": seq, "ids": path if path is not None else line_hashes(d)}
    if extra:
        out.update(extra)
    return out


_SPECIAL_OK = frozenset({"_id", "_rev", "_revisions", "_deleted", "_conflicts", "_deleted_conflicts",
                         "_revs_info", "_local_seq"})


def fields_of(body: dict, doc_id: str, unid: str) -> tuple[str, dict]:
    """``(form, fields)`` of a CouchDB body; CouchError for members CouchDB or multisite reserve."""
    fields = {}
    form = DEFAULT_FORM
    for k, v in body.items():
        if k.startswith("_"):
            if k == "_attachments":
                continue  # couch_atts.incoming: fields of their own
            if k not in _SPECIAL_OK:
                raise CouchError(400, "doc_validation", f"Bad special document member: {k}")
            continue
        if k in SYSTEM_FIELDS or k.startswith(ATT_PREFIX):
            raise CouchError(400, "doc_validation", f"Bad document member: {k:.80} is reserved by multisite")
        if k == FORM_KEY:
            if not isinstance(v, str) or not v:
                raise CouchError(400, "doc_validation", f"{FORM_KEY} must be a non-empty string (the form)")
            form = v
            continue
        fields[k] = v
    if unid != doc_id:
        fields[COUCH_ID_FIELD] = doc_id
    try:
        _encode_msgpack(fields)  # an integer beyond 64 bits cannot be stored
    except (OverflowError, TypeError, ValueError) as e:
        raise CouchError(400, "doc_validation", f"document {doc_id!r:.80} has a value that cannot be stored: {e}")
    return form, fields


def from_couch(body: Any) -> Doc:
    """The version a client sends with ``new_edits: false``: its ``_rev`` and ``_revisions`` give the
    version and its line (ancestors stemmed away are ``STEM``); every field counts as changed in it."""
    if not isinstance(body, dict):
        raise bad_request("Document must be a JSON object")
    doc_id = check_doc_id(body.get("_id"))
    if "_rev" not in body:
        raise bad_request("_rev is required with new_edits: false")
    st = parse_rev(body["_rev"])
    revisions = _ancestors(body.get("_revisions"), st)
    unid = unid_for(doc_id)
    deleted = body.get("_deleted") is True
    form, fields = fields_of(body, doc_id, unid)
    fields.update(incoming(body.get("_attachments"), st.seq, keep_revpos=True))
    if deleted:
        fields = {COUCH_ID_FIELD: doc_id} if unid != doc_id else {}
    return Doc(unid, form, fields, st.seq, st.time_us, st.origin, revisions, {k: st.seq for k in fields},
               deleted, False, ())


def _ancestors(revisions: Any, st: Stamp) -> tuple[tuple[int, str], ...]:
    """``$Revisions`` of the version ``st`` from a client's ``_revisions`` (``{start, ids}``)."""
    if revisions is None:
        return (STEM,) * (st.seq - 1)
    if (not isinstance(revisions, dict) or not isinstance(revisions.get("ids"), list)
            or revisions.get("start") != st.seq or not revisions["ids"]
            or revisions["ids"][0] != rev_hash(st.time_us, st.origin) or len(revisions["ids"]) > st.seq):
        raise bad_request("_revisions do not match _rev (start is the position of _rev, ids[0] its hash, "
                          "then its ancestors, newest first)")
    known = [stamp_of_hash(h) for h in revisions["ids"][1:]]
    return (STEM,) * (st.seq - 1 - len(known)) + tuple(reversed(known))


# -- the tree of a document -----------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """A document (None: never seen) and its conflict documents, live and deleted."""

    unid: str
    current: Doc | None
    conflicts: tuple[Doc, ...] = ()

    def doc_id(self) -> str | None:
        for d in (self.current, *self.conflicts):
            if d is not None:
                return couch_id(d)
        return None


@dataclass(frozen=True)
class Leaf:
    seq: int
    hash: str
    deleted: bool
    below: tuple[str, ...] | None  # a made-up tombstone's ancestors' hashes (None: the line of ``doc``)
    doc: Doc | None  # the version whose body this is (None: a tombstone made up here, see tombstone)

    @cached_property
    def path(self) -> tuple[str, ...]:
        """_revisions.ids: this leaf's hash first, then its ancestors', newest first."""
        return (self.hash, *self.below) if self.below is not None else tuple(line_hashes(self.doc))

    @property
    def rev(self) -> str:
        return f"{self.seq}-{self.hash}"

    def rank(self) -> tuple:  # CouchDB's winner rule: live first, then position, then hash
        return (not self.deleted, self.seq, self.hash)

    def json(self, doc_id: str, *, revs: bool = False, extra: dict | None = None, atts: int | None = None) -> dict:
        if self.doc is None:
            out: dict[str, Any] = {"_id": doc_id, "_rev": self.rev, "_deleted": True}
            if revs:
                out["_revisions"] = {"start": self.seq, "ids": list(self.path)}
            if extra:
                out.update(extra)
            return out
        return to_json(self.doc, self.seq, self.hash, deleted=self.deleted, revs=revs, path=list(self.path),
                       extra=extra, atts=atts)


def tombstone_stamp(unid: str, s: tuple) -> Stamp:
    """The made-up deletion under version ``s`` of document ``unid``: the same on every server."""
    h = hashlib.sha256(f"tomb|{unid}|{s[0]}|{s[1]}|{s[2]}".encode()).hexdigest()[:15]
    return Stamp(s[0] + 1, 0, "d" + h)


def _tombstone(unid: str, s: tuple, below: tuple[str, ...]) -> Leaf:
    t = tombstone_stamp(unid, s)
    h = rev_hash(t.time_us, t.origin)
    return Leaf(t.seq, h, True, (rev_hash(s[1], s[2]), *below), None)


def _line(d: Doc) -> tuple[str, ...]:
    return tuple(line_hashes(d))


class Tree:
    """The revision tree of a ``Family`` as CouchDB sees it: its leaves, winner, conflicts."""

    def __init__(self, fam: Family):
        self.fam = fam
        cur = fam.current
        self.made_up: set[tuple] = set()  # stamps of the tombstones made up here
        if cur is not None and not fam.conflicts and not cur.merged:  # a document that is its own line
            self.leaves = [Leaf(cur.seq, rev_hash(cur.time_us, cur.origin), cur.deleted, None, cur)]
            return
        leaves: list[Leaf] = []
        if cur is not None:
            leaves.append(Leaf(cur.seq, rev_hash(cur.time_us, cur.origin), cur.deleted, None, cur))
        live = [c for c in fam.conflicts if not c.deleted]
        for c in fam.conflicts:
            if cur is not None and knows(cur, c.stamp):
                continue  # its branch is the document's line now
            parent = c.stamp_at(c.seq - 1)
            if any(o is not c and knows(o, c.stamp) for o in fam.conflicts):
                continue  # another conflict goes on from it
            if c.deleted:
                if parent is not None and ((cur is not None and knows(cur, parent))
                                           or any(knows(o, parent) for o in live)):
                    continue  # a retirement whose branch goes on elsewhere (settle removes those)
                leaves.append(Leaf(c.seq, rev_hash(c.time_us, c.origin), True, None, c))
            elif cur is None or cur.deleted:
                leaves.append(self._made_up(fam.unid, tuple(c.stamp), _line(c)[1:]))
            else:
                leaves.append(Leaf(c.seq, rev_hash(c.time_us, c.origin), False, None, c))
        for d in (cur, *fam.conflicts):  # a tombstone under each version a merge absorbed
            for s in (d.merged if d is not None else ()):
                if cur is None or cur.stamp_at(s[0]) != tuple(s):  # (unless the line went on from it)
                    leaves.append(self._made_up(fam.unid, tuple(s), ()))
        uniq: dict[str, Leaf] = {}
        for lf in leaves:
            uniq.setdefault(lf.rev, lf)
        self.leaves = sorted(uniq.values(), key=Leaf.rank, reverse=True)

    def _made_up(self, unid: str, s: tuple, below: tuple[str, ...]) -> Leaf:
        lf = _tombstone(unid, s, below)
        self.made_up.add((lf.seq,) + stamp_of_hash(lf.hash))
        return lf

    @property
    def winner(self) -> Leaf | None:
        return self.leaves[0] if self.leaves else None

    @property
    def deleted(self) -> bool:
        return self.winner is None or self.winner.deleted

    def conflicts(self) -> list[str]:
        w = self.winner
        return [lf.rev for lf in self.leaves if lf is not w and not lf.deleted]

    def deleted_conflicts(self) -> list[str]:
        w = self.winner
        return [lf.rev for lf in self.leaves if lf is not w and lf.deleted]

    def knows(self, st: tuple) -> bool:
        """True if the revision ``st`` (``(seq, time_us, origin)``) is in the tree (a leaf or an ancestor)."""
        st = tuple(st)
        fam = self.fam
        if fam.current is not None and knows(fam.current, st):
            return True
        if any(knows(c, st) for c in fam.conflicts) or st in self.made_up:
            return True
        return knows_retirement(fam.unid, st, (fam.current, *fam.conflicts))  # a record settle removed

    def leaf(self, rev: str) -> Leaf | None:
        return next((lf for lf in self.leaves if lf.rev == rev), None)

    def latest(self, rev: str) -> list[Leaf]:
        """The leaves whose line holds ``rev`` (``latest=true``)."""
        seq, _, h = rev.partition("-")
        out = []
        for lf in self.leaves:
            k = lf.seq - int(seq)
            if 0 <= k < len(lf.path) and lf.path[k] == h:
                out.append(lf)
        return out


# -- writes from a client -------------------------------------------------------------------------
@dataclass
class Plan:
    """What applying a client's revisions to a ``Family`` writes: every new version, in order."""

    fam: Family
    writes: list[Doc] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)  # per revision: a Kind value, or "known", "ignored"
    removes: list[str] = field(default_factory=list)  # stored conflict documents to remove (``settle``)


def _deletion_of(c: Doc, v: Doc) -> Doc:
    """Conflict document ``c`` deleted by a client's tombstone ``v`` (which descends from it)."""
    keep = {k: c.fields[k] for k in KEPT_WHEN_DELETED if k in c.fields}
    return Doc(c.unid, c.form, keep, v.seq, v.time_us, v.origin, v.revisions,
               {**c.field_seqs, **{k: v.seq for k in keep}}, True, c.merge, c.merged)


def plan(fam: Family, versions: Iterable[Doc]) -> Plan:
    """Apply a client's versions of one document (``from_couch`` or ``new_edit``) to ``fam``, in order."""
    incoming_ = [_with_stubs_resolved(fam, v) for v in versions]
    if fam.current is None and not fam.conflicts and len(incoming_) == 1:  # a new document: the common case
        v = incoming_[0]
        return Plan(replace(fam, current=v), [v], [(Kind.DELETED if v.deleted else Kind.NEW).value])
    p = Plan(fam)
    for v in incoming_:
        p.outcomes.append(_apply(p, v))
    return p


def _with_stubs_resolved(fam: Family, v: Doc) -> Doc:
    """``v`` with its attachment stubs replaced by what the document's versions hold (412 if none)."""
    if not has_stubs(v.fields):
        return v
    sources = [d.fields for d in (fam.current, *fam.conflicts) if d is not None]
    return replace(v, fields=resolve(v.fields, couch_id(v), sources))


def _write(p: Plan, d: Doc) -> None:
    fam = p.fam
    if d.unid == fam.unid:
        p.fam = replace(fam, current=d)
    else:
        p.fam = replace(fam, conflicts=tuple(c for c in fam.conflicts if c.unid != d.unid) + (d,))
    p.writes = [w for w in p.writes if w.unid != d.unid] + [d]


def _apply(p: Plan, v: Doc) -> str:
    tree = Tree(p.fam)
    if tree.knows(v.stamp):
        return "known"
    cur = p.fam.current
    live = [c for c in p.fam.conflicts if not c.deleted]
    if v.deleted and not (cur is not None and descends(v, cur)):
        owner = next((c for c in live if descends(v, c)), None)
        if owner is not None:  # a conflict resolved by deleting its leaf
            _write(p, _deletion_of(owner, v))
            return "resolved"
        parent = v.stamp_at(v.seq - 1)
        if (parent is not None and parent[1:] != STEM and tree.knows(parent)
                and not any(knows(d, parent) for d in (cur, *live) if d is not None and not d.deleted)):
            return "ignored"  # a tombstone on a branch already dead here
    if cur is not None and cur.merged and descends(v, cur):
        v = replace(v, merged=tuple(dict.fromkeys(cur.merged + v.merged)))  # as next_version keeps them
    out = reconcile(cur, v)
    kind = out.kind
    if kind in (Kind.SAME, Kind.OLDER):
        return kind.value
    if kind is Kind.KEPT:  # the document's version wins; the client's loses: what its replica would keep
        _add_conflict(p, dropped_record(v, cur) or conflict_document(v))
    else:
        _write(p, out.write)
        for cd in (out.conflict_doc, out.record):
            if cd is not None:
                _add_conflict(p, cd)
    _supersede(p)
    return kind.value


def _add_conflict(p: Plan, cd: Doc) -> None:
    """Write conflict document (or record) ``cd`` unless it is there already (a record may retire it)."""
    old = next((c for c in p.fam.conflicts if c.unid == cd.unid), None)
    if old is None or (old.stamp != cd.stamp and descends(cd, old)):
        _write(p, cd)


def _supersede(p: Plan) -> None:
    """Bring the family's conflict documents in line with its document (``conflicts.settle``): retire
    those a deletion takes, remove those that stand for no losing leaf (stored ones with no trace)."""
    st = settle(p.fam.current, p.fam.conflicts)
    for d in st.retire:
        _write(p, d)
    if st.remove:
        gone = set(st.remove)
        p.fam = replace(p.fam, conflicts=tuple(c for c in p.fam.conflicts if c.unid not in gone))
        p.writes = [w for w in p.writes if w.unid not in gone]
        p.removes += [u for u in st.remove if u not in p.removes]


def new_edit(fam: Family, body: dict, doc_id: str, now_us: int, origin: str) -> Doc:
    """The version a client's write with ``new_edits: true`` makes: a child of its ``_rev`` (a leaf of
    the tree: the document's, or a conflict's to edit or delete it), or of nothing for a new document
    (or of a deleted one's tombstone). CouchError 409 when ``_rev`` is not a leaf."""
    tree = Tree(fam)
    rev = body.get("_rev")
    if rev is None:
        w = tree.winner
        if w is not None and not w.deleted:
            raise CouchError(409, "conflict", "Document update conflict.")
        parent = w
    else:
        parse_rev(rev)
        parent = tree.leaf(rev)
        if parent is None:
            raise CouchError(409, "conflict", "Document update conflict.")
    unid = unid_for(doc_id)
    deleted = body.get("_deleted") is True
    form, fields = fields_of(body, doc_id, unid)
    seq = 1 if parent is None else parent.seq + 1
    base = parent.doc if parent is not None else None
    atts = incoming(body.get("_attachments"), seq, keep_revpos=False)
    if atts:  # a stub keeps the edited version's attachment only, as CouchDB's (never a conflict's)
        fields.update(resolve(atts, doc_id, [base.fields] if base is not None and not parent.deleted else []))
    if deleted:
        fields = {COUCH_ID_FIELD: doc_id} if unid != doc_id else {}
    if parent is None:
        return Doc(unid, form, fields, 1, now_us, origin, (), {k: 1 for k in fields}, deleted, False, ())
    old_fields = base.fields if base is not None and not parent.deleted else {}
    old_seqs = base.field_seqs if base is not None else {}
    fs = {k: (old_seqs[k] if k in old_seqs and k in old_fields and old_fields[k] == v else seq)
          for k, v in fields.items()}
    fs.update({k: seq for k in old_fields if k not in fields})  # a removed field changed too
    revisions = tuple(reversed([stamp_of_hash(h) for h in parent.path]))
    revisions = (STEM,) * (parent.seq - len(revisions)) + revisions
    merge = base.merge if base is not None else False
    return Doc(unid, form, fields, seq, now_us, origin, revisions, fs, deleted, merge, ())


# -- sequences and checkpoints --------------------------------------------------------------------
def seq_text(changeno: int, db_id: str) -> str:
    """The ``seq`` of change number ``changeno`` of database ``db_id`` (opaque to clients)."""
    return f"{changeno}-{db_id}"


def parse_since(since: Any, db_id: str, last: int) -> int:
    """The change number to list changes after. A ``since`` of another database, or past the last
    change (a restored backup), starts again from 0, as CouchDB does with a sequence of other shards:
    a client then gets every document again and loses nothing. CouchError when malformed."""
    if since is None or since == "" or since == 0 or since == "0":
        return 0
    if since == "now":
        return last
    s = str(since)
    n, sep, who = s.partition("-")
    if not n.isdigit() or not n.isascii() or len(n) > 19 or (sep and not who):
        raise bad_request("Malformed sequence supplied in 'since' parameter.")
    k = int(n)
    if (sep and who != db_id) or k > last:
        return 0
    return k


def local_rev(n: int) -> str:
    return f"0-{n}"


def check_local_put(current: dict | None, body: Any) -> int:
    """The revision number a ``_local`` document gets when ``body`` is written over ``current``
    (``{"n", "body"}`` or None); CouchError 409 when the body's ``_rev`` is not the current one."""
    if not isinstance(body, dict):
        raise bad_request("Document must be a JSON object")
    rev = body.get("_rev")
    n = current["n"] if current else 0
    if current is not None and rev != local_rev(n):
        raise CouchError(409, "conflict", "Document update conflict.")
    if current is None and rev not in (None, "0-0"):  # another checkpoint's revision
        raise CouchError(409, "conflict", "Document update conflict.")
    return n + 1
