"""``multisite.connect("HOST:PORT")``: the engine's API over the wire, against an instance server.

The same names as an embedded ``Database``: get / items / set / kill / zkill / transaction /
create_region / seqno. A transaction is collected locally and sent as one request at commit.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import threading
import time
from typing import Any, Iterator

from .. import errors
from ..engine.transaction import ThreadState, TransactionBase
from ..errors import (AuthenticationFailed, ConfigError, ConnectionLost, MultisiteError, NotPrimary,
                      PermissionDenied, RemoteProtocolError, TransactionError)
from ..journal.records import KILL, SET, ZKILL
from ..keys import check_key
from ..protocol.client import MAX_CLIENT_FRAME_BYTES, FrameBuffer, encode
from ..values import encode_value
from ..protocol.messages import PROTOCOL_VERSION, HistoryEntry, Hello
from ..net.tls import parse_hostport


FAILOVER_TIMEOUT_S = 30.0  # a multi-host client looks this long for a primary before giving up
PRIMARY_POLL_S = 0.05  # between two rounds over the addresses while none is the primary
FETCH_HELLO_TIMEOUT_S = 5.0  # --fetchresync's question to the source: the receiver applies nothing meanwhile
CONNECT_TIMEOUT_S = 2.0  # one address of a multi-host string: a member that does not answer is skipped
RETRIED_OPS = frozenset({"get", "items", "info", "history", "regions"})  # safe to send again elsewhere


def parse_addresses(address: str) -> list[str]:
    """``"h1:p1,h2:p2"`` as a list, each checked; one address is a list of one."""
    addrs = [a.strip() for a in address.split(",") if a.strip()]
    if not addrs:
        raise ConfigError(f"connect: expected HOST:PORT[,HOST:PORT...], got {address!r}")
    for a in addrs:
        parse_hostport(a)
    return addrs


def outcome_unknown(address: str, op: str, addresses: list[str]) -> errors.CommitOutcomeUnknown:
    """The error of a request whose answer a failover lost: never sent again (it may have committed)."""
    return errors.CommitOutcomeUnknown(
        f"the connection to the primary {address} was lost before {op!r} was answered: it may have committed "
        f"or not (it is not sent again); the next call connects to the primary of {','.join(addresses)}")


def no_primary(addresses: list[str], timeout_s: float, seen: dict[str, str]) -> ConnectionLost:
    """No address answered as the primary within ``timeout_s``: what each answered."""
    return ConnectionLost(f"no primary among {', '.join(addresses)} within {timeout_s:g} s: "
                          + ", ".join(f"{a}: {w}" for a, w in seen.items()))


class RemoteDatabase:
    """One instance server over the wire, or with several addresses (``"h1:p1,h2:p2,h3:p3"``) whichever
    of them is the primary, as libpq's multi-host strings with ``target_session_attrs=read-write``.

    With several addresses a lost connection is opened again to the member that is the primary now
    (after a failover, the new one): reads and requests the old primary refused with NOT_PRIMARY are
    sent there; a commit whose answer was lost raises ``CommitOutcomeUnknown`` and is never sent again
    (it may have committed)."""

    def __init__(self, address: str, timeout: float = 30.0, *, user: str | None = None, password: str | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                 tls_check_hostname: bool = True, failover_timeout_s: float = FAILOVER_TIMEOUT_S):
        self.addresses = parse_addresses(address)
        self.address = self.addresses[0]
        if password is not None and user is None:
            raise ConfigError("connect: a password needs a user (user=NAME, password=SECRET)")
        self._timeout, self._user, self._password = timeout, user, password
        self._tls = client_tls_context(tls_ca, tls_cert, tls_key, tls_check_hostname)
        self._auth = user is not None or bool(tls_cert)
        self.failover_timeout_s = failover_timeout_s
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._local = ThreadState()
        self._sock: socket.socket | None = None
        self._broken: str | None = None  # why the connection can no longer be used
        self._broken_op = ""
        self.user: dict | None = None  # the server's answer to hello: user, role, by
        if len(self.addresses) == 1:
            self._open(self.address, timeout)
        else:
            with self._lock:
                self._open_primary()

    @property
    def multi_host(self) -> bool:
        return len(self.addresses) > 1

    def _open(self, address: str, timeout: float) -> None:
        """Connect to ``address`` (TLS and hello as configured); the connection this object uses."""
        host, port = parse_hostport(address)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to instance server at {address}: {e}") from e
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=host)
            except OSError as e:  # ssl.SSLError, a reset: the server refused the handshake
                sock.close()
                raise ConnectionLost(f"TLS handshake with the instance server at {address} failed: {e}") from e
        sock.settimeout(timeout)  # the login too: a member that does not answer is passed by in time
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self.address, self._buf = sock, address, FrameBuffer()
        self._broken, self.user = None, None
        if self._auth:
            try:
                self.user = self._request("hello", user=self._user, password=self._password)
            except ConnectionLost as e:
                if isinstance(e.__cause__, ssl.SSLError):  # TLS 1.3: the server's verdict on the certificate
                    raise AuthenticationFailed(f"the instance server at {address} refused this client's TLS "
                                               f"certificate: {e.__cause__.reason or e.__cause__}") from e
                raise
            finally:
                if self.user is None:
                    sock.close()  # refused: the server closes it too

    def _open_primary(self) -> None:
        """Open a connection to whichever address is the primary, looking for up to
        ``failover_timeout_s``; ConnectionLost naming what each address answered when none is."""
        deadline = time.monotonic() + self.failover_timeout_s
        while True:
            seen = {}
            for addr in self.addresses:
                probe_s = min(self._timeout, CONNECT_TIMEOUT_S)
                try:
                    self._open(addr, probe_s)  # a paused member's kernel accepts, and nothing answers
                    role = writable_role(self._request("info"))
                    self._sock.settimeout(self._timeout)
                except (AuthenticationFailed, PermissionDenied):
                    raise
                except MultisiteError as e:
                    seen[addr] = e.code
                    self._drop()
                    continue
                if role == "primary":
                    return
                seen[addr] = role
                self._drop()
            if time.monotonic() >= deadline:
                raise no_primary(self.addresses, self.failover_timeout_s, seen)
            time.sleep(PRIMARY_POLL_S)

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._broken, self._broken_op = "closed", ""

    def _call(self, op: str, **args: Any) -> Any:
        with self._lock:
            if not self.multi_host:
                return self._request(op, **args)
            return self._call_primary(op, args)

    def _call_primary(self, op: str, args: dict) -> Any:
        """A request to the primary of a multi-host string, following a failover (see the class)."""
        deadline = time.monotonic() + self.failover_timeout_s
        while True:
            if self._broken is not None:
                self._open_primary()
            try:
                return self._request(op, **args)
            except NotPrimary:  # refused before it was applied: the primary moved, send it there
                self._drop()
            except ConnectionLost as e:
                if op not in RETRIED_OPS:
                    raise outcome_unknown(self.address, op, self.addresses) from e
            if time.monotonic() >= deadline:
                raise ConnectionLost(f"{op!r} found no primary among {', '.join(self.addresses)} within "
                                     f"{self.failover_timeout_s:g} s")

    def _request(self, op: str, **args: Any) -> Any:
        """One request and its reply on the current connection (the caller holds the lock)."""
        if self._broken is not None:
            # A request whose reply never came (a timeout, a cut) leaves that reply, or part of
            # it, on the way: read on and this call would take the last call's answer for its own.
            raise ConnectionLost(f"the connection to {self.address} was lost earlier ({self._broken}); "
                                 f"connect again (whether that {self._broken_op!r} took effect is unknown)")
        rid = next(self._ids)
        frame = encode([rid, op, args])
        if len(frame) - 4 > MAX_CLIENT_FRAME_BYTES:  # the server would cut the connection mid-send
            raise TransactionError(f"{op} request of {len(frame) - 4:,} bytes exceeds the client protocol's "
                                   f"limit of {MAX_CLIENT_FRAME_BYTES:,} bytes; split it into smaller ones")
        sock = self._sock
        try:
            sock.sendall(frame)
            while True:
                msg = self._buf.next()
                if msg is not None:
                    break
                data = sock.recv(1 << 20)
                if not data:
                    raise ConnectionLost(f"instance server at {self.address} closed the connection")
                self._buf.feed(data)
            if not (isinstance(msg, list) and len(msg) == 3 and msg[0] in (rid, None)):
                raise RemoteProtocolError(f"instance server at {self.address} answered request {rid} "
                                          f"with {msg!r:.80}")
        except OSError as e:
            self._lose(op, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            raise ConnectionLost(f"connection to {self.address} failed: {e}") from e
        except MultisiteError as e:  # closed by the server, or a reply that cannot be read
            self._lose(op, e.message)
            raise
        if msg[0] is None:  # the server could not read the request and closed the connection
            self._lose(op, f"{msg[2][0]}: {msg[2][1]}")
        return result_of(msg)

    def _lose(self, op: str, why: str) -> None:
        self._broken, self._broken_op = why, op
        self._sock.close()

    # -- the Database API ------------------------------------------------------------------------
    @property
    def seqno(self) -> int:
        return self._call("info")["seqno"]

    def info(self) -> dict:
        return self._call("info")

    def create_region(self, name: str, replicated: bool = True, schema: str | None = None) -> None:
        self._call("create_region", name=name, replicated=replicated, schema=schema)

    def regions(self) -> dict[str, bool]:
        """Region name -> replicated, as ``Database.regions``."""
        return self._call("regions")

    def get(self, region: str, key: tuple) -> Any:
        return self._call("get", region=region, key=list(check_key(key)))

    def items(self, region: str, start: tuple | None = None, stop: tuple | None = None,
              batch: int = 1000) -> Iterator[tuple[tuple, Any]]:
        lo, inclusive = (list(check_key(start)) if start is not None else None), True
        while True:
            rows = self._call("items", region=region, start=lo, stop=list(check_key(stop)) if stop else None,
                              limit=batch, inclusive=inclusive)
            for k, v in rows:
                yield tuple(k), v
            if len(rows) < batch:
                return
            lo, inclusive = rows[-1][0], False

    def transaction(self) -> "RemoteTransaction":
        return RemoteTransaction(self)

    def set(self, region: str, key: tuple, value: Any) -> int:
        return self._single([SET, region, list(check_key(key)), _document(value)])

    def kill(self, region: str, key: tuple) -> int:
        return self._single([KILL, region, list(check_key(key)), None])

    def zkill(self, region: str, key: tuple) -> int:
        return self._single([ZKILL, region, list(check_key(key)), None])

    def _single(self, update: list) -> int:
        if self._local.tx is not None:  # as the embedded engine: not a silent separate commit
            raise TransactionError("db.set/kill/zkill inside an open transaction would nest transactions: "
                                   "use tx.set/kill/zkill on the transaction instead")
        return self._call("commit", ops=[update])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "RemoteDatabase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WireUpdates:
    """A client transaction's set / kill / zkill, as the wire carries them; ``_add`` takes each."""

    def _add(self, update: list) -> None:
        raise NotImplementedError

    def set(self, region: str, key: tuple, value: Any) -> None:
        self._add([SET, region, list(check_key(key)), _document(value)])

    def kill(self, region: str, key: tuple) -> None:
        self._add([KILL, region, list(check_key(key)), None])

    def zkill(self, region: str, key: tuple) -> None:
        self._add([ZKILL, region, list(check_key(key)), None])


