"""Who may do what on a grid port, sans-IO (issue 24: TLS and authentication on every grid wire).

Every grid process listens on one port: a catalog (containers register, ``grid status``, clients' route
requests) and a container (clients' commits and reads, replicas subscribing, status). With TLS
(``--tls-cert/--tls-key/--tls-ca``), every connection is TLS with the grid's CA, and a peer is one of:

- a **member** of the grid: its certificate, verified against the CA, names this grid as its subject's
  organizational unit (OU) and the member as its common name (CN). Only a member may ``register``
  (with the catalog, under the name its certificate gives) or ``subscribe`` (as a replica, under that
  name); a certificate of another grid or of another CA is refused before anything else;
- a **client**: a user of the process's users file (``instance.users``, as on the instance server),
  by a certificate whose CN is the user (and names no grid), or by the user and password its first
  message carries (``Open``, ``StatusRequest``, ``RouteRequest``). Its role decides (``OPS``):
  read-only reads, asks status and routes; read-write also commits.

Without TLS, on a loopback ``--listen`` and with no users, the port stays open as before; a non-loopback
``--listen`` without TLS, or without users, is refused at start unless ``--insecure`` (``check_listen``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..protocol.auth import is_loopback

MEMBER = "member"
#: what a grid request is, for ``protocol.auth``'s rights table (a member may do all of them)
OPS = {"register": MEMBER, "subscribe": MEMBER, "status": "info", "routes": "info", "read": "get", "commit": "commit",
       "operate": "grid.operate"}  # (an op protocol/auth.py does not list needs admin: drain, promote)


@dataclass(frozen=True)
class Peer:
    """What a connection's verified certificate says: its CN and OU (None without a certificate)."""

    name: str | None = None
    grid: str | None = None

    def member_of(self, grid: str) -> bool:
        return self.name is not None and bool(grid) and self.grid == grid


def peer_of(cert: dict[str, Any] | None) -> Peer:
    """``ssl``'s ``getpeercert()`` dictionary as a ``Peer``."""
    found: dict[str, str] = {}
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            found.setdefault(key, value)
    return Peer(found.get("commonName"), found.get("organizationalUnitName"))


def member_refusal(peer: Peer, grid: str, as_name: str, what: str) -> str | None:
    """Why ``peer`` may not ``what`` (register, subscribe) as ``as_name`` in ``grid``; None if it may."""
    if peer.name is None:
        return f"{what} needs a grid member's certificate (CN = its name, OU = {grid!r}), signed by the grid's CA"
    if peer.grid != grid:
        return (f"the certificate of {peer.name!r} names grid {peer.grid!r}, not {grid!r}" if peer.grid
                else f"the certificate of {peer.name!r} names no grid (a client's): only grid members may {what}")
    if as_name != peer.name:
        return f"the certificate names member {peer.name!r}; it may not {what} as {as_name!r}"
    return None


def own_certificate_refusal(peer: Peer, grid: str) -> str | None:
    """At a member's start: its own certificate must name its grid (or it would be refused by every peer)."""
    if grid and peer.grid != grid:
        return (f"this process's certificate (CN {peer.name!r}) names grid {peer.grid!r}, not {grid!r}: a grid "
                f"member's certificate has OU = the grid's name")
    return None


def check_listen(host: str, tls: bool, users: int, insecure: bool) -> None:
    """A grid port reachable from other hosts takes TLS and authenticates its clients, unless ``insecure``."""
    if insecure or is_loopback(host):
        return
    if not tls:
        raise ConfigError(f"--listen {host or '*'} is reachable from other hosts: give --tls-cert, --tls-key and "
                          f"--tls-ca (the grid's CA), listen on 127.0.0.1, or pass --insecure to let anyone who "
                          f"reaches the port send it shard traffic")
    if not users:
        raise ConfigError(f"--listen {host or '*'} is reachable from other hosts and has no users to authenticate "
                          f"clients: add one (multisite grid user add DIR NAME --role ROLE), or pass --insecure")
