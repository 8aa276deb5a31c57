"""The proxy as a process: a CLI that runs a ``FaultProxy`` and obeys JSON-line commands.

    python -m multisite.testing.faultproxy --target HOST:PORT [--listen 127.0.0.1:0]
        [--control 127.0.0.1:0] [--seed N]

Once listening it prints one JSON line on stdout and nothing more there (logs go to stderr)::

    {"listen": "127.0.0.1:41001", "listen_port": 41001, "control": "127.0.0.1:41002",
     "control_port": 41002, "target": "127.0.0.1:7000", "pid": 4242}

The control port takes one JSON object per line, ``{"op": NAME, ...keyword arguments}``, and
answers each with one line: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``.
The ops are the ``FaultProxy`` methods in ``OPS``, with the same keyword arguments, e.g.
``{"op": "delay", "delay_s": 0.2, "direction": "upstream"}``, ``{"op": "stats"}``; ``{"op": "stop"}``
answers and then ends the process. SIGTERM and SIGINT end it too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from .proxy import FaultProxy

#: The FaultProxy methods the control port may call.
OPS = frozenset(
    {"delay", "stall", "resume", "drop", "bandwidth", "cut", "refuse", "set_target", "heal", "stats"}
)
#: Longest command line accepted on the control port.
control_line_bytes = 64 * 1024


def parse_hostport(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) as ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def dispatch(proxy: FaultProxy, request: dict) -> object:
    """Run one control request on ``proxy``; the method's result (None for most)."""
    args = dict(request)
    op = args.pop("op", None)
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(OPS))}, stop")
    return getattr(proxy, op)(**args)


class ControlServer:
    """The control port of one proxy; ``{"op": "stop"}`` sets ``stopping``."""

    def __init__(self, proxy: FaultProxy, stopping: asyncio.Event) -> None:
        self.proxy = proxy
        self.stopping = stopping
        self.server: asyncio.Server | None = None
        self._clients: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the port (ephemeral if 0 was asked)."""
        self.server = await asyncio.start_server(self._on_client, host, port, limit=control_line_bytes)
        return self.server.sockets[0].getsockname()[1]

    async def close(self, timeout_s: float = 2.0) -> None:
        """Stop listening and close every control connection once its last answer is sent."""
        self.server.close()
        for writer in self._clients.values():
            writer.close()  # the reader sees end of file: each handler ends on its own
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=timeout_s)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._clients[task] = writer
        try:
            await self._converse(reader, writer)
        finally:
            del self._clients[task]

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxy, stopping = self.proxy, self.stopping
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    if request.get("op") == "stop":
                        stopping.set()
                        reply = {"ok": True, "result": None}
                    else:
                        reply = {"ok": True, "result": dispatch(proxy, request)}
                except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, ValueError):  # peer gone, or a line over the limit
            pass
        finally:
            writer.close()


async def run(listen: tuple[str, int], target: tuple[str, int], control: tuple[str, int], seed: int | None) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    proxy = await FaultProxy(*listen, *target, seed=seed).start()
    control_server = ControlServer(proxy, stopping)
    control_port = await control_server.start(*control)
    print(
        json.dumps(
            {
                "listen": f"{proxy.listen_host}:{proxy.port}",
                "listen_port": proxy.port,
                "control": f"{control[0]}:{control_port}",
                "control_port": control_port,
                "target": f"{target[0]}:{target[1]}",
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    await stopping.wait()
    await control_server.close()
    await proxy.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m multisite.testing.faultproxy",
        description="TCP proxy with network faults controlled over a JSON-line control port.",
        epilog="example: python -m multisite.testing.faultproxy --target 127.0.0.1:7000",
    )
    ap.add_argument("--target", type=parse_hostport, required=True, help="HOST:PORT to forward to")
    ap.add_argument("--listen", type=parse_hostport, default=("127.0.0.1", 0), help="HOST:PORT (0 = ephemeral)")
    ap.add_argument("--control", type=parse_hostport, default=("127.0.0.1", 0), help="HOST:PORT of the control port")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random drops")
    a = ap.parse_args(argv)
    try:
        asyncio.run(run(a.listen, a.target, a.control, a.seed))
    except OSError as e:
        print(f"faultproxy: {e}", file=sys.stderr)
        raise SystemExit(1) from None
