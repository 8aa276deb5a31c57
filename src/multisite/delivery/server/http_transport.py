"""The http transport of delivery: an agent posts messages to its peer's agent endpoint.

- ``HttpOutbox`` (addresses ``http://HOST:PORT``) POSTs each message to ``/messages/NAME``. A 200 means
  the peer has it on disk (see below). Anything else (refused, timed out, an error status) puts the
  message in a local outbox folder instead (written atomically), which is durable, so ``send``
  succeeds and ``log_sent`` moves; every later poll first retries what waits there, oldest first,
  until it is taken. A message may wait there for days: store-and-forward.
- ``HttpInbox`` (``multisite delivery agent --listen-http HOST:PORT``) serves that endpoint from a
  thread of the agent's process: the body is written into the agent's inbox folder (atomically,
  fsynced) before the 200 goes back. The agent reads the folder as for the file transport.

Plain http carries messages the link's key encrypts and authenticates (``delivery.message``); a link
without a key over http is readable on the way.
"""

from __future__ import annotations

import http.client
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from ..message import MAX_MESSAGE_BYTES
from .transport import SUFFIX, register_scheme
from ...errors import DeliveryConfigError
from ...fsutil import atomic_write, make_dir

log = logging.getLogger("multisite.delivery")

HTTP_TIMEOUT_S = 30.0
PATH_PREFIX = "/messages/"


def _hostport(address: str) -> tuple[str, int]:
    u = urlsplit(address)
    if u.scheme != "http" or not u.hostname:
        raise DeliveryConfigError(f"address {address!r}: an http address is http://HOST:PORT")
    try:
        return u.hostname, u.port or 80
    except ValueError as e:
        raise DeliveryConfigError(f"address {address!r}: {e}") from None


def _valid_name(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(".") and name.endswith(SUFFIX) and len(name) < 256


class HttpOutbox:
    """POSTs messages to a peer's agent; what it cannot deliver waits in ``spool`` and is retried."""

    def __init__(self, address: str, spool: Path):
        self.address = address
        self.host, self.port = _hostport(address)
        self.spool = Path(spool)

    def _post(self, name: str, data: bytes) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=HTTP_TIMEOUT_S)
        try:
            conn.request("POST", PATH_PREFIX + name, body=data, headers={"Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return True
            log.warning("%s refused %s: HTTP %s", self.address, name, resp.status)
            return False
        except (OSError, http.client.HTTPException) as e:
            log.info("%s not reachable for %s (%s): kept in the outbox %s", self.address, name, e, self.spool)
            return False
        finally:
            conn.close()

    def retry(self) -> int:
        """Deliver what waits in the outbox, oldest first, until one fails; how many went."""
        if not self.spool.is_dir():
            return 0
        n = 0
        for p in sorted(self.spool.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime_ns):
            if not self._post(p.name, p.read_bytes()):
                break
            p.unlink()
            n += 1
        if n:
            log.info("delivered %d waiting message(s) from the outbox to %s", n, self.address)
        return n

    def send(self, name: str, data: bytes) -> None:
        waiting = self.spool.is_dir() and any(self.spool.glob("*" + SUFFIX))
        if waiting:
            self.retry()
            waiting = any(self.spool.glob("*" + SUFFIX))
        if waiting or not self._post(name, data):  # behind older ones, or undeliverable now: it waits
            make_dir(self.spool)
            atomic_write(self.spool / name, data)

    def close(self) -> None:
        pass


class HttpInbox:
    """The agent's http endpoint: ``POST /messages/NAME`` puts a message into its inbox folder."""

    def __init__(self, listen: str, inbox: Path):
        host, _, port = listen.rpartition(":")
        try:
            self.server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), self._handler(Path(inbox)))
        except (ValueError, OSError) as e:
            raise DeliveryConfigError(f"--listen-http {listen!r}: {e}") from e
        make_dir(Path(inbox))
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="delivery-http", daemon=True)
        self.thread.start()

    @staticmethod
    def _handler(inbox: Path):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                name = self.path[len(PATH_PREFIX):] if self.path.startswith(PATH_PREFIX) else ""
                length = int(self.headers.get("Content-Length") or -1)
                if not _valid_name(name) or not 0 < length <= MAX_MESSAGE_BYTES:
                    self.send_error(400, "POST /messages/NAME.msg with a body")
                    return
                data = self.rfile.read(length)
                if len(data) != length:
                    self.send_error(400, "body cut short")
                    return
                try:
                    atomic_write(inbox / name, data)
                except OSError as e:  # a full disk: the sender keeps it in its outbox
                    log.error("could not store %s from %s: %s", name, self.client_address[0], e)
                    self.send_error(507, "cannot store the message now")
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, fmt, *args) -> None:
                log.debug("http %s " + fmt, self.client_address[0], *args)

        return Handler

    def feed(self) -> int:
        return 0  # the server thread writes into the inbox as messages come

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def register() -> None:
    """Make ``http://`` addresses go through ``HttpOutbox`` (its outbox folder beside the instance)."""
    register_scheme("http", HttpOutbox)
