"""Free loopback ports for the servers that tests, benches and the demo start (etcd, PostgreSQL,
Mosquitto, instance servers on a port named in advance).

A port found free by binding port 0 comes from the kernel's ephemeral range, the range every outgoing
connection takes its local port from: between that probe and the server's own bind, any process's
``connect()`` may take it (a fresh-clone ``make test`` lost an etcd member's peer port so). A port
chosen below that range is never given to a connection; only another probe may pick the same one, at
random (``SystemRandom``: a test seeding ``random`` must not make two workers pick alike).
"""

from __future__ import annotations

import random
import socket

LOWEST = 10_000  # below it: ports services are often configured on
EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range, when /proc does not say
_pick = random.SystemRandom()
_given: set[int] = set()  # ports this process was given: two asks in a row (a server's two ports) never get one twice


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return EPHEMERAL


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` nothing is bound to now, below the ephemeral range when there is room."""
    lo = ephemeral_range()[0]
    for _ in range(100 if lo - LOWEST >= 1000 else 0):
        port = _pick.randrange(LOWEST, lo)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:  # no room below the range (or all taken): the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]
