"""Keys: tuples of str and int, encoded to bytes whose byte order is the key order.

Like a global variable's subscripts, integers sort before strings, and a key sorts before every key
below it (``("a",) < ("a", 1) < ("a", "x") < ("b",)``). The encoding is order preserving, so the store
keeps keys in a plain BLOB index and ``kill`` of a key is a byte range ``[enc, enc + b"\\xff")``:

- int: ``0x01`` + 8 bytes big-endian of ``value + 2**63`` (64-bit signed range);
- str: ``0x02`` + UTF-8 with ``0x00`` escaped as ``0x00 0xff``, terminated by ``0x00``.
"""

from __future__ import annotations

import json
import struct

from .errors import KeyTypeError

Key = tuple  # tuple[str | int, ...]

_INT = 0x01
_STR = 0x02
_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
_BIAS = 2**63
_PACK_Q = struct.Struct(">Q").pack
_UNPACK_Q = struct.Struct(">Q").unpack_from
KILL_END = b"\xff"  # appended to an encoded key: the end of its subtree


def check_key(key: object) -> tuple:
    """Return ``key`` as a tuple, or raise KeyTypeError saying what is wrong with it."""
    if isinstance(key, list):
        key = tuple(key)
    if not isinstance(key, tuple):
        raise KeyTypeError(f"a key must be a tuple of str and int, got {type(key).__name__} {key!r}")
    if not key:
        raise KeyTypeError("a key must have at least one subscript, got ()")
    for part in key:
        t = type(part)
        if t is int:
            if not _INT_MIN <= part <= _INT_MAX:
                raise KeyTypeError(f"integer subscript {part} of key {key!r} is outside the 64-bit signed range")
        elif t is not str:
            raise KeyTypeError(
                f"subscript {part!r} of key {key!r} is a {t.__name__}; subscripts must be str or int"
            )
    return key


def _enc_int(p: int) -> bytes:
    return b"\x01" + _PACK_Q(p + _BIAS)


def _enc_str(p: str) -> bytes:
    try:
        raw = p.encode("utf-8")
    except UnicodeEncodeError as e:
        raise KeyTypeError(f"string subscript {p!r} is not valid Unicode text ({e.reason} at position {e.start}): "
                           f"subscripts must encode to UTF-8") from None
    return b"\x02" + raw.replace(b"\x00", b"\x00\xff") + b"\x00"


_STR_CACHE: dict[str, bytes] = {}  # encoded string subscripts: the first ones of a key repeat a lot
_STR_CACHE_MAX = 4096
_STR_CACHE_LEN = 64  # longer strings are rarely shared prefixes


def encode_key(key: tuple) -> bytes:
    """Encode a checked key. Use :func:`check_key` first for input from users. (The hot path of every
    commit and of recovery: ints inline, strings through a small cache.)"""
    out = b""
    for p in key:
        t = type(p)
        if t is int:
            out += b"\x01" + _PACK_Q(p + _BIAS)
        elif t is str:
            b = _STR_CACHE.get(p)
            if b is None:
                b = _enc_str(p)
                if len(p) <= _STR_CACHE_LEN:
                    if len(_STR_CACHE) >= _STR_CACHE_MAX:
                        _STR_CACHE.clear()
                    _STR_CACHE[p] = b
            out += b
        else:
            raise KeyTypeError(f"subscript {p!r} of key {key!r} is a {t.__name__}; subscripts must be str or int")
    return out


def decode_key(data: bytes) -> tuple:
    parts: list = []
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        if tag == _INT:
            parts.append(_UNPACK_Q(data, i + 1)[0] - _BIAS)
            i += 9
        elif tag == _STR:
            j = i + 1
            buf = bytearray()
            while True:
                z = data.index(b"\x00", j)
                buf += data[j:z]
                if z + 1 < n and data[z + 1] == 0xFF:
                    buf.append(0)
                    j = z + 2
                else:
                    i = z + 1
                    break
            parts.append(buf.decode("utf-8"))
        else:
            raise KeyTypeError(f"encoded key has unknown tag 0x{tag:02x} at byte {i}")
    return tuple(parts)


def key_text(key: tuple) -> str:
    """The canonical text form of a key, as used by the CLI and the Spark source: ``("a",1)``."""
    inner = ",".join(json.dumps(p, ensure_ascii=False) if isinstance(p, str) else str(p) for p in key)
    return f"({inner})"
