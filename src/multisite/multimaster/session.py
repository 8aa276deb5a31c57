"""A replication session (the seed's steps 4-12), free of I/O: the initiator as a generator of
requests, the responder as a function from request to reply.

``initiate(...)`` yields wire requests and is sent the replies; it returns a ``SessionReport``. The
caller moves the messages: over TCP (``multimaster/server/docserver.py``), or straight to a ``Responder`` in the
same process (``run_local``: the same-machine form, and the unit and model tests). Both ends work on
document databases through ``DocDB``'s public operations (passed in; this module imports no I/O).

Per database both servers hold a replica of (matched by replica ID, step 5), in the mode asked:

- **pull** (steps 6-10): ask the responder for the UNIDs changed since the bookmark (``Changes``,
  paged), skip those already held (same version or a descendant), ``Fetch`` the rest, reconcile
  each (step 9, ``conflicts.reconcile``) and write them together with the new ``in`` bookmark in one
  transaction; then tell the responder (``PullDone``) so it stores its ``out`` bookmark.
- **push** (steps 11-12): list our own changes since the bookmark, ``Offer`` them, send the ones the
  responder wants (``Push``); it reconciles and stores its ``in`` bookmark with them.

The bookmark used is the smaller of the two sides' records of the same flow (the point both agree on),
each of which is stored only once the changes it covers are durable: a cut session repeats work,
never skips it, and a replica restored from a backup (its change numbers go back) is not skipped. Records are
kept per (peer database ID, peer server name): a server moves only the records of its own replicas.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Generator, Iterable

from ..errors import AccessDenied, MalformedDocument, MultisiteError, ReplicaMismatch
from .conflicts import knows
from .document import Doc
from .ids import Stamp
from .wire import (DOC_WIRE_VERSION, Applied, Bookmarks, ChangePage, Changes, DbList, Docs, Fetch, GetBookmarks,
                   Hello, HelloOk, ListDbs, Offer, Ok, PullBack, PullDone, Push, Refused, Want)

CHANGES_PAGE_ENTRIES = 10_000  # entries of a change list page (a stale entry is dropped within its page only)
FETCH_BATCH_DOCS = 2000
PUSH_LIST_ENTRIES = 50_000  # the pusher lists its own changes locally: bigger pages, fewer stale-only rounds


class Pipeline(list):
    """Several requests sent at once; the driver answers with an iterator of their replies, in order
    (lazily: the initiator applies the first batch while the responder reads the next)."""


class Mode(str, Enum):
    PULL_PUSH = "pull-push"
    PULL_PULL = "pull-pull"
    PUSH_ONLY = "push-only"
    PULL_ONLY = "pull-only"

    @property
    def pulls(self) -> bool:
        return self is not Mode.PUSH_ONLY

    @property
    def pushes(self) -> bool:
        return self in (Mode.PULL_PUSH, Mode.PUSH_ONLY)

    @property
    def ways(self) -> tuple[str, ...]:
        """The directions this mode asks for, as a report names them: ``pull``, ``push``."""
        return tuple(w for w, on in (("pull", self.pulls), ("push", self.pushes)) if on)

    @classmethod
    def parse(cls, text: str) -> "Mode":
        try:
            return cls(text)
        except ValueError:
            from ..errors import ConfigError
            raise ConfigError(f"mode must be one of {', '.join(m.value for m in cls)}, got {text!r}") from None


@dataclass
class DbReport:
    """What moved for one database, and what was refused: ``refused`` every refusal's text,
    ``refused_ways`` the same by the direction it stopped (``pull``, ``push``; one that stopped the
    database before either, an ACL giving the peer no access, is under each direction asked)."""

    title: str
    replica_id: str
    pulled: Counter = field(default_factory=Counter)
    pushed: Counter = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)
    refused_ways: dict[str, list[str]] = field(default_factory=dict)

    def refuse(self, ways: Iterable[str], text: str) -> None:
        self.refused.append(text)
        for w in ways:
            self.refused_ways.setdefault(w, []).append(text)

    def to_dict(self) -> dict:
        return {"title": self.title, "replica_id": self.replica_id, "pulled": dict(self.pulled),
                "pushed": dict(self.pushed), "refused": list(self.refused),
                "refused_ways": {w: list(t) for w, t in self.refused_ways.items()}}


@dataclass
class SessionReport:
    server: str
    peer: str
    mode: str
    dbs: list[DbReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pull_back: list[str] = field(default_factory=list)  # replicas the peer was asked to pull (pull-pull)

    def totals(self) -> dict[str, int]:
        t: Counter = Counter()
        for d in self.dbs:
            t.update(d.pulled)
            t.update(d.pushed)
        return summary(t)

    def refused_ways(self) -> list[str]:
        """The directions refused for at least one database (a script's exit status: see ``cli``)."""
        return [w for w in ("pull", "push") if any(w in d.refused_ways for d in self.dbs)]

    def to_dict(self) -> dict:
        return {"server": self.server, "peer": self.peer, "mode": self.mode, "totals": self.totals(),
                "dbs": [d.to_dict() for d in self.dbs], "notes": list(self.notes), "refused_ways": self.refused_ways()}


def summary(c: Counter) -> dict[str, int]:
    """The figures a console verb prints: new, updated, deleted, conflicts, merged (and unchanged)."""
    return {"new": c["new"], "updated": c["updated"], "deleted": c["deleted"], "conflicts": c["conflict"],
            "merged": c["merged"], "unchanged": c["same"] + c["older"] + c["kept"]}


def _entries(changes: Iterable[tuple[str, Stamp]]) -> list[tuple[str, int, int, str]]:
    return [(u, s[0], s[1], s[2]) for u, s in changes]


def _decode_docs(values: list[Any]) -> list[Doc]:
    return [Doc.from_value(v) for v in values]


def initiate(local: dict[str, Any], server: str, mode: Mode, *, only: Callable[[Any], bool] | None = None,
             listen: str = "", expect_peer: str | None = None) -> Generator[Any, Any, SessionReport]:
    """The initiator's side of one session. ``local``: this server's databases by replica ID (already
    filtered to those it serves); ``only`` picks the databases to replicate (default all in common)."""
    hello = yield Hello(DOC_WIRE_VERSION, server, listen)
    if isinstance(hello, Refused):
        raise _error(hello)
    assert isinstance(hello, HelloOk)
    peer = hello.server
    if expect_peer is not None and peer != expect_peer:  # its certificate, or the server that asked for a pull-back
        raise AccessDenied(f"the server answering says it is {peer!r}, but {expect_peer!r} was expected: "
                           f"session refused")
    report = SessionReport(server, peer, mode.value)
    listing = yield ListDbs()
    if isinstance(listing, Refused):
        raise _error(listing)
    assert isinstance(listing, DbList)
    theirs = {rid: (db_id, title, access) for rid, db_id, title, access in listing.dbs}
    for rid, db in sorted(local.items()):
        if only is not None and not only(db):
            continue
        if rid not in theirs:
            continue  # step 5: only matching replica IDs replicate
        their_db_id, _title, their_access = theirs[rid]
        rep = DbReport(db.title, rid)
        report.dbs.append(rep)
        mine = db.access(peer)
        if mine == "none":
            rep.refuse(mode.ways, f"{peer} has no access to {db.title} here: nothing replicated")
            continue
        bm = yield GetBookmarks(rid, db.db_id)
        if isinstance(bm, Refused):
            rep.refuse(mode.ways, f"{bm.code}: {bm.message}")
            continue
        assert isinstance(bm, Bookmarks)
        echo: set = set()  # versions pulled from the peer and kept as they came: it need not get them back
        if mode.pulls:
            if mine != "writer":
                rep.refuse(["pull"], f"{peer} is a {mine} of {db.title} here: its changes are not pulled")
            else:
                yield from _pull(db, rid, bm, rep, history_key(bm.db_id, peer), echo)
        if mode.pushes:
            yield from _push(db, rid, bm, rep, history_key(bm.db_id, peer), echo)
    if mode is Mode.PULL_PULL and report.dbs:
        report.pull_back = [d.replica_id for d in report.dbs if not d.refused]
        ack = yield PullBack(report.pull_back)
        if isinstance(ack, Refused):
            report.notes.append(f"{peer} did not take the pull back: {ack.code}: {ack.message}")
    return report


def _pull(db: Any, rid: str, bm: Bookmarks, rep: DbReport, key: str, echo: set) -> Generator[Any, Any, None]:
    since = min(db.bookmark(key, "in"), bm.bm_out)  # the point both sides agree on: repeat, never skip
    while True:
        page = yield Changes(rid, since, CHANGES_PAGE_ENTRIES)
        if isinstance(page, Refused):
            rep.refuse(["pull"], f"pull: {page.code}: {page.message}")
            return
        assert isinstance(page, ChangePage)
        snap = db.current_at(u for u, *_ in page.entries)
        cur = snap.docs
        need = []
        for u, seq, t, origin in page.entries:
            if knows(cur.get(u), (seq, t, origin)):
                rep.pulled["same"] += 1
            else:
                need.append(u)
        batches = [need[i:i + FETCH_BATCH_DOCS] for i in range(0, len(need), FETCH_BATCH_DOCS)]
        replies = (yield Pipeline(Fetch(rid, b) for b in batches)) if batches else iter(())
        for i, got in enumerate(replies):
            if isinstance(got, Refused):
                rep.refuse(["pull"], f"pull: {got.code}: {got.message}")
                return
            assert isinstance(got, Docs)
            try:
                docs = _decode_docs(got.docs)
            except MalformedDocument as e:  # nothing of the batch is applied, the bookmark stays
                rep.refuse(["pull"], f"pull: {e}")
                return
            last_batch = i == len(batches) - 1
            rep.pulled.update(db.apply_incoming(docs, peer_db_id=key, bookmark=page.last if last_batch else None,
                                                known=snap, echo=echo))
        if not batches:
            rep.pulled.update(db.apply_incoming([], peer_db_id=key, bookmark=page.last))
        since = page.last
        if not page.more:
            break
    ack = yield PullDone(rid, db.db_id, since)
    if isinstance(ack, Refused):
        rep.refuse(["pull"], f"pull done: {ack.code}: {ack.message}")


def _push(db: Any, rid: str, bm: Bookmarks, rep: DbReport, key: str, echo: set) -> Generator[Any, Any, None]:
    since = min(db.bookmark(key, "out"), bm.bm_in)  # the point both sides agree on: repeat, never skip
    while True:
        changes, last = db.changes(since, PUSH_LIST_ENTRIES, current_only=True)
        if last == since:
            return
        if echo:
            n = len(changes)
            changes = [(u, st) for u, st in changes if (u, st) not in echo]
            rep.pushed["same"] += n - len(changes)
        if not changes:  # only stale entries (on a later page) or versions the peer gave us: nothing to offer
            db.set_bookmark(key, "out", last)
            since = last
            continue
        for start in range(0, len(changes), CHANGES_PAGE_ENTRIES):  # offers of a page's size: bounded memory
            chunk = changes[start:start + CHANGES_PAGE_ENTRIES]
            final_chunk = start + CHANGES_PAGE_ENTRIES >= len(changes)
            want = yield Offer(rid, _entries(chunk))
            if isinstance(want, Refused):
                rep.refuse(["push"], f"push: {want.code}: {want.message}")
                return
            assert isinstance(want, Want)
            rep.pushed["same"] += len(chunk) - len(want.unids)
            unids = want.unids
            batches = [unids[i:i + FETCH_BATCH_DOCS] for i in range(0, len(unids), FETCH_BATCH_DOCS)] or [[]]
            pushes = Pipeline(Push(rid, db.db_id, db.stored_many(b),
                                   last if final_chunk and i == len(batches) - 1 else -1)
                              for i, b in enumerate(batches))
            for got in (yield pushes):
                if isinstance(got, Refused):
                    rep.refuse(["push"], f"push: {got.code}: {got.message}")
                    return
                assert isinstance(got, Applied)
                rep.pushed.update(got.counts)
        db.set_bookmark(key, "out", last)
        since = last


def history_key(peer_db_id: str, peer_server: str) -> str:
    """Where bookmarks about a peer's replica are kept: its database ID *and* its server's name, so a
    server can only move the bookmarks of the replicas it speaks for (with ``--tls-names``, the name
    its certificate proves), not poison another server's."""
    return f"{peer_db_id}@{peer_server}"


def _error(r: Refused) -> MultisiteError:
    from .. import errors
    for obj in vars(errors).values():
        if isinstance(obj, type) and issubclass(obj, MultisiteError) and obj.code == r.code:
            return obj(r.message)
    return MultisiteError(f"{r.code}: {r.message}")


class Responder:
    """The responder's side: answers one request at a time for the initiator named in its Hello.
    ``dbs``: this server's databases by replica ID; ``log(text)`` records what it refuses;
    ``on_pull_back(peer, listen, replica_ids)`` takes a pull-pull's second half."""

    def __init__(self, server: str, dbs: dict[str, Any], *, log: Callable[[str], None] = lambda s: None,
                 on_pull_back: Callable[[str, str, list[str]], None] | None = None,
                 certified_name: str | None = None) -> None:
        self.server = server
        self.dbs = dbs
        self.peer = ""
        self.peer_listen = ""
        self.log = log
        self.on_pull_back = on_pull_back
        self._push_refused: set[str] = set()  # a refused Push poisons the rest of the pipeline for its replica
        self.certified_name = certified_name  # with names bound to certificates: who the peer is

    def handle(self, req: Any) -> Any:
        try:
            return self._handle(req)
        except MultisiteError as e:
            self.log(f"refused {type(req).__name__} from {self.peer or '?'}: {e}")
            return Refused(e.code, e.message)

    def _db(self, rid: str, *, write: bool = False) -> Any:
        db = self.dbs.get(rid)
        if db is None or db.access(self.peer) == "none":
            raise ReplicaMismatch(f"server {self.server} has no replica {rid} that {self.peer} may see")
        if write and db.access(self.peer) != "writer":
            raise AccessDenied(f"{self.peer} is a {db.access(self.peer)} of {db.title} on {self.server}: "
                               f"its push is refused")
        return db

    def _handle(self, req: Any) -> Any:
        if isinstance(req, Hello):
            if req.version != DOC_WIRE_VERSION:
                from ..errors import ProtocolError
                raise ProtocolError(f"replicator wire version {req.version}; {self.server} speaks {DOC_WIRE_VERSION}")
            if self.certified_name is not None and req.server != self.certified_name:
                raise AccessDenied(f"the peer says it is {req.server!r} but its certificate names "
                                   f"{self.certified_name or '(no common name)'!r}")
            self.peer, self.peer_listen = req.server, req.listen
            return HelloOk(DOC_WIRE_VERSION, self.server)
        if isinstance(req, ListDbs):
            return DbList([(rid, db.db_id, db.title, db.access(self.peer)) for rid, db in sorted(self.dbs.items())
                           if db.access(self.peer) != "none"])
        if isinstance(req, GetBookmarks):
            db = self._db(req.replica_id)
            key = history_key(req.peer_db_id, self.peer)
            return Bookmarks(db.db_id, db.bookmark(key, "in"), db.bookmark(key, "out"))
        if isinstance(req, Changes):
            db = self._db(req.replica_id)
            limit = max(1, min(req.limit, CHANGES_PAGE_ENTRIES))
            changes, last = db.changes(req.since, limit)
            return ChangePage(_entries(changes), last, len(changes) >= limit)
        if isinstance(req, Fetch):
            db = self._db(req.replica_id)
            return Docs(db.stored_many(req.unids[:FETCH_BATCH_DOCS]))
        if isinstance(req, PullDone):
            self._db(req.replica_id).set_bookmark(history_key(req.peer_db_id, self.peer), "out", req.upto)
            return Ok()
        if isinstance(req, Offer):
            db = self._db(req.replica_id, write=True)
            cur = db.current_many(u for u, *_ in req.entries)
            return Want([u for u, seq, t, o in req.entries if not knows(cur.get(u), (seq, t, o))])
        if isinstance(req, Push):
            if req.replica_id in self._push_refused:  # a batch before this one was refused: its bookmark must
                raise AccessDenied(f"an earlier push batch for {req.replica_id} was refused in this session; "
                                   f"this one is not applied")  # not move past what was not applied
            try:
                db = self._db(req.replica_id, write=True)
                docs = _decode_docs(req.docs)  # MalformedDocument: the whole batch is refused, nothing applied
            except MultisiteError:
                self._push_refused.add(req.replica_id)
                raise
            counts = db.apply_incoming(docs, peer_db_id=history_key(req.peer_db_id, self.peer),
                                       bookmark=req.upto if req.upto >= 0 else None)
            return Applied(dict(counts))
        if isinstance(req, PullBack):
            # our half pulls from the peer into our databases: only those it may write to here
            ids = [r for r in req.replica_ids if r in self.dbs and self.dbs[r].access(self.peer) == "writer"]
            if ids and self.on_pull_back is not None:
                self.on_pull_back(self.peer, self.peer_listen, ids)
            return Ok()
        raise MalformedDocument(f"unexpected request {type(req).__name__}")


def drive(gen: Generator[Any, Any, SessionReport], answer: Callable[[Any], Any]) -> SessionReport:
    """Run an initiator generator against ``answer`` (a Responder's handle, or a network round trip)."""
    try:
        req = next(gen)
        while True:
            if isinstance(req, Pipeline):
                req = gen.send(answer(r) for r in req)
            else:
                req = gen.send(answer(req))
    except StopIteration as stop:
        return stop.value


def run_local(a: Any, b: Any, mode: Mode | str, *, server_a: str = "local-a", server_b: str = "local-b"
              ) -> SessionReport:
    """Replicate two databases on this machine (the same-machine form): ``a`` initiates. pull-pull runs
    ``b``'s pull from ``a`` as its second half."""
    mode = Mode.parse(mode) if isinstance(mode, str) else mode
    if a.replica_id != b.replica_id:
        raise ReplicaMismatch(f"{a.title} (replica {a.replica_id}) and {b.title} (replica {b.replica_id}) are not "
                              f"replicas of one database: their replica IDs differ")
    report = drive(initiate({a.replica_id: a}, server_a, mode), Responder(server_b, {b.replica_id: b}).handle)
    if mode is Mode.PULL_PULL:
        back = drive(initiate({b.replica_id: b}, server_b, Mode.PULL_ONLY), Responder(server_a, {a.replica_id: a}).handle)
        for mine, theirs in zip(report.dbs, back.dbs):
            mine.pushed.update(theirs.pulled)  # what moved to b, seen from a
    return report
