"""Unreplicated Transaction Logs (lost-transaction files): what a rollback took off an instance.

One file per rollback in ``<instance>/lost/``, named ``<time>-<instance>-<first>-<last>.mslost``.
Line-oriented JSON (one object per line), so that it can be read by people, grep and programs:

    line 1      {"format": "multisite-lost/1", "instance": …, "group": …, "from_seqno": F, "to_seqno": T,
                 "common_seqno": C, "reason": …, "created": …, "numbering": {"seqno": …, "stream_seqno": …},
                 "streams": {"1": <source group>, …}}
    lines 2..   one transaction per line, in commit order:
                {"seqno": …, "stream": …, "stream_seqno": …, "origin": …, "time": …,
                 "updates": [{"op": "set", "region": …, "key": […], "value": …, "before": …},
                             {"op": "kill", …, "killed": [[key, value], …]}, {"op": "zkill", …, "before": …}],
                 "payload": "<base64 of the exact journal record>"}
    last line   {"end": true, "count": N, "crc32": <CRC-32 of every byte before this line>}

Values are shown as JSON (a bytes value as its base64 text); ``payload`` keeps the exact record, which
``LostFile.records()`` decodes for applications that reprocess the transactions.

``numbering`` says which numbering each seqno is in. On a supplementary instance ``seqno`` is the
instance's own (``"local"``) and ``stream_seqno`` the seqno the transaction has on its source, in its
stream's numbering (``"source (per stream)"``; stream 0 is the instance's own transactions, counted
apart), and ``streams`` names the LMS group each stream comes from. On a BC instance both are the LMS
group's shared seqnos (``"group"``). Files written before these fields existed have neither; they
read as before (``LostFile.numbering`` is None).
``may_have_changed`` answers GT.M's $ZQGBLMOD question: could this key have been changed by the
lost transactions (so a reprocessing application must look at it with care)?
"""

from __future__ import annotations

import base64
import json
import os
import time
import zlib

import msgspec
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError, KeyTypeError, LostFileCorrupt
from ..fsutil import file_mode, fsync_dir, write_all
from ..keys import check_key
from .extract import record_to_dict
from .reader import iter_records
from .segments import list_segments
from .records import KILL, OP_NAMES, Record, decode_payload, encode_payload

FORMAT = "multisite-lost/1"
SUFFIX = ".mslost"
NUMBERING_SI = {"seqno": "local", "stream_seqno": "source (per stream)"}
NUMBERING_BC = {"seqno": "group", "stream_seqno": "group"}


_json = msgspec.json.Encoder()


def _line(obj: dict) -> bytes:
    return _json.encode(obj) + b"\n"


