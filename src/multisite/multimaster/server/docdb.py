"""A document database: documents with UNIDs, OIDs and ``$Revisions``, stored on an engine instance.

The database is an ordinary multisite instance (journal + SQLite store), so crash recovery, backup
and the Spark source work for it as for any other. Its regions (all journaled):

=========  =======================  ==========================================================
region     key                      value
=========  =======================  ==========================================================
meta       ``(name,)``              identity (``replica_id``, ``db_id``, ``title``), ACL, forms,
                                    the last change number
docs       ``(unid,)``              ``[changeno, document]`` (``Doc.to_value``)
changes    ``(first changeno,)``    a change block: ``[[unid, seq, time_us, origin], ...]``, the
                                    documents of one write, change numbers ``first ..``
history    ``(peer, dir)``          a bookmark (``peer`` is ``<db id>@<server>``): the peer's change number up to which ``in`` (we
                                    hold the peer's changes) or ``out`` (the peer holds ours)
refs       ``(unid, conflict)``     1: ``conflict`` is a conflict document of ``unid`` (made at
                                    open in a database from before it); kept in memory too
=========  =======================  ==========================================================

Every write of a document takes the next **change number**; the documents of one write are listed in
one change block (one journaled op for the lot, not one each: half the writes of a document), so
"what changed since bookmark N" is a range read of ``changes`` from the block holding ``N + 1``,
keeping each document's latest entry. A rewritten document leaves its old entry behind in an older
block, where it is skipped (a bookmark past it never reads it; a read from before it keeps the later one).
Each write (a document, a batch received from a peer with its bookmark) is one engine transaction:
the bookmark is stored in the same transaction as the documents it covers, so after a crash it is
never ahead of what was applied. ``docdb.json`` beside the instance repeats the identity, so that
``--replica-of DIR`` works while a server holds the database open. A received version that makes a
conflict document stand for no losing leaf removes it in the same transaction, and a deleted document
retires its live ones (``conflicts.settle``). The CouchDB
endpoints (``couch_http.py``) read a document with its conflict documents (``families``), write
through ``transact`` (their decisions are ``couch.plan``'s), keep their ``_local`` checkpoints in
``meta`` (``("couch_local", id)``, not replicated) and wait for changes with ``add_listener``.
"""

from __future__ import annotations

import os
from dataclasses import replace
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec

from ... import engine
from ...errors import (ConfigError, DocumentDeleted, DocumentNotFound, InstanceLocked, MalformedDocument,
                       MultisiteError, NotADocumentDatabase)
from ...journal.records import KILL, SET
from ...keys import encode_key
from ...values import encode_value
from ..conflicts import Kind, merge_conflicts, settle
from ..document import CONFLICT_FIELD, REF_FIELD, Doc, first_version
from ..ids import Stamp, check_unid, new_id, new_unid
from .docdb_couch import CouchStore
from .docdb_incoming import IncomingStore, Snapshot
from .docdb_files import IDENTITY_FILE, held_by_server, read_identity, write_identity

REGIONS = ("meta", "docs", "changes", "history")
REFS = "refs"  # each document's conflict documents; made at open in a database from before it
CHANGE_BLOCK_ENTRIES = 512  # documents per change block (one journaled op lists a write's documents)
_raw_encode = msgspec.msgpack.Encoder().encode
_raw_decode = msgspec.msgpack.decode
_ONE = encode_value(1)
_new_stamp = tuple.__new__  # Stamp(...) without the namedtuple's Python-level __new__: the hot path of a change list
_KEY_PRE, _KEY_POST = encode_key(("0" * 32,)).split(b"0" * 32)  # how a (unid,) key wraps the UNID's hex
ACCESS_LEVELS = ("none", "reader", "writer")
DEFAULT_ACL = {"*": "writer"}  # an open database until an ACL is set: every authenticated server may write
Clock = Callable[[], int]  # µs since the epoch
Rand = Callable[[], int]  # 64 random bits


def _wall_us() -> int:
    return time.time_ns() // 1000


def _rand64() -> int:
    return secrets.randbits(64)


