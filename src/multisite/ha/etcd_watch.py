"""A watch on an etcd key prefix (``EtcdClient.watch_prefix``): one streaming request to etcd's v3 JSON
gateway, read by a thread of its own and handed to the event loop as ``WatchEvent``s.

Why apart from the client: the stream's life (opening with a deadline on a member that may be paused,
confirmation by etcd's ``created``, the end of the stream carrying the last revision seen, closing from
another thread) is its own concern; the client's calls are one request each. See ``etcd_client``'s
docstring for how a caller reads, watches from the next revision, and notices a paused member.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from typing import Any, Callable

from ..errors import CoordinatorError, CoordinatorUnavailable
from .etcd_values import WatchEvent, _b64, _kv, _prefix_end, _revision, _summary


class Watch:
    """One watch stream (``EtcdClient.watch_prefix``): an async iterator of ``WatchEvent``s.

    ``async with`` (or the first ``__anext__``) opens the stream on the first member that accepts it
    and waits until etcd confirmed it: a change made after that is seen. ``close()`` ends it.
    """

    def __init__(self, client: Any, prefix: str, start_revision: int = 0):  # an EtcdClient
        self._client, self.prefix, self.start_revision = client, prefix, start_revision
        self.last_revision = start_revision - 1 if start_revision else 0  # of the events handed out
        self._seen_revision = self.last_revision  # of the events the thread read (ahead of the queue)
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self.url: str | None = None

    async def __aenter__(self) -> "Watch":
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> WatchEvent:
        if self._queue is None:
            await self._open()
        kind, item = await self._queue.get()
        if kind == "event":
            self.last_revision = max(self.last_revision, item.kv.mod_revision)
            return item
        if kind == "closed":
            raise StopAsyncIteration
        raise item

    async def _open(self) -> None:
        """Start the reading thread and wait for etcd's "created" (or the error of every member)."""
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        created = loop.create_future()

        def deliver(kind: str, item: Any) -> None:
            def put() -> None:
                if kind == "created":
                    if not created.done():
                        created.set_result(item)
                    return
                if not created.done():
                    created.set_exception(item if isinstance(item, Exception) else RuntimeError(kind))
                else:
                    self._queue.put_nowait((kind, item))
            try:
                loop.call_soon_threadsafe(put)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                self._stop.set()

        threading.Thread(target=self._read, args=(deliver,), name=f"etcd-watch {self.prefix}", daemon=True).start()
        # Each member has its deadline in the thread; this one is the whole opening's, should a member
        # hold the thread past them (it is left to end by itself; what it reads then is dropped). Not
        # asyncio.wait_for: it swallows a cancel that lands as "created" arrives (Python 3.11), and the
        # task that opened the watch then goes on after its cancel.
        try:
            done, _ = await asyncio.wait({created}, timeout=len(self._client.urls) * 2 * self._client.timeout_s + 1)
        except BaseException:
            self.close()
            raise
        if not done:
            self.close()
            raise CoordinatorUnavailable(f"no etcd member opened a watch on {self.prefix!r} in time: check that etcd "
                                         f"runs at {','.join(self._client.urls)}", urls=self._client.urls)
        self.url = created.result()

    def close(self) -> None:
        """End the stream (the reading thread ends with it); the iterator then stops."""
        self._stop.set()
        resp, self._response = self._response, None
        if resp is not None:
            _shutdown(resp)
        if self._queue is not None:
            self._queue.put_nowait(("closed", None))

    # -- the reading thread ----------------------------------------------------------------------------
    def _read(self, deliver: Callable[[str, Any], None]) -> None:
        """Open the stream on a member, then hand every event to the loop; any end is reported."""
        c = self._client
        errors: list[str] = []
        for i in range(len(c.urls)):
            k = (c._current + i) % len(c.urls)
            if self._stop.is_set():
                return
            try:
                resp = self._request(c._clients[k])
                self._response = resp
                lines = _lines(resp)
                created_at_revision = _check_created(next(lines))
            except Exception as e:  # noqa: BLE001 - this member cannot watch: try the next one
                errors.append(f"{c.urls[k]}: {_summary(e)}")
                continue
            if self._stop.is_set():  # the caller gave up meanwhile
                _shutdown(resp)
                return
            _no_read_timeout(resp)  # opened: from now on a quiet stream is a quiet grid, not a failure
            if not self.start_revision:  # from now: nothing up to the revision it was created at is due
                self._seen_revision = created_at_revision
            deliver("created", c.urls[k])
            self._stream(lines, c.urls[k], deliver)
            return
        deliver("error", CoordinatorUnavailable(
            f"no etcd member accepted a watch on {self.prefix!r} ({'; '.join(errors)}): check that etcd runs at "
            f"{','.join(c.urls)}", urls=c.urls))

    def _request(self, client: Any) -> Any:
        import requests

        body = {"create_request": {"key": _b64(self.prefix), "start_revision": self.start_revision,
                                   "range_end": base64.b64encode(_prefix_end(self.prefix)).decode()}}
        # the read timeout bounds the wait for the answer and its "created" (a paused member accepts the
        # connection and says nothing); it is lifted once the watch is open
        resp = client.session.post(client.get_url("/watch"), json=body, stream=True,
                                   timeout=(self._client.timeout_s, self._client.timeout_s),
                                   headers={"Grpc-Metadata-hasleader": "true"})
        if resp.status_code != 200:
            resp.close()
            raise requests.HTTPError(f"HTTP {resp.status_code}: {resp.text[:120]}")
        return resp

    def _stream(self, lines: Any, url: str, deliver: Callable[[str, Any], None]) -> None:
        reason = "the stream ended"
        try:
            for msg in lines:
                reason = _stream_error(msg)
                if reason:
                    break
                for ev in msg.get("result", {}).get("events") or []:
                    kv = _kv(ev["kv"])
                    self._seen_revision = max(self._seen_revision, kv.mod_revision)
                    deliver("event", WatchEvent("delete" if ev.get("type") == "DELETE" else "put", kv))
                reason = "the stream ended"
        except Exception as e:  # noqa: BLE001 - a lost connection ends the watch like any other end
            reason = _summary(e)
        if not self._stop.is_set():
            deliver("error", CoordinatorUnavailable(
                f"the watch on {self.prefix!r} at {url} ended ({reason}): read again and watch from revision "
                f"{self._seen_revision + 1}", url=url, next_revision=self._seen_revision + 1))


