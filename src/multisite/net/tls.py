"""TLS contexts for replication links: mutual certificate authentication when configured.

Both sides present a certificate signed by a CA the other trusts (``--tls-ca``); a peer without a
valid certificate fails the handshake, which the server logs and the peer sees as a refusal.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class TLSConfig:
    cert: str
    key: str
    ca: str

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, ca: str | None) -> "TLSConfig | None":
        given = [x for x in (cert, key, ca) if x]
        if not given:
            return None
        if len(given) != 3:
            raise ConfigError("TLS needs all three of --tls-cert, --tls-key and --tls-ca")
        return cls(cert, key, ca)  # type: ignore[arg-type]

    def _load(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        try:
            ctx.load_cert_chain(self.cert, self.key)
            ctx.load_verify_locations(self.ca)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load TLS files (cert {self.cert}, key {self.key}, ca {self.ca}): {e}") from e
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def server_context(self, client_cert_required: bool = True) -> ssl.SSLContext:
        """``client_cert_required=False`` (the client port): a client may come without a certificate
        and authenticate by password; one it presents is still verified against the CA."""
        ctx = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        if not client_cert_required:
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False  # peers are named by instance, authenticated by the shared CA
        return self._load(ctx)

    def to_dict(self) -> dict:
        return {"cert": self.cert, "key": self.key, "ca": self.ca}


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise ConfigError(f"port {port} of {text!r} is not in 0..65535")
    return host.strip("[]"), int(port)
