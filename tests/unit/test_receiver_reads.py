"""The receiver's reads go into one buffer kept for the connection (a BufferedProtocol), and the
stream gets exactly the bytes that came, in order: no new 256 KiB object per read."""

from __future__ import annotations

import asyncio

from multisite.replication.server.receiver_io import READ_BUFFER_BYTES, PausedAtConnect


def test_reads_reuse_one_buffer_and_deliver_exactly_the_bytes_received():
    loop = asyncio.new_event_loop()
    try:
        reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
        proto = PausedAtConnect(reader, loop=loop)
        assert isinstance(proto, asyncio.BufferedProtocol)  # the transport then reads with recv_into
        first = proto.get_buffer(-1)
        assert len(first) == READ_BUFFER_BYTES
        sent = []
        for i, size in enumerate((1, 700, READ_BUFFER_BYTES, 0, 33)):
            buf = proto.get_buffer(-1)
            assert buf is first  # the same buffer every read
            chunk = bytes([i + 1]) * size
            buf[:size] = chunk
            if size:  # a transport never reports an empty read as data
                proto.buffer_updated(size)
            sent.append(chunk)
        want = b"".join(sent)
        got = loop.run_until_complete(reader.readexactly(len(want)))
        assert got == want
    finally:
        loop.close()
