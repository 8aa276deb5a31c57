"""Values: msgpack documents, and the check that a value reads back as what was written.

msgspec would happily encode a ``set`` as an array, a ``datetime`` or ``Decimal`` as a string and a
dataclass as a map; each would then read back as something else than was stored. So a value is
checked to be a document first: None, bool, int, float, str, bytes (bytearray, memoryview), and
lists, tuples and dicts of documents. Scalars, the common case, cost one type test.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import ValueEncodeError

_encode = msgspec.msgpack.Encoder().encode
decode_value = msgspec.msgpack.decode

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_SCALAR_BASES = (int, float, str, bytes, bytearray, memoryview)  # subclasses such as IntEnum too


def _check_document(value: Any) -> None:
    """Raise TypeError unless ``value`` is a document. Scalar members are checked inline, not by a call."""
    t = type(value)
    if t in _SCALARS:
        return
    scalars = _SCALARS
    if t is dict or (t is not list and t is not tuple and isinstance(value, dict)):
        for k, v in value.items():
            if type(k) not in scalars:
                _check_document(k)
            if type(v) not in scalars:
                _check_document(v)
    elif t is list or t is tuple or isinstance(value, (list, tuple)):
        for v in value:
            if type(v) not in scalars:
                _check_document(v)
    elif not isinstance(value, _SCALAR_BASES):
        raise TypeError(f"a {t.__name__} is not a document type")


def encode_value(value: Any) -> bytes:
    """The msgpack bytes of ``value``; ValueEncodeError if it is not a document."""
    try:
        t = type(value)
        if t is dict:  # the common document: a flat dict of scalars, checked without a call
            scalars = _SCALARS
            for k, v in value.items():
                if type(k) not in scalars or type(v) not in scalars:
                    _check_document(value)
                    break
        elif t not in _SCALARS:
            _check_document(value)
        return _encode(value)
    except (TypeError, OverflowError, ValueError, RecursionError) as e:
        raise ValueEncodeError(f"value {value!r:.80} cannot be stored: {e}; values must be msgpack-able "
                               f"documents (None, bool, int, float, str, bytes, lists, dicts)") from e
