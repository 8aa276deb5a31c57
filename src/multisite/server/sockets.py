"""The server's event loops (the client listener's, the process's main loop) and the client sockets'
keepalive: what ``clients.py`` and ``instance.py`` set up before serving.

Here rather than in the listener because the instance server's start checks (``server start
--keepalive``, ``multisite.serve``) need ``check_keepalive`` without the listener.
"""

from __future__ import annotations

import asyncio
import os
import socket

from ..errors import ConfigError

KEEPALIVE_S = 30  # a client silent this long is probed (TCP keepalive); see keepalive()
KEEPALIVE_PROBES = 3


def _loop(variable: str, default: str) -> asyncio.AbstractEventLoop:
    """A new uvloop loop when the environment ``variable`` (else ``default``) says ``uvloop`` and it is
    installed; asyncio's own otherwise."""
    if os.environ.get(variable, default) == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def new_loop() -> asyncio.AbstractEventLoop:
    """The listener's event loop: uvloop when installed (docs/decisions.md, issue 14: measured against
    asyncio's own), unless ``MULTISITE_CLIENT_LOOP=asyncio`` asks for the standard one."""
    return _loop("MULTISITE_CLIENT_LOOP", "uvloop")


def server_loop() -> asyncio.AbstractEventLoop:
    """The instance server process's main loop (control socket, Source and Receiver Servers): asyncio's
    own, or uvloop with ``MULTISITE_SERVER_LOOP=uvloop``. uvloop makes each event cheaper (asyncio runs
    ``_run_once``, the selector and a Handle per callback in Python), but a Source Server on it wakes
    sooner and sends smaller batches, and a secondary pays per batch: with both sessions at the bench's
    priority, streaming 3,000 tx/s, it cost the secondary as much or more per transaction (issue 27,
    docs/decisions.md). Kept as the measured alternative."""
    return _loop("MULTISITE_SERVER_LOOP", "asyncio")


def listener_cpu() -> int | None:
    """The CPU the listener's loop and sync threads run on (``MULTISITE_LISTENER_CPU``: ``auto``, the
    default, is one of the CPUs this process may use, picked by its process id, so that several servers
    on one host do not all queue their listeners on one CPU; a number names one; ``none`` leaves them to
    the scheduler, as does a process allowed one CPU). Every commit hands work between those two threads
    (the batch to harden, its end back to the loop), and between CPUs each hand-off is a cross-CPU
    wake-up, an inter-processor interrupt (a VM exit on a virtual machine): on the same CPU the two
    threads committed 1.9x (2 connections) and 2.5x (16) the rate, with a quarter less CPU per commit
    (issue 27, docs/decisions.md). Both threads are GIL-bound, so they never ran in parallel anyway."""
    allowed = sorted(os.sched_getaffinity(0))
    want = os.environ.get("MULTISITE_LISTENER_CPU", "auto").strip().lower()
    if want == "none" or len(allowed) < 2:
        return None
    if want == "auto":
        return allowed[os.getpid() % len(allowed)]
    try:
        cpu = int(want)
    except ValueError:
        cpu = -1
    if cpu not in allowed:
        raise ConfigError(f"MULTISITE_LISTENER_CPU={want!r}: not one of this process's CPUs "
                          f"({', '.join(map(str, allowed))}), nor auto or none")
    return cpu


def pin_thread(cpus: set[int] | None) -> None:
    """Run the calling thread on ``cpus`` (None: leave it); threads it starts inherit it."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)  # 0: the calling thread (Linux)
        except OSError:  # not allowed (a cgroup changed under us): the scheduler decides, as before
            pass


def unpin_thread() -> None:
    """Give the calling thread (started by a pinned one, whose CPU it inherits) the CPUs the process has
    now: the main thread's, which an operator's ``taskset -p`` changes at runtime; a set remembered
    from earlier would undo that."""
    pin_thread(os.sched_getaffinity(os.getpid()))


def check_keepalive(seconds: object) -> int:
    """``--keepalive``: whole seconds from 1 to 32767 (Linux's TCP_KEEPIDLE range); ConfigError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 32767:
        raise ConfigError(f"--keepalive takes whole seconds from 1 to 32767, got {seconds!r}")
    return seconds


def keepalive(conn: socket.socket, seconds: int) -> None:
    """Drop a client whose host or network vanished without closing the connection: after ``seconds``
    of silence the kernel probes it, ``KEEPALIVE_PROBES`` times ``seconds / 3`` apart, and a client
    that answers none is reset, so it does not hold one of the ``MAX_CONNECTIONS`` slots forever. A
    reply it never acknowledges fails as late (TCP_USER_TIMEOUT). An idle client that is alive
    answers the probes itself (its kernel does) and stays connected."""
    interval = max(1, seconds // 3)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, (seconds + KEEPALIVE_PROBES * interval) * 1000)
