"""The control channel between the CLI and a running server: an instance server, and with ``request``'s
``kind`` the other processes that answer on one (a document server; the grid's catalog and containers).

JSON lines over a Unix socket in the abstract namespace (named after the instance directory, so
there is no path-length limit and nothing to clean up after a crash). One request, one reply::

    {"op": "source.start", "args": {...}}   ->   {"ok": true, "result": {...}}
                                            or   {"ok": false, "code": "...", "error": "..."}
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable

from .. import errors
from ..errors import MultisiteError, ServerError

CONTROL_TIMEOUT_S = 60.0


def control_address(root: Path) -> str:
    digest = hashlib.sha1(str(Path(root).absolute()).encode()).hexdigest()[:24]
    return f"\0multisite-{digest}"


def call(root: Path, op: str, timeout: float = CONTROL_TIMEOUT_S, **args: Any) -> Any:
    """Send one request to the instance server of ``root``; raise the server's error as a MultisiteError."""
    return request(root, op, args, timeout=timeout)


def request(root: Path, op: str, args: dict[str, Any], *, timeout: float = CONTROL_TIMEOUT_S,
            kind: str = "instance server", start: str = "multisite server start {root}") -> Any:
    """One request to the ``kind`` of server running for ``root`` (its errors name it so: "the document
    server of …"; ``start`` is the command that starts one, told when none runs)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(control_address(root))
    except (ConnectionRefusedError, FileNotFoundError):
        s.close()
        raise ServerError(f"no {kind} is running for {root}; start one with `{start.format(root=root)}`") from None
    except OSError as e:
        s.close()
        raise ServerError(f"cannot reach the {kind} of {root}: {e.strerror or e}") from None
    try:
        s.sendall((json.dumps({"op": op, "args": args}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ServerError(f"the {kind} of {root} closed the control connection during {op!r} (did it "
                                  f"exit? its log says why)")
            buf += chunk
    except socket.timeout:
        raise ServerError(f"the {kind} of {root} did not answer {op!r} within {timeout:.0f} s") from None
    except OSError as e:  # e.g. reset by a server that exited while starting or stopping
        raise ServerError(f"the control connection to the {kind} of {root} failed during {op!r}: "
                          f"{e.strerror or e}") from None
    finally:
        s.close()
    reply = json.loads(buf)
    if reply.get("ok"):
        return reply.get("result")
    cls = _error_class(reply.get("code", ""))
    err = cls.__new__(cls)
    MultisiteError.__init__(err, reply.get("error", "unknown error"))
    raise err


async def answer_simple(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: Callable[[], dict],
                        stop: asyncio.Event) -> None:
    """One request on the control socket of a process that only pings, reports and stops (the grid's
    catalog and containers): ``ping``, ``status`` (``status()``) and ``shutdown`` (sets ``stop``)."""
    try:
        op = json.loads(await reader.readline())["op"]
        if op == "ping":
            reply = {"ok": True, "result": {"pid": os.getpid()}}
        elif op == "status":
            reply = {"ok": True, "result": status()}
        elif op == "shutdown":
            stop.set()
            reply = {"ok": True, "result": {"pid": os.getpid()}}
        else:
            reply = {"ok": False, "code": errors.ConfigError.code, "error": f"unknown control operation {op!r}"}
    except (ValueError, KeyError, TypeError) as e:
        reply = {"ok": False, "code": errors.ConfigError.code, "error": f"bad control request: {e}"}
    writer.write((json.dumps(reply) + "\n").encode())
    try:
        await writer.drain()
        writer.close()
    except OSError:
        pass


def _error_class(code: str) -> type[MultisiteError]:
    for obj in vars(errors).values():
        if isinstance(obj, type) and issubclass(obj, MultisiteError) and obj.code == code:
            return obj
    return ServerError


def is_running(root: Path) -> bool:
    try:
        call(root, "ping", timeout=5)
        return True
    except ServerError:
        return False
