"""Replication filters (GT.M seed 001, "Filters"): transform the transactions of a link.

A filter sits in the stream of a Source Server (an *out-filter*: it transforms what is sent) or of a
Receiver Server (an *in-filter*: it transforms what goes into the receive pool). Its use is the
rolling upgrade: the instance that runs the newer application filters, turning the old shape of a
value into the new one on the way in, or the new one back into the old on the way out.

A filter sees one **transaction document** per transaction and answers exactly one, in order::

    {"seqno": 7, "stream": 0, "stream_seqno": 0, "origin": "A", "time": 1700000000.5,
     "updates": [{"op": "set", "region": "people", "key": ["p", 1],
                  "value": {"name": "Ann Lee"}, "before": null},
                 {"op": "zkill", "region": "people", "key": ["p", 2], "before": {...}},
                 {"op": "kill", "region": "people", "key": ["q"], "killed": [[["q", 1], {...}], ...]}]}

(the form of ``journal.extract.record_to_dict``). The answer keeps the ``seqno``; only its
``updates`` are used: seqno, stream tag, stream seqno, origin and time are the original's, since
they are positions, not data. An answer with no updates is an *empty transaction*: it still takes
its seqno on the other side (nothing changes in the store), so seqnos stay contiguous.

A filter must transform ``value`` and ``before`` (and a kill's ``killed``) alike: the before-images
are what a rollback restores on the instance that journals the filtered transaction.

Two forms:

- an **external command** reads transaction documents on stdin and writes its answers on stdout,
  as JSON lines (``json``: one object per line, values as JSON, so binary values do not survive) or
  as msgpack frames (``msgpack``: ``u32 little-endian length | msgpack map``, every document value
  kept as is). ``replication.server.filter_process`` runs it; no answer within ``timeout_s`` of the last one is a
  hang;
- an **in-process function** ``module:function`` is called with the document (a dict) and returns
  the answer (a dict; it may change and return the one it was given). It is fast (no process, no
  encoding) and has no timeout: it runs inside the server.

Everything here is pure: the documents, the codecs, the checks of the answers and the rebuild of a
run of journal frames from the filtered records. Any failure is a ``FilterError`` naming the seqno
of the transaction the filter failed on; the caller stops the link and uses nothing of the batch.
"""

from __future__ import annotations

import importlib
import re
import shlex
import struct
from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from ..errors import ConfigError, FilterError, ValueEncodeError
from ..journal.extract import record_to_dict
from ..journal.records import (FRAME_HEADER_SIZE, OP_CODES, FrameRun, Record, Update, encode_record,
                               record_decoder)
from ..values import encode_value

JSON, MSGPACK = "json", "msgpack"
FORMATS = (JSON, MSGPACK)
DEFAULT_FILTER_TIMEOUT_S = 5.0
MAX_FILTER_MESSAGE_BYTES = 64 * 1024 * 1024  # one answer larger than this is a broken filter
_LEN = struct.Struct("<I")
_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Answerer = Callable[[int, list[dict]], list[Any]]  # (first seqno, documents) -> answers


@dataclass(frozen=True)
class FilterSpec:
    """A filter as configured: ``text`` as given (logs and status name it), and either the command's
    ``argv`` or an in-process ``function`` (``module:function``)."""

    text: str
    argv: tuple[str, ...] = ()
    function: str = ""
    fmt: str = JSON
    timeout_s: float = DEFAULT_FILTER_TIMEOUT_S

    @classmethod
    def parse(cls, text: str, fmt: str = JSON, timeout_s: float = DEFAULT_FILTER_TIMEOUT_S) -> "FilterSpec":
        """``module:function`` (a dotted module name, a colon, a name: nothing else) is in-process;
        anything else is a command line, split as a shell would (``shlex``) but run without one."""
        text = (text or "").strip()
        if not text:
            raise ConfigError("--filter needs a command or a module:function")
        if fmt not in FORMATS:
            raise ConfigError(f"--filter-format takes {' or '.join(FORMATS)}, got {fmt!r}")
        if not timeout_s > 0:
            raise ConfigError(f"--filter-timeout must be positive, got {timeout_s}")
        if _FUNCTION.match(text):
            return cls(text, function=text, fmt=fmt, timeout_s=float(timeout_s))
        try:
            argv = tuple(shlex.split(text))
        except ValueError as e:
            raise ConfigError(f"--filter {text!r} is not a command line: {e}") from None
        return cls(text, argv=argv, fmt=fmt, timeout_s=float(timeout_s))

    @property
    def in_process(self) -> bool:
        return bool(self.function)

    def to_dict(self) -> dict:
        return {"filter": self.text, "filter_format": self.fmt, "filter_timeout_s": self.timeout_s}