class RemoteTransaction(WireUpdates, TransactionBase):
    """As the embedded ``Transaction``: updates are collected while it is open and committed as one
    request when the ``with`` block ends (or by ``commit()``); an update to a transaction that is
    not open is an error, not an update silently never sent."""

    def __init__(self, db: RemoteDatabase):
        super().__init__(db._local)
        self.db = db

    def _send(self, ops: list) -> int:
        return self.db._call("commit", ops=ops)

    def _add(self, update: list) -> None:
        self._require_open()
        self.ops.append(update)


def result_of(reply: list) -> Any:
    """The result of an ``[id, ok, result]`` reply, or the error it carries raised as its own class."""
    _id, ok, result = reply
    if ok:
        return result
    code, message = result
    cls = next((c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, MultisiteError)
                and c.code == code), MultisiteError)
    err = cls.__new__(cls)
    MultisiteError.__init__(err, message)
    raise err


def writable_role(info: dict) -> str:
    """The role an ``info`` answer gives for following the primary: a primary whose leader lease ended
    (fenced by its HA manager, perhaps cut off from etcd while another member took over) takes no
    commit, so it is no primary to write to: "primary (fenced)"."""
    role = info["role"]
    return "primary (fenced)" if role == "primary" and info.get("fenced") else role


def _document(value: Any) -> Any:
    """Refuse here what the embedded engine refuses (ValueEncodeError): on the wire a set, say,
    would silently become a list and read back as something else than was written."""
    encode_value(value)
    return value


