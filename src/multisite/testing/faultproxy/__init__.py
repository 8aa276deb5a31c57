"""A TCP fault proxy for network fault tests: delay, stall, drop, bandwidth caps, cuts, refusals.

``tc netem`` is not available on our machines and we run no toxiproxy server (docs/decisions.md),
so tests put this proxy between a client and a server and change its faults while traffic flows.

In process (asyncio)::

    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", server_port) as proxy:
        ... connect to proxy.port ...; proxy.stall(); proxy.resume(); proxy.cut()

In a child process, from plain synchronous tests::

    with ProxyProcess("127.0.0.1", server_port) as proxy:
        ... connect to proxy.address ...; proxy.delay(0.05, direction="upstream")

From a shell: ``python -m multisite.testing.faultproxy --target HOST:PORT`` (see ``control.py``).
"""

from .lane import BOTH, DIRECTIONS, DOWNSTREAM, UPSTREAM
from .process import ProxyCommandError, ProxyProcess
from .proxy import FaultProxy

__all__ = ["BOTH", "DIRECTIONS", "DOWNSTREAM", "UPSTREAM", "FaultProxy", "ProxyCommandError", "ProxyProcess"]
