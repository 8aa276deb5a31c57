"""Delivery messages: what one Message Agent sends another, and their bytes.

A message carries transactions of the sender's journal framed by log offsets (``journal.offsets``):
``prev`` is the offset of the last COMMIT of the previous message, ``last`` that of the last COMMIT in
this one, ``seq``/``parts`` order the messages of one transaction that spans several (all of them have
the same ``prev`` and ``last``). ``gen`` counts the sender's resends (it restarts from ``confirm_sent``
with the next one). Beside the data every message says where its sender stands, so that any message
is also a confirmation: ``confirm`` (the sender's ``confirm_received`` from the recipient),
``resend``/``resend_from`` (please resend everything after this offset; 0: from the start),
``sent_upto`` (the sender's ``log_sent`` to the recipient, so a receiver can tell that a message it
never saw was sent) and ``probe`` (a sender whose messages stay unconfirmed asks for a confirmation).
``start`` is the subscription's first offset: a receiver that has applied nothing yet starts there.

On disk and on the wire::

    b"MSDMSG01" | u8 flags | u16 sender length | sender (utf-8) | u32 body length | body | u32 crc32

The body is the msgpack of ``Message``, zstd-compressed and, when the link has a key, encrypted and
authenticated with AES-256-GCM (nonce first; magic, flags and sender are authenticated data). The
trailing CRC covers everything before it, so a truncated or damaged file is told from one that fails
authentication: ``MessageCorrupt`` and ``MessageAuthFailed`` name the message.
"""

from __future__ import annotations

import os
import struct
import zlib
import msgspec
import zstandard

from ..errors import MessageAuthFailed, MessageCorrupt
from ..journal.offsets import format_offset
from ..journal.records import Update

MAGIC = b"MSDMSG01"
FLAG_ENCRYPTED = 1
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
MAX_MESSAGE_BYTES = 1 << 30  # a length field claiming more is corrupt
_U8, _U16, _U32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I")


class Tx(msgspec.Struct, array_like=True, gc=False):
    """One transaction (or, in a multi-part message, a slice of its updates) and its COMMIT offset."""

    offset: int
    seqno: int
    updates: list[Update]


class Message(msgspec.Struct, array_like=True):
    sender: str
    recipient: str
    gen: int
    prev: int
    last: int
    seq: int = 0
    parts: int = 1
    start: int = 0
    confirm: int = 0
    resend: bool = False
    resend_from: int = 0
    probe: bool = False
    sent_upto: int = 0
    time: float = 0.0
    txs: list[Tx] = []
    resend_id: int = 0  # with ``resend``: the request's number (the sender serves each number once)

    @property
    def is_data(self) -> bool:
        return self.last > self.prev

    @property
    def name(self) -> str:
        """The seed's form: ``(gen-prev-last-seq)``."""
        return f"({self.gen}-{format_offset(self.prev)}-{format_offset(self.last)}-{self.seq})"

    @property
    def group(self) -> tuple[int, int, int, int]:
        """The messages that make up one whole: same generation, offsets and part count."""
        return (self.gen, self.prev, self.last, self.parts)


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Message)
_ZSTD_LEVEL = 3


def encode(msg: Message, key: bytes | None = None, *, level: int = _ZSTD_LEVEL) -> bytes:
    """The bytes of ``msg``; encrypted and authenticated with ``key`` when one is given."""
    body = zstandard.ZstdCompressor(level=level).compress(_enc.encode(msg))
    sender = msg.sender.encode()
    flags = 0
    head = MAGIC + _U8.pack(flags) + _U16.pack(len(sender)) + sender
    if key is not None:
        flags = FLAG_ENCRYPTED
        head = MAGIC + _U8.pack(flags) + _U16.pack(len(sender)) + sender
        body = _seal(key, body, head)
    data = head + _U32.pack(len(body)) + body
    return data + _U32.pack(zlib.crc32(data))


