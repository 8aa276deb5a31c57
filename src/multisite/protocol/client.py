"""The client protocol: applications talking to an instance server (``multisite.connect``).

Frames are ``u32 length | msgpack body``. A request is ``[id, op, args]``; the reply is
``[id, True, result]`` or ``[id, False, [code, message]]``. Ops: ``get``, ``items``, ``commit``
(a whole transaction's updates in one request), ``create_region``, ``info``, ``history``.
Requests may be pipelined: several in flight on one connection, answered in order.
Sans-IO: ``FrameBuffer`` turns received bytes into bodies, ``ClientSession`` keeps one connection's
requests in order, ``Gathering`` gathers the commits of every connection into group commits; sockets
live in ``net`` (``server.clients``).
"""

from __future__ import annotations

import struct
from collections import deque

import msgspec

from ..errors import LocalProtocolError, RemoteProtocolError

LEN = struct.Struct("<I")
MAX_CLIENT_FRAME_BYTES = 64 * 1024 * 1024
OPS = ("get", "items", "commit", "create_region", "info", "history", "regions")

_enc = msgspec.msgpack.Encoder()


def encode(obj: object) -> bytes:
    body = _enc.encode(obj)
    return LEN.pack(len(body)) + body


class FrameBuffer:
    def __init__(self, max_frame_bytes: int = MAX_CLIENT_FRAME_BYTES):
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes
        self.last_bytes = 0  # the size of the frame ``next`` returned last

    def feed(self, data: bytes) -> None:
        self._buf += data

    def __len__(self) -> int:
        """Bytes held: received and not yet taken as whole frames."""
        return len(self._buf)

    def next(self):
        """The next decoded body, or None if more bytes are needed."""
        if len(self._buf) < 4:
            return None
        (n,) = LEN.unpack_from(self._buf, 0)
        if n > self.max_frame_bytes:
            raise RemoteProtocolError(f"client frame of {n} bytes exceeds {self.max_frame_bytes}")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        self.last_bytes = 4 + n
        try:
            return msgspec.msgpack.decode(body)
        # RecursionError: nesting too deep to decode; UnicodeDecodeError: a string that is not UTF-8
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
            raise RemoteProtocolError(f"malformed client frame: {e}") from None


# -- one connection's requests in order, and the commits of all connections gathered ----------------
# The listener (server.clients) reads every connection on one event loop. What may run when, what
# gathers into one group commit and in which order replies go out is decided here, without sockets,
# so that the rules are tested byte by byte (tests/unit/test_client_session.py).

READ_OPS = frozenset(("get", "items", "info", "history", "regions"))  # answered on the loop at once
MAX_PIPELINE = 1024  # requests of one connection in flight (read, not yet answered); reading pauses past it

QUEUED, GATHERED, WRITTEN, RUNNING, DONE = "queued", "gathered", "written", "running", "done"


class Request:
    """One request of a connection: ``[id, op, args]`` and where it stands.

    ``queued`` (read, not started) → ``gathered`` (a commit waiting for its group to be written) →
    ``written`` (journaled, waiting for its group's fdatasync) → ``done``; any other op goes
    ``queued`` → ``running`` (the listener runs it) → ``done``. ``reply`` is the frame body to send."""

    __slots__ = ("rid", "op", "args", "state", "reply", "session", "size", "t0")

    def __init__(self, rid: object, op: object, args: dict, session: "ClientSession"):
        self.rid, self.op, self.args, self.session = rid, op, args, session
        self.state = QUEUED
        self.reply: list | None = None
        self.t0 = 0.0  # when a gathered commit was taken (the listener's observer times it to its answer)