def create(path: str | os.PathLike, title: str, *, replica_id: str | None = None,
           durability: str = "fsync", clock: Clock | None = None, rand: Rand | None = None,
           segment_bytes: int | None = None, group_read: bool = False) -> "DocDB":
    """Create a new document database at ``path`` (a new replica of ``replica_id`` if given) and open it:
    a directory 0700 and its files 0600, or 0750 and 0640 with ``group_read`` (as ``engine.create``)."""
    if not isinstance(title, str) or not title.strip():
        raise ConfigError("a document database needs a title (--title)")
    rand = rand or _rand64
    if replica_id is not None:
        from ..ids import check_id
        try:
            check_id("replica ID", replica_id)
        except MalformedDocument as e:
            raise ConfigError(e.message) from None
    replica_id = replica_id or new_id(rand())
    db_id = new_id(rand())
    engine.create(path, f"docdb-{db_id}", durability=durability, group_read=group_read,
                  **({"segment_bytes": segment_bytes} if segment_bytes else {}))
    db = engine.open(path)
    try:
        for r in REGIONS + (REFS,):
            db.create_region(r)
        with db.transaction() as tx:
            tx.set("meta", ("kind",), "documents")
            tx.set("meta", ("replica_id",), replica_id)
            tx.set("meta", ("db_id",), db_id)
            tx.set("meta", ("title",), title)
            tx.set("meta", ("changeno",), 0)
            tx.set("meta", ("acl",), DEFAULT_ACL)
            tx.set("meta", ("forms",), {})
        db.flush()
    finally:
        db.close()
    write_identity(path, replica_id, db_id, title)
    return DocDB(path, clock=clock, rand=rand)


def open(path: str | os.PathLike, **kwargs: Any) -> "DocDB":  # noqa: A001 - the public name
    return DocDB(path, **kwargs)


