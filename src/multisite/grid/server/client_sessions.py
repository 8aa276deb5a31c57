"""How a container serves one grid client's connection (``grid.server.client`` on the other end).

After the ``Open`` frame (grid, user, password), each ``Commit`` or ``Read`` goes to the primary of its
partition hosted here, as a ``Request`` on that primary's pipeline; its answer (``Done`` / ``Failed``) is
written when the request completes, so one connection carries many requests in flight. A partition
this container holds no primary of is refused with ``NOT_PRIMARY`` and the epoch the client routes by.
"""

from __future__ import annotations

import asyncio

from ...errors import MultisiteError
from ...keys import encode_key
from ..routing import check_in_partition
from ..shard_wire import Commit, DataWire, Done, Failed, FailCode, Open, Opened, Read, encode
from .shard import Request, ShardRefusal, read_into


async def serve_client(host, hello: Open, reader, writer, wire: DataWire) -> None:
    """Serve one grid client's connection on the container ``host``: check its grid and user, then hand
    each commit or read to the primary of its partition and answer each as it completes (pipelined:
    answers may come out of order)."""
    if hello.grid and hello.grid != host.grid:
        writer.write(encode(Failed(0, FailCode.WRONG_GRID, f"this container is of grid {host.grid!r}, the client "
                                                           f"asked for grid {hello.grid!r}")))
        return
    access = await host.security.client(writer, host.security.peer(writer), hello.user, hello.password)
    why = access if isinstance(access, tuple) else access.refusal("read")  # at least a reader
    if why is not None:
        writer.write(encode(Failed(0, why[0], why[1])))
        return
    writer.write(encode(Opened(host.name)))
    loop = asyncio.get_running_loop()
    parts = host.partitions
    answer = answerer(writer)
    while True:
        msg = await read_into(reader, wire)
        if msg is None:
            return
        if isinstance(msg, Commit):
            kind = "commit"
        elif isinstance(msg, Read):
            kind = "read"
        else:
            writer.write(encode(Failed(0, FailCode.BAD_REQUEST, f"{type(msg).__name__} on a client connection")))
            return
        why = access.refusal(kind)
        if why is not None:  # a read-only user's put; a user removed meanwhile (then the connection ends)
            writer.write(encode(Failed(msg.rid, why[0], why[1])))
            if access.gate is not None and access.gate.must_close:
                return
            continue
        fut = loop.create_future()
        fut.add_done_callback(lambda f, rid=msg.rid: answer(rid, f))
        _submit(host, msg, kind, fut, parts)
        if writer.transport.get_write_buffer_size() > 1 << 20:
            await writer.drain()


def _submit(host, msg: Commit | Read, kind: str, fut: asyncio.Future, parts: int) -> None:
    """Hand a client's commit or read to the primary of its partition here, or fail ``fut`` with why not."""
    sh = host.shards.get(msg.partition)
    if sh is not None and sh.role == "primary" and sh.primary is None:
        # taking the primary role at sh.view.epoch (Shard.take is between its awaits): the route is
        # right, the client retries it. NOT_PRIMARY with that epoch would mark the route stale until
        # a newer epoch, which never comes while this container stays primary.
        fut.set_exception(ShardRefusal(FailCode.UNAVAILABLE, f"{host.name} is taking over as primary of "
                                       f"partition {msg.partition}; retry", {"epoch": sh.view.epoch}))
        return
    if sh is None or sh.primary is None or sh.primary.stopping:
        fut.set_exception(ShardRefusal(FailCode.NOT_PRIMARY, f"{host.name} holds no primary of partition "
                                       f"{msg.partition}", {"epoch": sh.view.epoch if sh else 0}))
        return
    try:
        if kind == "commit":
            ops = [(op, region, tuple(key), vb) for op, region, key, vb in msg.ops]
            for _, _, key, _ in ops:
                check_in_partition(key, msg.partition, parts)
            sh.primary.submit(Request("commit", fut, ops=ops))
        else:
            check_in_partition(tuple(msg.key), msg.partition, parts)
            sh.primary.submit(Request("read", fut, region=msg.region, key=encode_key(tuple(msg.key))))
    except MultisiteError as e:
        fut.set_exception(ShardRefusal(e.code, str(e), {}))


def answerer(writer: asyncio.StreamWriter):
    """How a client connection answers a request: ``answer(rid, fut)``, called when ``fut`` is done."""
    def answer(rid: int, fut: asyncio.Future) -> None:
        if fut.cancelled():
            return
        e = fut.exception()
        if e is None:
            res = fut.result()
            msg = Done(rid, res) if isinstance(res, int) else Done(rid, 0, res)
        elif isinstance(e, ShardRefusal):
            msg = Failed(rid, e.code, e.message, e.detail)
        else:
            msg = Failed(rid, FailCode.TRANSACTION, str(e))
        if not writer.is_closing():
            writer.write(encode(msg))
    return answer