def _lines(resp: Any) -> Any:
    """The stream's JSON messages (the gateway ends each with a newline)."""
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def _check_created(msg: dict[str, Any]) -> int:
    """The revision a new watch starts after; CoordinatorError if etcd did not create it."""
    err = _stream_error(msg)
    if err or not msg.get("result", {}).get("created"):
        raise CoordinatorError(f"etcd did not create the watch: {err or msg}")
    return _revision(msg["result"])


def _stream_error(msg: dict[str, Any]) -> str:
    """Why the stream ends ("" while it goes on): an error (no leader) or a cancel (compaction)."""
    if "error" in msg:
        return str(msg["error"].get("message", msg["error"]))
    result = msg.get("result", {})
    if result.get("canceled"):
        compacted = result.get("compact_revision")
        return f"canceled: {result.get('cancel_reason') or ''}" + (f" compacted at {compacted}" if compacted else "")
    return ""


def _no_read_timeout(resp: Any) -> None:
    """Let an opened watch stream wait for its next event as long as the grid stays quiet."""
    sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(None)


def _shutdown(resp: Any) -> None:
    """Wake the thread blocked reading ``resp``: shut its socket down, then close the response."""
    try:
        s = socket.fromfd(resp.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM)
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    except (OSError, ValueError, AttributeError):
        pass
    resp.close()
