"""multisite: database replication across sites over one journal.

The public API is re-exported here; see README.md for a tour.
"""

from .engine import Database, Durability, RecoveryReport, RollbackReport, Transaction, create, open
from .errors import *  # noqa: F401,F403 - the exception tree is public
from .errors import MultisiteError
from .journal.lostfile import LostFile, list_lost_files
from . import grid  # noqa: F401 - multisite.grid.connect after a bare ``import multisite``

__all__ = ["Database", "Durability", "RecoveryReport", "RollbackReport", "Transaction", "create", "open",
           "MultisiteError", "LostFile", "list_lost_files"]
__version__ = "0.1.0"


def connect(address: str, timeout: float = 30.0, **auth):
    """Connect to an instance server at ``HOST:PORT`` (same API as an open Database), or to whichever of
    ``"H1:P1,H2:P2,..."`` is the primary, following it across failovers. ``auth``: ``user``,
    ``password``, ``tls_ca``, ``tls_cert``, ``tls_key``, ``failover_timeout_s`` (see
    ``server.client.connect``)."""
    from .server.client import connect as _connect

    return _connect(address, timeout, **auth)


__all__.append("connect")


async def aconnect(address: str, timeout: float = 30.0, **auth):
    """``await multisite.aconnect("HOST:PORT")``: the client for asyncio applications (``server.aclient``);
    with ``"H1:P1,H2:P2,..."`` the primary among them, followed across failovers (``server.afailover``);
    ``auth`` as ``connect``'s."""
    from .server.afailover import connect as _connect

    return await _connect(address, timeout, **auth)


__all__.append("aconnect")


def serve(path, listen: str | None = None, **kwargs):
    """Serve the instance at ``path`` from this process: ``srv.db`` (the embedded Database the server
    owns), ``srv.address``, ``srv.close()``; the replication components are started with the CLI
    against it as with ``multisite server start`` (``server.serve``)."""
    from .server.serve import serve as _serve

    return _serve(path, listen, **kwargs)


__all__.append("serve")