# -- documents and codecs -------------------------------------------------------------------------

def transaction_doc(rec: Record) -> dict:
    """The document a filter is given for one transaction."""
    return record_to_dict(rec)


_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def encode_message(doc: dict, fmt: str) -> bytes:
    """One document as it goes to (or comes from) an external filter."""
    if fmt == JSON:
        return _json_encoder.encode(doc) + b"\n"
    body = _msgpack_encoder.encode(doc)
    return _LEN.pack(len(body)) + body


class AnswerReader:
    """Sans-IO reader of a filter's output: ``feed`` bytes as they come, get the complete answers.
    A malformed one raises ``FilterError`` naming the seqno it stood for (``first_seqno`` + its
    index in the batch: answers are in step with the documents sent, one for one)."""

    def __init__(self, fmt: str, name: str = "filter"):
        self.fmt, self.name = fmt, name
        self._buf = bytearray()
        self.first_seqno = 0
        self.count = 0  # answers returned since ``expect``

    def expect(self, first_seqno: int) -> None:
        """A new batch starts at ``first_seqno``; what is still buffered is a surplus answer."""
        surplus = self._buf.strip() if self.fmt == JSON else self._buf
        if surplus:
            raise FilterError(f"{self.name} wrote more answers than transactions it was given (before seqno "
                              f"{first_seqno}): it is out of step")
        self._buf.clear()
        self.first_seqno, self.count = first_seqno, 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out = []
        while True:
            seqno = self.first_seqno + self.count
            if self.fmt == JSON:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if len(self._buf) > MAX_FILTER_MESSAGE_BYTES:
                        raise FilterError(f"{self.name}: the answer for seqno {seqno} exceeds "
                                          f"{MAX_FILTER_MESSAGE_BYTES} bytes with no end of line")
                    return out
                body = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                if not body.strip():
                    raise FilterError(f"{self.name} wrote an empty line for seqno {seqno}; every transaction "
                                      f"needs one JSON object (with no updates for an empty transaction)")
                try:
                    ans = msgspec.json.decode(body)
                except msgspec.DecodeError as e:
                    raise FilterError(f"{self.name} answered seqno {seqno} with malformed JSON: {e}: "
                                      f"{body[:120]!r}") from None
            else:
                if len(self._buf) < 4:
                    return out
                (n,) = _LEN.unpack_from(self._buf, 0)
                if n > MAX_FILTER_MESSAGE_BYTES:
                    raise FilterError(f"{self.name}: the answer for seqno {seqno} claims {n} bytes")
                if len(self._buf) < 4 + n:
                    return out
                body = bytes(self._buf[4:4 + n])
                del self._buf[:4 + n]
                try:
                    ans = msgspec.msgpack.decode(body)
                except msgspec.DecodeError as e:
                    raise FilterError(f"{self.name} answered seqno {seqno} with malformed msgpack: {e}") from None
            out.append(ans)
            self.count += 1


# -- checks and the rebuild -----------------------------------------------------------------------

def _key(k: Any, where: str) -> tuple:
    if not isinstance(k, (list, tuple)) or not all(type(p) in (int, str) for p in k):
        raise FilterError(f"{where}: key {k!r:.80} is not a list of strings and integers")
    return tuple(k)


def _val(v: Any, where: str) -> bytes | None:
    if v is None:
        return None
    try:
        return encode_value(v)
    except ValueEncodeError as e:
        raise FilterError(f"{where}: {e.message}") from None


