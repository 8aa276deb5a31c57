"""Before streaming, a frame may be at most HANDSHAKE_FRAME_BYTES (Hello, Start and Error are small).

Every connection used to accept a 64 MiB first frame from a peer nobody had vouched for yet: a
receiver buffered up to 64 MiB per connection still in its handshake (eight connections: 500 MiB).
"""

from __future__ import annotations

import pytest

from multisite.errors import RemoteProtocolError
from multisite.protocol.connection import NEED_DATA, Connection, Role, State
from multisite.protocol.messages import (FRAME_PREFIX, HANDSHAKE_FRAME_BYTES, Hello, HistoryEntry, Start,
                                         encode_message)

from .test_protocol import assert_stuck_in_error, batch, handshake, hello, reach

S, R = Role.SOURCE, Role.RECEIVER


@pytest.mark.parametrize("role,state", [(R, State.IDLE), (R, State.WAIT_START), (S, State.HELLO_SENT)])
def test_a_large_frame_before_streaming_is_refused_at_its_prefix(role, state):
    c = reach(role, state)
    c.receive_data(FRAME_PREFIX.pack(HANDSHAKE_FRAME_BYTES + 2, 1))
    with pytest.raises(RemoteProtocolError, match="handshake"):
        c.next_event()
    assert_stuck_in_error(c)


def test_handshake_messages_up_to_the_limit_still_pass():
    big = hello("A")
    big.history = [HistoryEntry(i + 1, "A" * 40, i) for i in range(5000)]  # ~300 KB of history
    c = Connection(R)
    c.receive_data(encode_message(big))
    assert c.next_event() == big


def test_streaming_keeps_the_full_frame_limit():
    src, rcv = handshake(src_seqno=3000, rcv_seqno=0)
    b = batch(1, 3000, value_bytes=600)
    data = src.send(b)
    assert len(data) > HANDSHAKE_FRAME_BYTES
    rcv.receive_data(data)
    assert rcv.next_event() == b and rcv.next_event() is NEED_DATA
