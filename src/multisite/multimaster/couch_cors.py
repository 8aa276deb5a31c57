"""CORS for the CouchDB endpoints: which browser origins may read their answers. Pure.

A browser sends a page's origin (``Origin: scheme://host[:port]``) with its cross-origin requests and
shows the page an answer only when it names that origin in ``Access-Control-Allow-Origin``. Since the
endpoints allow credentials (a cookie session, basic authentication), echoing every origin would let
any web page a user visits act as that user on the databases. So an origin is allowed only when the
server was started with it (``--couch-cors-origin``, repeatable; none by default) or when it is the
endpoints' own (a page they serve themselves: the ``Host`` the request was sent to, and its scheme).

Origins are compared in the form browsers send them (``serialize``): scheme and host in lower case,
the scheme's default port left out, no path. ``*`` is refused: with credentials allowed it would be
the hole this closes (list each origin instead).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError

OPTION = "--couch-cors-origin"
DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOW_METHODS = "GET, PUT, POST, HEAD, DELETE"
ALLOW_HEADERS = "accept, authorization, content-type, origin, referer"
MAX_AGE_S = 600  # how long a browser may keep a preflight's answer


def serialize(text: str) -> str:
    """``text`` as a browser's ``Origin`` header spells it; ConfigError naming what is wrong."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{OPTION} {text!r}: {why} (e.g. {OPTION} https://app.example.com:8443)")

    if text.strip() == "*":
        raise bad("'*' would let every web page act as the logged-in user: list each origin allowed")
    scheme, sep, rest = text.strip().partition("://")
    if not sep or not rest or "@" in rest:
        raise bad("an origin is scheme://host[:port]")
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise bad("the scheme is http or https")
    hostport, _, path = rest.partition("/")
    if path or any(c in hostport for c in "?#"):
        raise bad("an origin has no path, query or fragment")
    host, port = _split(hostport.lower())
    if not host or any(c.isspace() for c in host):
        raise bad("an origin is scheme://host[:port]")
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise bad("the port is a number from 1 to 65535")
    if port is None or int(port) == DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{int(port)}"


def _split(hostport: str) -> tuple[str, str | None]:
    if hostport.startswith("["):  # an IPv6 literal: [::1]:5984
        end = hostport.find("]")
        if end < 0:
            return "", None
        rest = hostport[end + 1:]
        return hostport[:end + 1], (rest[1:] if rest.startswith(":") else None if not rest else "")
    host, sep, port = hostport.partition(":")
    return host, (port if sep else None)


def parse_origins(texts: Iterable[str]) -> frozenset[str]:
    """The allowed origins given by ``--couch-cors-origin`` options (serialized); ConfigError if one is
    malformed."""
    return frozenset(serialize(t) for t in texts)


def allowed(origin: str | None, configured: frozenset[str], scheme: str, host: str) -> bool:
    """Whether a request's ``Origin`` may read the answer: one configured, or the endpoints' own
    (``scheme`` and ``Host`` of the request)."""
    if not origin or origin == "null":
        return False
    if origin in configured:
        return True
    try:
        return origin == serialize(f"{scheme}://{host}")
    except ConfigError:
        return False


def headers(origin: str, preflight: bool) -> dict[str, str]:
    """The CORS headers of an answer to an allowed ``origin`` (``preflight``: an ``OPTIONS``)."""
    out = {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}
    if preflight:
        out.update({"Access-Control-Allow-Methods": ALLOW_METHODS, "Access-Control-Allow-Headers": ALLOW_HEADERS,
                    "Access-Control-Max-Age": str(MAX_AGE_S)})
    return out


__all__ = ["OPTION", "allowed", "headers", "parse_origins", "serialize"]