class ClientSession:
    """The state of one client connection, sans-IO: bytes in (``feed``), requests that may start now
    (``next_runnable``), replies out in request order (``replies``), however they finish.

    Ordering rules, so that a pipelined connection sees what one at a time would have seen:
    a commit may join the group being gathered as soon as every earlier request of its connection
    has started and none is ``running`` (consecutive commits of one connection go into one group, in
    order); any other request starts only once every earlier commit is written (so a read after a
    commit sees it) and nothing earlier is still running. A reply is sent only when every earlier
    one was."""

    def __init__(self, max_frame_bytes: int = MAX_CLIENT_FRAME_BYTES, max_pipeline: int = MAX_PIPELINE):
        self.frames = FrameBuffer(max_frame_bytes)
        self.max_pipeline = max_pipeline
        self._waiting: deque[Request] = deque()  # read, not started, in order
        self._unanswered: deque[Request] = deque()  # every request not yet replied to, in order
        self._gathered = 0  # started requests in GATHERED
        self._running = 0  # started requests in RUNNING
        self.waiting_bytes = 0  # frame bytes of the requests read and not started (held, as partial frames are)
        self.owner: object = None  # what the caller keeps this session for (its connection)

    def feed(self, data: bytes) -> None:
        """Received bytes, held until ``parse`` (the caller may first check what they add up to)."""
        self.frames.feed(data)

    def parse(self) -> None:
        """Whole frames held become requests (RemoteProtocolError for a frame that cannot be read or
        is not ``[id, op, args]``: nothing after it can be trusted; the requests before it stand)."""
        while (body := self.frames.next()) is not None:
            if not (isinstance(body, list) and len(body) == 3 and isinstance(body[2], dict)):
                raise RemoteProtocolError(f"client request must be [id, op, args], got {body!r:.80}")
            req = Request(body[0], body[1], body[2], self)
            req.size = self.frames.last_bytes
            self.waiting_bytes += req.size
            self._waiting.append(req)
            self._unanswered.append(req)

    @property
    def in_flight(self) -> int:
        """Requests read and not yet answered."""
        return len(self._unanswered)

    @property
    def wants_more(self) -> bool:
        """Whether reading more requests keeps within ``max_pipeline``."""
        return len(self._unanswered) < self.max_pipeline

    def next_runnable(self, gather_commits: bool = True) -> Request | None:
        """The next request that may start now (marked ``gathered`` if it is a commit and
        ``gather_commits``, ``running`` otherwise: a commit the caller runs as any other op), or None.
        The caller starts it before asking again."""
        if not self._waiting or self._running:
            return None
        req = self._waiting[0]
        if req.op == "commit" and gather_commits:
            req.state = GATHERED
            self._gathered += 1
        elif self._gathered:
            return None
        else:
            req.state = RUNNING
            self._running += 1
        self._waiting.popleft()
        self.waiting_bytes -= req.size
        return req

    def written(self, req: Request) -> None:
        """A gathered commit was journaled: requests after it may read what it wrote."""
        if req.state is not GATHERED:
            raise LocalProtocolError(f"request {req.rid!r} is {req.state}, not gathered")
        req.state = WRITTEN
        self._gathered -= 1

    def answer(self, req: Request, ok: bool, result: object) -> None:
        """``req`` finished: its reply is ``[id, ok, result]`` (``result`` is ``[code, message]`` when
        not ok)."""
        if req.state is GATHERED:
            self._gathered -= 1
        elif req.state is RUNNING:
            self._running -= 1
        elif req.state is not WRITTEN:
            raise LocalProtocolError(f"request {req.rid!r} is {req.state}: it cannot be answered")
        req.state = DONE
        req.reply = [req.rid, ok, result]

    def replies(self) -> list[list]:
        """Replies that may be sent now, in request order (each once)."""
        out = []
        q = self._unanswered
        while q and q[0].state is DONE:
            out.append(q.popleft().reply)
        return out

    def drop_waiting(self) -> int:
        """Forget requests not started (the connection is closing); how many."""
        n = len(self._waiting)
        for req in self._waiting:
            self._unanswered.remove(req)
        self._waiting.clear()
        self.waiting_bytes = 0
        return n