class DocDB(CouchStore, IncomingStore):
    """An open document database. Thread-safe; one per process (the instance lock)."""

    def __init__(self, path: str | os.PathLike, *, clock: Clock | None = None, rand: Rand | None = None,
                 durability: str | None = None):
        self.path = Path(path).absolute()
        if not (self.path / "instance.msi").exists():
            raise NotADocumentDatabase(f"{self.path} is not a document database (no instance in it); make one "
                                       f"with `multisite db create {self.path} --title T`")
        try:
            self.db = engine.open(self.path, durability=durability)
        except InstanceLocked as e:
            raise held_by_server(self.path, e) from None
        try:
            if self.db.regions().keys() < set(REGIONS) or self.db.get("meta", ("kind",)) != "documents":
                raise NotADocumentDatabase(f"{self.path} is an instance but not a document database")
            self.replica_id: str = self.db.get("meta", ("replica_id",))
            self.db_id: str = self.db.get("meta", ("db_id",))
            self.title: str = self.db.get("meta", ("title",))
            self._changeno: int = self.db.get("meta", ("changeno",))
        except BaseException:
            self.db.close()
            raise
        if not (self.path / IDENTITY_FILE).exists():  # a restored backup carries the instance: rewritten from meta
            write_identity(self.path, self.replica_id, self.db_id, self.title)
        self._clock = clock or _wall_us
        self._rand = rand or _rand64
        self._last_time = 0
        self._epoch = 0  # bumped by every write: a read made at the same epoch is still current
        self._lock = threading.RLock()
        self._listeners: list[Callable[[int], None]] = []
        self._refs: dict[str, set[str]] = self._load_refs()

    def _load_refs(self) -> dict[str, set[str]]:
        """Document UNID -> its conflict documents' UNIDs, from the ``refs`` region (made here, from the
        documents, in a database made before it: one scan, once)."""
        if REFS not in self.db.regions():
            self.db.create_region(REFS)
            ops = [(SET, REFS, (d.fields[REF_FIELD], d.unid), encode_value(1)) for d in self.documents(include_deleted=True)
                   if d.is_conflict and isinstance(d.fields.get(REF_FIELD), str)]
            if ops:
                self.db.commit_updates(ops)
        refs: dict[str, set[str]] = {}
        self._ref_of: dict[str, str] = {}
        for (ref, unid), _ in self.db.items(REFS):
            refs.setdefault(ref, set()).add(unid)
            self._ref_of[unid] = ref
        return refs

    def ref_of(self, unid: str) -> str | None:
        """The document that ``unid`` is a conflict document of (None: it is none)."""
        return self._ref_of.get(unid)

    # -- identity, ACL, forms -----------------------------------------------------------------------
    @property
    def changeno(self) -> int:
        """The last change number: the bookmark that covers every change so far."""
        return self._changeno

    def info(self) -> dict:
        return {"path": str(self.path), "title": self.title, "replica_id": self.replica_id, "db_id": self.db_id,
                "changeno": self._changeno, "documents": self.count(), "acl": self.acl(), "forms": self.forms()}

    def acl(self) -> dict[str, str]:
        return dict(self.db.get("meta", ("acl",)) or {})

    def set_access(self, server: str, access: str) -> None:
        """Give ``server`` (or ``*``, every other server) ``none``, ``reader`` or ``writer`` access."""
        if access not in ACCESS_LEVELS:
            raise ConfigError(f"access must be one of {', '.join(ACCESS_LEVELS)}, got {access!r}")
        if not isinstance(server, str) or not server:
            raise ConfigError("the ACL names a server (or '*')")
        with self._lock:
            acl = self.acl()
            acl[server] = access
            self.db.set("meta", ("acl",), acl)

    def access(self, server: str) -> str:
        """The access ``server`` has: its own entry, else ``*``'s, else none."""
        acl = self.acl()
        return acl.get(server, acl.get("*", "none"))

    def forms(self) -> dict[str, dict]:
        return dict(self.db.get("meta", ("forms",)) or {})

    def define_form(self, name: str, *, merge: bool) -> None:
        """Declare form ``name``; ``merge`` turns on "merge replication conflicts" for its documents."""
        with self._lock:
            forms = self.forms()
            forms[name] = {"merge": bool(merge)}
            self.db.set("meta", ("forms",), forms)

    def _merge_on(self, form: str, default: bool = False) -> bool:
        """The form's merge setting here; a form this replica does not define keeps the document's."""
        f = self.forms().get(form)
        return bool(f["merge"]) if f is not None else default

    # -- local writes -------------------------------------------------------------------------------
    def _now(self) -> int:
        t = max(self._clock(), self._last_time + 1)  # strictly increasing within this database
        self._last_time = t
        return t

    def create(self, form: str, fields: dict[str, Any]) -> str:
        """A new document; its UNID."""
        return self.create_many([(form, fields)])[0]

    def create_many(self, docs: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
        """New documents, in one transaction; their UNIDs."""
        with self._lock:
            out = []
            new = []
            for form, fields in docs:
                _check_new(form, fields)
                t = self._now()
                d = first_version(new_unid(t, self._rand()), form, fields, t, self.db_id, self._merge_on(form))
                new.append((d, None))
                out.append(d.unid)
            self._write(new)
            return out

    def update(self, unid: str, fields: dict[str, Any]) -> Doc:
        """A new version of ``unid`` with ``fields`` changed (others kept)."""
        return self.update_many([(unid, fields)])[0]

    def update_many(self, changes: Iterable[tuple[str, dict[str, Any]]]) -> list[Doc]:
        """New versions of several documents, in one transaction (each UNID at most once)."""
        with self._lock:
            out: list[tuple[Doc, int | None]] = []
            seen = set()
            for unid, fields in changes:
                if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
                    raise MalformedDocument("fields must be a map of names (strings) to values")
                if unid in seen:
                    raise MalformedDocument(f"document {unid} appears twice in one update_many")
                seen.add(unid)
                cur, c = self._current(check_unid(unid))
                if cur is None:
                    raise DocumentNotFound(f"no document {unid} in {self.title}")
                if cur.deleted:
                    raise DocumentDeleted(f"document {unid} in {self.title} was deleted; create a new one instead")
                out.append((cur.next_version(self._now(), self.db_id, fields, merge=self._merge_on(cur.form, cur.merge)), c))
            self._write(out)
            return [d for d, _ in out]

    def delete(self, unid: str) -> Doc:
        """Delete ``unid``: a deletion stub (no fields, the next sequence number) that replicates."""
        with self._lock:
            cur, c = self._current(check_unid(unid))
            if cur is None:
                raise DocumentNotFound(f"no document {unid} in {self.title}")
            if cur.deleted:
                return cur
            d = cur.next_version(self._now(), self.db_id, deleted=True)
            st = settle(d, self.families([unid])[unid][1])  # it takes its conflict documents with it
            self._write([(d, c)] + [(r, None) for r in st.retire], self._removal_ops(st.remove))
            self._forget(st.remove)
            return d

    def merge_conflicts(self, unid: str) -> Doc | None:
        """The seed's field merge (step 9c) of document ``unid`` with its live conflict documents, as an
        edit made here (``conflicts.merge_conflicts``): the next version takes the changes of each one
        whose fields are apart from its own, and those conflict documents go (they are its ancestors
        now). None, and nothing written, if none merges (the form's merge off, fields that overlap)."""
        with self._lock:
            cur, c = self._current(check_unid(unid))
            if cur is None:
                raise DocumentNotFound(f"no document {unid} in {self.title}")
            if cur.deleted:  # as update: its conflict documents went with it (retired)
                raise DocumentDeleted(f"document {unid} in {self.title} was deleted; nothing to merge into")
            conflicts = self.families([unid])[unid][1]
            here = replace(cur, merge=self._merge_on(cur.form, cur.merge))  # an edit: the form's setting here
            m = merge_conflicts(here, conflicts, self._now(), self.db_id)
            if m is None:
                return None
            st = settle(m, conflicts)
            self._write([(m, c)] + [(r, None) for r in st.retire], self._removal_ops(st.remove))
            self._forget(st.remove)
            return m

    def _write(self, docs: list[tuple[Doc, int | None]], extra: list | None = None, *, checked: bool = False) -> None:
        """Write new versions and ``extra`` ops, atomically: one op per document and one per change block.
        ``checked``: the documents came off the wire through ``Doc.from_value`` (every value is a msgpack
        type already), so they skip the document-type check that local fields get."""
        ops: list = []
        n = self._changeno
        enc = _raw_encode if checked else encode_value
        block: list = []
        refs = []
        for d, _old in docs:
            n += 1
            if len(block) == CHANGE_BLOCK_ENTRIES:
                ops.append((SET, "changes", (n - len(block),), _raw_encode(block)))
                block = []
            block.append([d.unid, d.seq, d.time_us, d.origin])
            ops.append((SET, "docs", (d.unid,), enc([n, d.to_value()])))
            if CONFLICT_FIELD in d.fields:
                ref = d.fields.get(REF_FIELD)
                if isinstance(ref, str) and d.unid not in self._refs.get(ref, ()):
                    ops.append((SET, REFS, (ref, d.unid), _ONE))
                    refs.append((ref, d.unid))
        if block:
            ops.append((SET, "changes", (n + 1 - len(block),), _raw_encode(block)))
        ops.append((SET, "meta", ("changeno",), encode_value(n)))
        ops.extend(extra or ())
        self.db.commit_updates(ops)
        self._changeno = n
        self._epoch += 1
        for ref, unid in refs:
            self._refs.setdefault(ref, set()).add(unid)
            self._ref_of[unid] = ref
        for fn in self._listeners:
            fn(n)

    def _removal_ops(self, unids: Iterable[str]) -> list:
        """The ops that remove stored documents ``unids`` with no trace (and their ``refs`` entries); their
        change entries then read as absent. ``_forget`` them once committed."""
        ops = [(KILL, "docs", (u,), None) for u in unids]
        return ops + [(KILL, REFS, (self._ref_of[u], u), None) for u in unids if u in self._ref_of]

    def _forget(self, unids: Iterable[str]) -> None:
        for u in unids:
            ref = self._ref_of.pop(u, None)
            if ref is not None:
                self._refs.get(ref, set()).discard(u)

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(changeno)`` after every write (in the writing thread: it must not block)."""
        self._listeners.append(fn)

    # -- reads --------------------------------------------------------------------------------------
    def _current(self, unid: str) -> tuple[Doc | None, int | None]:
        v = self.db.get("docs", (unid,))
        if v is None:
            return None, None
        return Doc.trusted(v[1]), v[0]

    def get(self, unid: str, *, include_deleted: bool = False) -> Doc | None:
        """The document ``unid`` (None if absent; a deletion stub only with ``include_deleted``)."""
        d, _ = self._current(check_unid(unid))
        if d is None or (d.deleted and not include_deleted):
            return None
        return d

    def documents(self, *, include_deleted: bool = False) -> Iterator[Doc]:
        """Every document in UNID order."""
        for _, v in self.db.items("docs"):
            d = Doc.trusted(v[1])
            if include_deleted or not d.deleted:
                yield d

    def count(self) -> int:
        return sum(1 for _ in self.db.items("docs"))

    def changes(self, since: int = 0, limit: int | None = None, *, current_only: bool = False
                ) -> tuple[list[tuple[str, Stamp]], int]:
        """``([(unid, stamp)], last)``: the documents changed after change number ``since``, each once at
        its latest change in this range, in change order; about ``limit`` of them (a page ends with a
        change block); ``last`` is the change number to continue from (the bookmark). An entry may be
        stale (its document was rewritten after ``last``, and is listed again on a later page);
        ``current_only`` reads each document to drop those (one read each: the pusher's own list, whose
        stale entries would otherwise cost the peer a fetch)."""
        latest: dict[str, tuple[int, Stamp]] = {}
        last = since
        start = max(1, since + 2 - CHANGE_BLOCK_ENTRIES)  # the block that holds since + 1 starts here or later
        for (first,), block in self.db.items("changes", start=(start,)):
            for i, (unid, seq, t, origin) in enumerate(block):
                if first + i > since:
                    latest.pop(unid, None)  # keep the latest entry, in its place
                    latest[unid] = (first + i, _new_stamp(Stamp, (seq, t, origin)))
            last = max(last, first + len(block) - 1)
            if limit is not None and len(latest) >= limit:
                break
        if current_only:
            rows = self._rows(list(latest))
            return [(u, st) for u, (n, st) in latest.items() if u in rows and rows[u][0] == n], last
        return [(u, st) for u, (_, st) in latest.items()], last

    def change_rows(self, since: int, limit: int) -> tuple[list[tuple[int, str, tuple]], int]:
        """``([(changeno, unid, (seq, time_us, origin))], last)``: the documents changed after ``since``, each
        at its latest change read, in change order, at most ``limit`` of them; ``last`` is the change number
        they cover (the last row's when the page is full, else the last change there is). The CouchDB
        ``_changes`` feed: a client's checkpoint is a row's number, so every row needs its own."""
        latest: dict[str, tuple[int, tuple]] = {}
        last = since
        start = max(1, since + 2 - CHANGE_BLOCK_ENTRIES)
        for (first,), block in self.db.items("changes", start=(start,)):
            for i, (unid, seq, t, origin) in enumerate(block):
                if first + i > since:
                    latest.pop(unid, None)
                    latest[unid] = (first + i, (seq, t, origin))
            last = max(last, first + len(block) - 1)
            if len(latest) >= limit:
                break
        rows = [(n, u, st) for u, (n, st) in latest.items()]
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1][0]
        return rows, last

    def families(self, unids: Iterable[str]) -> dict[str, tuple[Doc | None, list[Doc]]]:
        """Each document with its conflict documents (live and deleted), in one batch read."""
        unids = list(dict.fromkeys(unids))
        cds = {u: sorted(self._refs.get(u, ())) for u in unids}
        rows = self._rows(unids + [c for cs in cds.values() for c in cs])
        return {u: (Doc.trusted(rows[u][1]) if u in rows else None,
                    [Doc.trusted(rows[c][1]) for c in cds[u] if c in rows]) for u in unids}

    def transact(self, unids: Iterable[str], decide: Callable[[dict, Callable[[], int]], tuple]) -> Any:
        """Read the ``families`` of ``unids``, let ``decide(families, now)`` say which versions to write (and
        what to answer; a third item, if any: the UNIDs of stored conflict documents to remove), and do
        it in one transaction, nothing else writing in between. ``now()`` is this database's clock (µs,
        increasing)."""
        with self._lock:
            writes, answer, *rest = decide(self.families(unids), self._now)
            removes = list(rest[0]) if rest else []
            if writes:
                self._write([(d, None) for d in writes], self._removal_ops(removes), checked=True)
            elif removes:
                self.db.commit_updates(self._removal_ops(removes))
                self._epoch += 1
            self._forget(removes)
            return answer

    def _rows(self, unids: list[str]) -> dict[str, list]:
        """The stored ``[changeno, doc]`` of each of ``unids`` that exists. UNIDs start with their creation
        time, so a batch of new documents is often one key range: one range read when the range holds
        few other documents, else one read per document."""
        if not unids:
            return {}
        want = set(unids)
        lo, hi = min(unids), max(unids)
        limit = 2 * len(want) + 16
        rows = self.db.page("docs", encode_key((lo,)), encode_key((hi + "!",)), limit)  # "!": just past hi
        if len(rows) < limit:
            out = {}
            a, b = len(_KEY_PRE), -len(_KEY_POST) or None
            for kb, vb in rows:
                u = kb[a:b].decode("ascii", "replace")  # (unid,) encoded: a fixed prefix, the hex, a fixed suffix
                if u in want:
                    out[u] = _raw_decode(vb)
            return out
        keys = {encode_key((u,)): u for u in want}  # scattered (a client's ids hash to their UNIDs): one query
        return {keys[kb]: _raw_decode(vb) for kb, vb in self.db.get_encoded_many("docs", list(keys)).items()}

    def current_many(self, unids: Iterable[str]) -> dict[str, Doc | None]:
        unids = list(unids)
        rows = self._rows(unids)
        return {u: (Doc.trusted(rows[u][1]) if u in rows else None) for u in unids}

    def stored_many(self, unids: Iterable[str]) -> list[list]:
        """The stored form (``Doc.to_value``) of each document that exists, as read (to send it on)."""
        unids = list(unids)
        rows = self._rows(unids)
        return [rows[u][1] for u in unids if u in rows]

    def verify(self) -> int:
        """Check every stored document's shape (``Doc.from_value``); the count. Local reads trust the
        store (its writes were checked); this is the slow, full check for tools and tests."""
        n = 0
        for _, v in self.db.items("docs"):
            Doc.from_value(v[1])
            n += 1
        return n

    # -- replication --------------------------------------------------------------------------------
    def bookmark(self, peer_db_id: str, direction: str) -> int:
        """``in``: the peer's change number up to which its changes are applied here; ``out``: ours up to
        which the peer has applied our changes (as it last told us)."""
        return self.db.get("history", (peer_db_id, direction)) or 0

    def set_bookmark(self, peer_db_id: str, direction: str, changeno: int) -> None:
        with self._lock:
            self.db.set("history", (peer_db_id, direction), max(changeno, self.bookmark(peer_db_id, direction)))

    def current_at(self, unids: Iterable[str]) -> "Snapshot":
        """The current documents and the write epoch they were read at; passed to ``apply_incoming`` as
        ``known``, they save reading them again if nothing else was written since."""
        with self._lock:
            return Snapshot(self._epoch, self.current_many(unids))

    # -- lifecycle ----------------------------------------------------------------------------------
    def flush(self) -> None:
        self.db.flush()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "DocDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<DocDB {self.title!r} replica {self.replica_id} db {self.db_id} at {self.path}>"


def _check_new(form: object, fields: object) -> None:
    if not isinstance(form, str) or not form:
        raise MalformedDocument(f"a document's form must be a non-empty string, got {form!r:.40}")
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise MalformedDocument("fields must be a map of names (strings) to values")


__all__ = ["DocDB", "create", "open", "read_identity", "MultisiteError", "Kind"]