def peek_sender(data: bytes, what: str) -> str:
    """The sender named in the clear header (to choose the key), checked for damage first."""
    _check_frame(data, what)
    (n,) = _U16.unpack_from(data, len(MAGIC) + 1)
    return data[len(MAGIC) + 3:len(MAGIC) + 3 + n].decode("utf-8", "replace")


def decode(data: bytes, what: str, key: bytes | None = None) -> Message:
    """The message in ``data`` (``what`` names it in errors: a file, a URL). A damaged or truncated
    one is ``MessageCorrupt``; one that fails authentication, or is clear where a key is expected,
    ``MessageAuthFailed``."""
    body_at, body_len, flags, head = _check_frame(data, what)
    body = data[body_at:body_at + body_len]
    if key is not None:
        if not flags & FLAG_ENCRYPTED:
            raise MessageAuthFailed(f"message {what} is not encrypted but this link has a key: refused")
        body = _open(key, body, head, what)
    elif flags & FLAG_ENCRYPTED:
        raise MessageAuthFailed(f"message {what} is encrypted but no key is configured for its sender: refused")
    try:
        # zstandard ignores max_output_size when the frame declares its size: a few bytes declaring
        # exabytes were a MemoryError (found by fuzzing), a few declaring gigabytes an allocation of them
        size = zstandard.frame_content_size(body)
        if size > MAX_MESSAGE_BYTES:
            raise MessageCorrupt(f"message {what} declares {size} bytes once decompressed (at most "
                                 f"{MAX_MESSAGE_BYTES}); it is not applied", path=what)
        raw = zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_MESSAGE_BYTES)
        return _dec.decode(raw)
    except (zstandard.ZstdError, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise MessageCorrupt(f"message {what} cannot be decoded ({e}); it is not applied", path=what) from e


def _check_frame(data: bytes, what: str) -> tuple[int, int, int, bytes]:
    n = len(data)
    if n < len(MAGIC) + 7 + 4 or data[:len(MAGIC)] != MAGIC:
        raise MessageCorrupt(f"message {what} is not a delivery message (bad magic or {n} bytes only); "
                             f"it is not applied", path=what)
    (crc,) = _U32.unpack_from(data, n - 4)
    if zlib.crc32(data[:n - 4]) != crc:
        raise MessageCorrupt(f"message {what} is damaged or truncated ({n} bytes, checksum mismatch); "
                             f"it is not applied", path=what)
    (flags,) = _U8.unpack_from(data, len(MAGIC))
    (slen,) = _U16.unpack_from(data, len(MAGIC) + 1)
    head_end = len(MAGIC) + 3 + slen
    if head_end + 4 + 4 > n:  # a sender's name longer than the message (its checksum right): not ours
        raise MessageCorrupt(f"message {what} names a sender of {slen} bytes in {n} bytes; it is not applied",
                             path=what)
    (blen,) = _U32.unpack_from(data, head_end)
    if head_end + 4 + blen + 4 != n:
        raise MessageCorrupt(f"message {what} has a body length of {blen} that does not match its size {n}; "
                             f"it is not applied", path=what)
    return head_end + 4, blen, flags, data[:head_end]


def _seal(key: bytes, body: bytes, aad: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, body, aad)


def _open(key: bytes, body: bytes, aad: bytes, what: str) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:], aad)
    except (InvalidTag, ValueError) as e:
        raise MessageAuthFailed(f"message {what} failed authentication (wrong key for its sender, or changed "
                                f"on the way): refused, not applied") from e


def parse_key(text: str, what: str) -> bytes:
    """A link key from its text form (64 hex digits)."""
    from ..errors import DeliveryConfigError

    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise DeliveryConfigError(f"{what}: a key is {KEY_BYTES * 2} hex digits (AES-256), got {len(text.strip())} "
                                  f"characters; make one with `multisite delivery keygen`")
    return key

