"""Fuzz targets for what multisite reads from files: journal segments (through recovery and the
reader), lost-transaction files, TOML configuration (``--config`` files and ``grid.toml``) (issue 28).

Each input is written to a file under ``FUZZ_TMP`` (a tmpfs by default: ``/dev/shm``) and read the
way the project reads it. Checksums stop almost every mutation at the first check, so the first byte
of an input may ask for them to be made right before the file is written (the segment's header CRC,
each frame's CRCs, a lost file's trailer): mutations then reach the parsing behind them, as damage
that a checksum happened to miss, or a file written by a broken program, would.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

from multisite import config
from multisite.grid.policy import parse_policy
from multisite.journal.lostfile import LostFile, write_lost_file
from multisite.journal.reader import iter_records
from multisite.journal.records import FRAME_HEADER, KILL, SET, Record, Update, encode_record
from multisite.journal.recovery import recover_journal
from multisite.journal.segments import SEGMENT_HEADER_SIZE, SegmentHeader, segment_name

from fuzz.target import Target

_ROOT = Path(tempfile.mkdtemp(prefix="multisite-fuzz-", dir=os.environ.get("FUZZ_TMP", "/dev/shm")))
atexit.register(shutil.rmtree, _ROOT, True)
_HDR = struct.Struct("<8sHHIQIQd")


def _records(first: int, n: int) -> list[Record]:
    return [Record(s, 0, s, "A", 1.7e9 + s, [Update(SET, "acct", ("k", s), b"\x91\x01", None),
                                             Update(KILL, "acct", ("j",), None, None, [(("j", 1), b"\x01")])])
            for s in range(first, first + n)]


# -- journal segments -----------------------------------------------------------------------------

def _fix_segment(data: bytes, header: bool, frames: bool) -> bytes:
    buf = bytearray(data)
    if header and len(buf) >= _HDR.size + 4:
        struct.pack_into("<I", buf, _HDR.size, zlib.crc32(bytes(buf[:_HDR.size])))
    off = SEGMENT_HEADER_SIZE
    while frames and off + FRAME_HEADER.size <= len(buf):
        length, seqno, _, _ = FRAME_HEADER.unpack_from(buf, off)
        end = off + FRAME_HEADER.size + length
        if end > len(buf):
            break
        pcrc = zlib.crc32(bytes(buf[off + FRAME_HEADER.size:end]))
        head = struct.pack("<IQI", length, seqno, pcrc)
        buf[off:off + FRAME_HEADER.size] = head + struct.pack("<I", zlib.crc32(head))
        off = end
    return bytes(buf)


SPLIT = b"MSJSEG01"  # where a second segment starts in an input of two (its header's magic)


def run_segment(data: bytes) -> None:
    """Bits of the first byte: 0 fix the headers' CRCs, 1 fix every frame's CRCs, 2 repair a torn tail,
    3 two segments (the second from the input's second segment magic on: a sealed one and the tail)."""
    if not data:
        return
    journal = _ROOT / "journal"
    shutil.rmtree(journal, ignore_errors=True)
    journal.mkdir()
    at = data.find(SPLIT, 2) if data[0] & 8 else -1
    parts = [data[1:at], data[at:]] if at > 0 else [data[1:]]
    for i, part in enumerate(parts, 1):
        (journal / segment_name(i)).write_bytes(_fix_segment(part, bool(data[0] & 1), bool(data[0] & 2)))
    recover_journal(journal, repair=bool(data[0] & 4))
    for _ in iter_records(journal):
        pass


def seeds_segment() -> list[bytes]:
    head = SegmentHeader(1, 1, 0, 0, 1.7e9).pack()
    body = b"".join(encode_record(r) for r in _records(1, 5))
    second = SegmentHeader(2, 6, 1, 5, 1.7e9).pack() + b"".join(encode_record(r) for r in _records(6, 3))
    return [bytes([0]) + head + body, bytes([1]) + head + body + b"\0" * 64, bytes([7]) + head + body[:-7],
            bytes([8]) + head + body + second]


# -- lost-transaction files -----------------------------------------------------------------------

def _fix_trailer(data: bytes) -> bytes:
    """The lines but the last, with an end marker that counts and checks them."""
    lines = data.splitlines(keepends=True)
    body = b"".join(lines[:-1]) if len(lines) > 1 else data
    if body and not body.endswith(b"\n"):
        body += b"\n"
    count = max(len(body.splitlines()) - 1, 0)
    return body + json.dumps({"end": True, "count": count, "crc32": zlib.crc32(body)}).encode() + b"\n"


def run_lost(data: bytes) -> None:
    """Bit 0 of the first byte: make the end marker right first. Then what programs read of it."""
    if not data:
        return
    path = _ROOT / "fuzz.mslost"
    path.write_bytes(_fix_trailer(data[1:]) if data[0] & 1 else data[1:])
    lf = LostFile.read(path)
    lf.numbering, lf.stream_groups
    for _ in lf.records():
        pass
    lf.changes_to("acct", ["k", 1])
    lf.may_have_changed("acct", ["j"])


def seeds_lost() -> list[bytes]:
    lost = _ROOT / "seed-lost"
    shutil.rmtree(lost, ignore_errors=True)
    lost.mkdir()
    p = write_lost_file(lost, instance="A", group="g", records=_records(3, 4), common_seqno=2, reason="fuzz seed")
    data = Path(p).read_bytes()
    return [bytes([0]) + data, bytes([1]) + data]


# -- TOML configuration ---------------------------------------------------------------------------

def run_config(data: bytes) -> None:
    """A ``--config`` file: loaded, then every table asked for as the start commands ask."""
    path = _ROOT / "fuzz.toml"
    path.write_bytes(data)
    cfg = config.load(path)
    for section in config.SECTIONS:
        t = cfg.table(section) if section not in config.NAMED_SECTIONS else None
        for key in t or ():
            cfg.where(section, key)
        for name in cfg.names(section) if section in config.NAMED_SECTIONS else ():
            cfg.table(f"{section}.{name}")
            cfg.where(section, name)
        cfg.where(section)


def seeds_config() -> list[bytes]:
    return [b'[server]\nlisten = "127.0.0.1:7000"\ndurability = "group"\n\n[source.B]\naddress = "h:1"\n'
            b'compress = 3\n\n[receiver]\nlisten = "0.0.0.0:7100"\n',
            b'[catalog]\ngrid = "grid.toml"\nheartbeat_timeout_s = 1.5\n[docserver]\nreplicators = 4\n'
            b'peer = ["A=h:1", "B=h:2"]\n[dashboard]\n# a comment\n']


def run_grid_policy(data: bytes) -> None:
    """A ``grid.toml`` (the grid's policy), as text: how the catalog reads it after decoding the file."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return  # load_policy reads text; its decoding is run_config's case
    parse_policy(text, "fuzz.toml")


def seeds_grid_policy() -> list[bytes]:
    return [b'name = "orders"\npartitions = 4\nmin_sync = 1\nmax_sync = 1\nmax_async = 1\n[maps.m]\n',
            b'name = "g"\npartitions = 8\nmin_sync = 0\nmax_sync = 2\nmax_async = 0\ninitial_containers = 2\n'
            b'zones = ["a", "b"]\n[maps.m]\n[maps.n]\n']


TARGETS = {t.name: t for t in [
    Target("journal_segment", run_segment, seeds_segment),
    Target("journal_lostfile", run_lost, seeds_lost),
    Target("config_toml", run_config, seeds_config),
    Target("grid_policy_toml", run_grid_policy, seeds_grid_policy),
]}