def connect(address: str, timeout: float = 30.0, *, user: str | None = None, password: str | None = None,
            tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
            tls_check_hostname: bool = True, failover_timeout_s: float = FAILOVER_TIMEOUT_S) -> RemoteDatabase:
    """Connect to the instance server listening at ``HOST:PORT``, or to whichever of ``"H1:P1,H2:P2,..."``
    is the primary (and, after a failover, to the new one: see ``RemoteDatabase``).

    ``user`` and ``password`` (or a token) authenticate on a server that has users; ``tls_ca`` makes
    the connection TLS, checking the server's certificate (and its host name) against that CA, and
    ``tls_cert``/``tls_key`` present a client certificate: its common name is the user, so ``user``
    without ``password`` asks to be that user. AuthenticationFailed and PermissionDenied come back
    as those classes. ``tls_check_hostname=False`` accepts a server certificate the CA signed whatever
    host it names (as the replication links do: their certificates may name instances, not hosts)."""
    return RemoteDatabase(address, timeout, user=user, password=password, tls_ca=tls_ca, tls_cert=tls_cert,
                          tls_key=tls_key, tls_check_hostname=tls_check_hostname,
                          failover_timeout_s=failover_timeout_s)


def client_tls_context(ca: str | None, cert: str | None, key: str | None,
                       check_hostname: bool = True) -> ssl.SSLContext | None:
    """The client's TLS context: None without ``ca``; ConfigError for a certificate without its key or CA,
    or files that cannot be loaded."""
    if ca is None:
        if cert or key:
            raise ConfigError("connect: tls_cert and tls_key need tls_ca (the CA that signed the server's certificate)")
        return None
    if bool(cert) != bool(key):
        raise ConfigError("connect: a client certificate needs both tls_cert and tls_key")
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"connect: cannot load TLS files (ca {ca}, cert {cert}, key {key}): {e}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    return ctx


def fetch_hello(address: str, tls_ca: str | None = None) -> Hello:
    """The instance server at ``address`` describes itself as a source would (for --fetchresync). The
    ``history`` op needs no authentication; with ``tls_ca`` the connection is TLS, the server's
    certificate checked against the CA but not against the host name (as on the replication links)."""
    with RemoteDatabase(address, FETCH_HELLO_TIMEOUT_S, tls_ca=tls_ca, tls_check_hostname=False) as remote:
        h = remote._call("history")
    return Hello(version=PROTOCOL_VERSION, name=h["name"], group=h["group"], supplementary=h["supplementary"],
                 role=h["role"], seqno=h["seqno"], history=[HistoryEntry(*e) for e in h["history"]])