def record_from_answer(orig: Record, ans: Any, name: str = "filter") -> Record:
    """The filtered record: ``orig``'s positions with the answer's updates. ``FilterError`` naming
    the seqno unless the answer is a document for this very seqno with well-formed updates."""
    seqno = orig.seqno
    if not isinstance(ans, dict):
        raise FilterError(f"{name} answered seqno {seqno} with a {type(ans).__name__}, not a transaction object")
    if ans.get("seqno") != seqno or type(ans.get("seqno")) is not int:
        raise FilterError(f"{name} is out of step: it answered seqno {ans.get('seqno')!r} for seqno {seqno} "
                          f"(one answer per transaction, in order, keeping its seqno)")
    ups = ans.get("updates")
    if not isinstance(ups, list):
        raise FilterError(f"{name} answered seqno {seqno} without an 'updates' list "
                          f"(an empty list makes an empty transaction)")
    out = []
    for i, u in enumerate(ups):
        where = f"{name}, seqno {seqno}, update {i}"
        if not isinstance(u, dict):
            raise FilterError(f"{where}: not an object")
        op = OP_CODES.get(u.get("op"))
        region = u.get("region")
        if op is None:
            raise FilterError(f"{where}: op {u.get('op')!r} is not one of set, kill, zkill")
        if not isinstance(region, str) or not region:
            raise FilterError(f"{where}: region {region!r} is not a name")
        key = _key(u.get("key"), where)
        if u.get("op") == "set":
            if u.get("value") is None:
                raise FilterError(f"{where}: a set needs a value (to remove the key, answer a zkill)")
            out.append(Update(op, region, key, _val(u["value"], where), _val(u.get("before"), where)))
        elif u.get("op") == "zkill":
            out.append(Update(op, region, key, None, _val(u.get("before"), where)))
        else:
            killed = u.get("killed") or []
            if not isinstance(killed, list):
                raise FilterError(f"{where}: 'killed' is not a list of [key, value] pairs")
            pairs = []
            for kv in killed:
                if not isinstance(kv, (list, tuple)) or len(kv) != 2 or kv[1] is None:
                    raise FilterError(f"{where}: 'killed' holds {kv!r:.80}, not a [key, value] pair")
                pairs.append((_key(kv[0], where), _val(kv[1], where)))
            out.append(Update(op, region, key, None, None, pairs))
    return Record(orig.seqno, orig.stream, orig.stream_seqno, orig.origin, orig.time, out)


def decode_run(run: FrameRun) -> list[Record]:
    view, start, out = memoryview(run.data), 0, []
    for end in run.ends:
        out.append(record_decoder.decode(view[start + FRAME_HEADER_SIZE:end]))
        start = end
    return out


def filter_run(run: FrameRun, answer: Answerer, name: str = "filter") -> FrameRun:
    """``run`` through a filter: its transactions as documents to ``answer`` (which returns one answer
    per document, or raises ``FilterError``), each answer checked, the new frames built (new CRCs:
    the filtered bytes are this filter's, not the primary's). ``FilterError`` on any failure, with
    nothing built."""
    recs = decode_run(run)
    answers = answer(run.first_seqno, [transaction_doc(r) for r in recs])
    # Each answer in order first: a surplus or a missing answer shows as the first seqno out of step.
    frames = [(r.seqno, encode_record(record_from_answer(r, a, name))) for r, a in zip(recs, answers)]
    if len(answers) != len(recs):
        which = run.first_seqno + min(len(answers), len(recs))
        raise FilterError(f"{name} answered {len(answers)} transaction(s) for {len(recs)} (seqnos "
                          f"{run.first_seqno}..{run.last_seqno}): out of step at seqno {which}")
    return FrameRun.of(frames)


# -- in-process filters ---------------------------------------------------------------------------

def load_function(spec: str) -> Callable[[dict], dict]:
    """The function named by ``module:function``; ``ConfigError`` if it cannot be imported."""
    mod, _, fn = spec.partition(":")
    try:
        f = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--filter {spec}: cannot load {fn!r} from module {mod!r}: {e}") from None
    if not callable(f):
        raise ConfigError(f"--filter {spec}: {fn!r} is not callable")
    return f


def function_answerer(fn: Callable[[dict], dict], name: str) -> Answerer:
    """An ``Answerer`` that calls ``fn`` on each document; an exception in it is a ``FilterError``
    naming the seqno."""
    def answer(first_seqno: int, docs: list[dict]) -> list[Any]:
        out = []
        for i, d in enumerate(docs):
            try:
                out.append(fn(d))
            except Exception as e:
                raise FilterError(f"{name} raised {e!r} on seqno {first_seqno + i}") from e
        return out
    return answer