class Gathering:
    """The commits of every connection, sans-IO: gathered while the loop reads, written as one batch,
    hardened as one group.

    ``add`` a gathered commit; ``take_batch`` what to write now (all gathered, in arrival order);
    after the engine wrote it, ``wrote`` with each one's result and the fsync token. The thread that
    hardens asks ``to_harden(hard)`` for the newest (token, requests written so far) beyond what it
    already hardened, when it *starts* an fdatasync, so whatever was written by then shares it;
    ``synced`` with that count answers them. While one group's fdatasync runs, the next batches are
    written, then hardened together by the next."""

    def __init__(self) -> None:
        self._gathered: list[tuple[Request, object]] = []
        self._written: deque[tuple[Request, object]] = deque()  # (request, seqno or exception), not yet hard
        self._total = 0  # requests ever put into _written
        self._done = 0  # of those, answered after an fdatasync
        self.latest: tuple[object, int] | None = None  # (token hardening every written batch, _total then)
        # --min-confirm: hard commits wait here until enough secondaries confirmed them (see ``confirmed``).
        self.min_confirm = 0
        self.confirmed_seqno = 0  # the highest seqno that many secondaries confirmed
        self._unconfirmed: deque[tuple[Request, int, float]] = deque()  # (request, seqno, hard since)

    def to_harden(self, hard: int) -> tuple[object, int] | None:
        """``(token, count)`` to harden next when ``hard`` written commits are hard already, or None
        (nothing newer). Reads one attribute: safe from the hardening thread."""
        latest = self.latest
        return latest if latest is not None and latest[1] > hard else None

    def add(self, req: Request, ops: object) -> None:
        self._gathered.append((req, ops))

    def __len__(self) -> int:
        return len(self._gathered)

    @property
    def waiting_sync(self) -> int:
        """Commits written and not yet hard."""
        return len(self._written)

    def take_batch(self) -> list[tuple[Request, object]]:
        batch, self._gathered = self._gathered, []
        return batch

    @property
    def written_total(self) -> int:
        """Commits ever written that wait or waited for an fdatasync (``synced`` takes a count of them)."""
        return self._total

    def wrote(self, batch: list[Request], results: list, token: object, publish: bool = True,
              now: float = 0.0) -> list[Request]:
        """A batch was journaled (``token``: what hardens it, None if nothing needs it). Requests that
        failed alone, and all of them when there is nothing to harden, are answered now (with
        ``min_confirm``, one the secondaries have not confirmed waits from ``now``, as in ``synced``);
        the others wait for an fdatasync. Returns the requests answered. ``publish=False``: the caller
        hardens this batch itself and calls ``synced(written_total)`` (the hardening thread is not
        offered it; a later published token covers it too, which is harmless)."""
        answered = []
        for req, res in zip(batch, results):
            req.session.written(req)
            if isinstance(res, BaseException):
                req.session.answer(req, False, error_reply(res))
                answered.append(req)
            elif token is None and self.min_confirm and isinstance(res, int) and res > self.confirmed_seqno:
                self._unconfirmed.append((req, res, now))  # durability none: nothing to harden here, but
                # --min-confirm is about the secondaries
            elif token is None:  # nothing of it to harden (nothing replicated, or durability none)
                req.session.answer(req, True, res)
                answered.append(req)
            else:
                self._written.append((req, res))
                self._total += 1
        if token is not None and publish:
            self.latest = (token, self._total)  # one assignment: another thread reads it whole
        return answered

    def synced(self, upto: int, error: BaseException | None = None, now: float = 0.0) -> list[Request]:
        """The fdatasync of the token taken when ``upto`` requests had been written returned (or
        failed with ``error``): answer every request up to it; with ``min_confirm``, a request whose
        seqno the secondaries have not confirmed waits (``confirmed``, ``expire``) from ``now``."""
        answered = []
        while self._done < upto:
            req, res = self._written.popleft()
            self._done += 1
            if error is not None:
                req.session.answer(req, False, error_reply(error))
            elif self.min_confirm and isinstance(res, int) and res > self.confirmed_seqno:
                self._unconfirmed.append((req, res, now))
                continue
            else:
                req.session.answer(req, True, res)
            answered.append(req)
        return answered

    @property
    def waiting_confirm(self) -> int:
        """Hard commits waiting for the secondaries' confirmation."""
        return len(self._unconfirmed)

    def confirmed(self, seqno: int) -> list[Request]:
        """``min_confirm`` secondaries have confirmed (hardened) every seqno up to ``seqno``: answer the
        commits that waited for it."""
        self.confirmed_seqno = max(self.confirmed_seqno, seqno)
        answered = []
        q = self._unconfirmed
        while q and q[0][1] <= self.confirmed_seqno:
            req, res, _ = q.popleft()
            req.session.answer(req, True, res)
            answered.append(req)
        return answered

    def min_confirm_off(self) -> list[Request]:
        """``min_confirm`` was set to 0: answer every commit that waited for confirmations, and forget
        the confirmed mark (a mark left at "everything" would answer every commit unconfirmed once a
        ``min_confirm`` is set again)."""
        answered = self.confirmed(1 << 62)
        self.confirmed_seqno = 0
        return answered

    def rolled_back(self, seqno: int) -> list[Request]:
        """The instance rolled back to ``seqno``: what the secondaries confirmed past it was of the
        history rolled back, so the mark goes back to it (the seqnos after it are given again, to other
        transactions), and the commits waiting past it, now in the lost-transaction file, are answered
        MIN_CONFIRM_TIMEOUT."""
        self.confirmed_seqno = min(self.confirmed_seqno, seqno)
        answered, kept = [], deque()
        for req, res, since in self._unconfirmed:
            if res > seqno:
                req.session.answer(req, False, [MIN_CONFIRM_TIMEOUT, (
                    f"commit {res} is hard on this instance but was rolled back (to seqno {seqno}) before "
                    f"{self.min_confirm} secondar{'y' if self.min_confirm == 1 else 'ies'} confirmed it: it "
                    f"is in this instance's lost-transaction file, not in the cluster's history")])
                answered.append(req)
            else:
                kept.append((req, res, since))
        self._unconfirmed = kept
        return answered

    def expire(self, now: float, timeout_s: float, why: str) -> list[Request]:
        """Answer with ``MIN_CONFIRM_TIMEOUT`` the commits that waited ``timeout_s`` or more: they are
        hard on this instance, but fewer than ``min_confirm`` secondaries confirmed them (``why``)."""
        answered = []
        q = self._unconfirmed
        while q and now - q[0][2] >= timeout_s:
            req, res, _ = q.popleft()
            req.session.answer(req, False, [MIN_CONFIRM_TIMEOUT, (
                f"commit {res} is hard on this primary but was not confirmed by {self.min_confirm} "
                f"secondar{'y' if self.min_confirm == 1 else 'ies'} within {timeout_s:g} s ({why}): it may be "
                f"lost if this primary fails over now")])
            answered.append(req)
        return answered


MIN_CONFIRM_TIMEOUT = "MIN_CONFIRM_TIMEOUT"


def error_reply(e: BaseException) -> list:
    """``[code, message]`` of an error, as a reply carries it."""
    code = getattr(e, "code", "SERVER")
    message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
    return [code, message]
