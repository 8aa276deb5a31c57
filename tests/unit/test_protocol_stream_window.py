"""A streamed-compression peer may not make the receiver allocate a large zstd window.

A zstd frame header declares its window; the decompressor allocates it. zstandard's default limit is
zstd's (128 MiB), so a hostile or broken source could make every receiving connection hold 128 MiB
with a few bytes. Our sources stream with a 256 KiB window (``STREAM_TUNING_BYTES``): a frame
declaring more than ``MAX_STREAM_WINDOW_BYTES`` is refused with an error naming the window.
"""

from __future__ import annotations

import pytest
import zstandard

from multisite.errors import RemoteProtocolError
from multisite.protocol import packed
from multisite.protocol.connection import MAX_STREAM_WINDOW_BYTES, TXN_BATCH
from multisite.protocol.messages import encode_streamed

from .test_protocol_streamed_compression import batches, joined, pump


def _streamed_with_window(window_log: int) -> bytes:
    b = batches([2])[0]
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=window_log)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return encode_streamed(TXN_BATCH, packed.pack(b.first_seqno, b.frames), cobj,
                           zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def test_streamed_frame_declaring_a_128_mib_window_is_refused_naming_the_window():
    _, rcv = joined()
    with pytest.raises(RemoteProtocolError, match="window"):
        pump(_streamed_with_window(27), rcv)


def test_streamed_frame_within_the_window_limit_is_accepted():
    _, rcv = joined()
    assert MAX_STREAM_WINDOW_BYTES >= 1 << 18  # what our own sources use
    [got] = pump(_streamed_with_window(18), rcv)
    assert (got.first_seqno, got.last_seqno) == (1, 2)