def lost_file_path(lost_dir: Path, instance: str, first: int, last: int) -> Path:
    """A new file name in ``lost_dir`` for the records ``first..last``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = lost_dir / f"{stamp}-{instance}-{first}-{last}{SUFFIX}"
    n = 1
    while path.exists():
        path = lost_dir / f"{stamp}-{instance}-{first}-{last}.{n}{SUFFIX}"
        n += 1
    return path


def write_lost_file(lost_dir: Path, *, instance: str, group: str, records: list[Record], common_seqno: int,
                    reason: str, path: Path | None = None, si_streams: dict[int, str] | None = None,
                    common_stream: int | None = None) -> Path:
    """Write the records (in commit order) crash-safely, to ``path`` or a new name; returns the path.
    ``si_streams`` (a supplementary instance's streams: number -> source group, maybe empty) says its
    seqnos are local and its stream seqnos its sources'; None, a BC instance's. ``common_stream``: the
    SI stream whose numbering ``common_seqno`` is in (None: this instance's own seqnos)."""
    first, last = records[0].seqno, records[-1].seqno
    if path is None:
        path = lost_file_path(lost_dir, instance, first, last)
    crc = 0
    chunks: list[bytes] = []
    head = _line({"format": FORMAT, "instance": instance, "group": group, "from_seqno": first, "to_seqno": last,
                  "common_seqno": common_seqno, "reason": reason, "created": time.time(), "count": len(records),
                  "common_seqno_stream": common_stream, **_numbering(si_streams)})
    chunks.append(head)
    for rec in records:
        d = record_to_dict(rec)
        d["payload"] = base64.b64encode(encode_payload(rec)).decode()
        chunks.append(_line(d))
    body = b"".join(chunks)
    crc = zlib.crc32(body)
    body += _line({"end": True, "count": len(records), "crc32": crc})
    tmp = path.with_name("." + path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(lost_dir))
    try:
        write_all(fd, body, str(path))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(lost_dir)
    return path


def _numbering(si_streams: dict[int, str] | None) -> dict:
    if si_streams is None:
        return {"numbering": NUMBERING_BC}
    return {"numbering": NUMBERING_SI, "streams": {str(n): g for n, g in sorted(si_streams.items())}}


@dataclass
class LostFile:
    path: Path
    header: dict
    transactions: list[dict]

    @classmethod
    def read(cls, path: str | os.PathLike) -> "LostFile":
        p = Path(path)
        try:
            data = p.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:  # a wrong path, not a damaged file
            raise ConfigError(f"{p} is not a lost-transaction file: {e.strerror}; they are in the instance's "
                              f"lost/ folder (*{SUFFIX})") from None
        except OSError as e:
            raise LostFileCorrupt(f"cannot read lost-transaction file {p}: {e}") from e
        lines = data.splitlines(keepends=True)
        if len(lines) < 2:
            raise LostFileCorrupt(f"{p} is not a complete lost-transaction file (fewer than 2 lines)")
        try:
            head = json.loads(lines[0])
            tail = json.loads(lines[-1])
        except ValueError as e:
            raise LostFileCorrupt(f"{p}: header or trailer line is not JSON ({e}); the file is damaged") from e
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise LostFileCorrupt(f"{p} is not a multisite lost-transaction file (format {head!r:.60})")
        if not isinstance(tail, dict) or not tail.get("end"):
            raise LostFileCorrupt(f"{p} is truncated: its last line is not the end marker")
        body = b"".join(lines[:-1])
        if zlib.crc32(body) != tail.get("crc32"):
            raise LostFileCorrupt(f"{p} is damaged: checksum mismatch (expected {tail.get('crc32')})")
        _check_header(head, p)
        txns = [_transaction(x, p, n) for n, x in enumerate(lines[1:-1], 2)]
        if len(txns) != tail.get("count"):
            raise LostFileCorrupt(f"{p} holds {len(txns)} transactions but its end marker says {tail.get('count')}")
        return cls(p, head, txns)

    @property
    def numbering(self) -> dict | None:
        """Which numbering ``seqno`` and ``stream_seqno`` are in (see the module docstring); None for a
        file written before it was recorded."""
        n = self.header.get("numbering")
        return n if isinstance(n, dict) else None

    @property
    def stream_groups(self) -> dict[int, str]:
        """A supplementary instance's SI streams when the file was written: number -> source group."""
        return {int(n): g for n, g in (self.header.get("streams") or {}).items()}

    def records(self) -> Iterator[Record]:
        """The exact journal records, in commit order, for reprocessing."""
        for t in self.transactions:
            try:
                yield decode_payload(base64.b64decode(t["payload"], validate=True))
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as e:  # binascii.Error too
                raise LostFileCorrupt(f"{self.path}: the payload of seqno {t['seqno']} is not a journal record "
                                      f"({e}); the file is damaged") from None

    def changes_to(self, region: str, key: tuple | list) -> list[dict]:
        """The lost updates that changed ``region``/``key``, in commit order, each as
        ``{"seqno", "op", "key"}``: a set or zkill of the key itself, or a kill of it or of a key above
        it. (A zkill removes one node only, so it does not change the keys below it.)"""
        k = list(check_key(key))
        if not isinstance(region, str):
            raise KeyTypeError(f"a region is a name (str), got {type(region).__name__} {region!r}")
        out = []
        for t in self.transactions:
            for u in t["updates"]:
                if u["region"] != region:
                    continue
                uk = u["key"]
                if uk == k or (u["op"] == "kill" and k[: len(uk)] == uk):
                    out.append({"seqno": t["seqno"], "op": u["op"], "key": uk})
        return out

    def may_have_changed(self, region: str, key: tuple | list) -> bool:
        """Could ``region``/``key`` have been changed by these lost transactions? (See ``changes_to``
        for which ones did; ``changed_on`` asks the instance that went on.)"""
        return bool(self.changes_to(region, key))

    def changed_on(self, instance_dir: str | os.PathLike, region: str, key: tuple | list) -> list[dict]:
        """GT.M's $ZQGBLMOD: the updates that the instance at ``instance_dir`` (the one that went on,
        usually the new primary) made to ``region``/``key`` after this file's common seqno, each as
        ``{"seqno", "op", "key"}``. None means no conflicting update can have happened there: a lost
        update of that key can be applied again without overwriting a later one.

        After an SI rollback the common seqno is one of the originating group's (the header's
        ``common_seqno_stream``): on an instance of that group its seqnos compare, on a supplementary
        instance (this one, its standby) the stream seqnos of that stream do."""
        k = list(check_key(key))
        if not isinstance(region, str):
            raise KeyTypeError(f"a region is a name (str), got {type(region).__name__} {region!r}")
        journal = Path(instance_dir) / "journal"
        if not journal.is_dir():
            raise ConfigError(f"{instance_dir} is not an instance directory (no journal/ in it)")
        common, stream = self.header["common_seqno"], self.header.get("common_seqno_stream")
        out = []
        infos = list_segments(journal)
        oldest = infos[0].first_seqno if infos else 1
        for rec in iter_records(journal, max(oldest, 1) if stream else common + 1, infos=infos):
            if stream and not (rec.stream == stream and rec.stream_seqno > common  # a supplementary instance
                               or rec.stream == 0 and rec.origin != self.header["instance"] and rec.seqno > common):
                continue  # (the common point is a seqno of the originating group: its own instances' seqnos)
            for u in rec.updates:
                uk = list(u.key)
                if u.region == region and (uk == k or (u.op == KILL and k[: len(uk)] == uk)):
                    out.append({"seqno": rec.seqno, "op": OP_NAMES[u.op], "key": uk})
        return out


# What a transaction line must hold for the readers (``records``, ``changes_to``, ``lost show``): a file
# whose checksum is right may still come from a broken writer (found by fuzzing: KeyError and
# JSONDecodeError leaked out of ``read`` and the commands behind it).
_TXN_FIELDS = {"seqno": int, "stream": int, "stream_seqno": int, "origin": str, "updates": list, "payload": str}
_HEAD_FIELDS = {"instance": str, "from_seqno": int, "to_seqno": int, "common_seqno": int}


def _check_header(head: dict, p: Path) -> None:
    for k, t in _HEAD_FIELDS.items():
        if type(head.get(k)) is not t:
            raise LostFileCorrupt(f"{p}: the header's {k!r} is {head.get(k)!r:.40}, not a {t.__name__}")
    streams = head.get("streams")
    if streams is not None and not (isinstance(streams, dict) and all(str(n).isdigit() for n in streams)):
        raise LostFileCorrupt(f"{p}: the header's streams are {streams!r:.60}, not numbers to source groups")


def _transaction(line: bytes, p: Path, n: int) -> dict:
    """One transaction line, checked (LostFileCorrupt naming the line otherwise)."""
    try:
        t = json.loads(line)
    except ValueError as e:
        raise LostFileCorrupt(f"{p}:{n}: not a JSON transaction ({e}); the file is damaged") from None
    if not isinstance(t, dict) or any(type(t.get(k)) is not v for k, v in _TXN_FIELDS.items()):
        raise LostFileCorrupt(f"{p}:{n}: not a transaction (it needs {', '.join(_TXN_FIELDS)})")
    for u in t["updates"]:
        if not (isinstance(u, dict) and u.get("op") in OP_NAMES.values() and isinstance(u.get("region"), str)
                and isinstance(u.get("key"), list)):
            raise LostFileCorrupt(f"{p}:{n}: an update of seqno {t['seqno']} is not {{op, region, key, ...}}")
    return t


def list_lost_files(lost_dir: str | os.PathLike) -> list[Path]:
    """The lost-transaction files in an instance's ``lost/`` folder, oldest first."""
    lost_dir = Path(lost_dir)
    return sorted(lost_dir.glob("*" + SUFFIX))
