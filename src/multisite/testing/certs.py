"""A throwaway PKI for TLS tests: a CA, a server and a client certificate, and an untrusted pair.

    pki = make_test_pki(tmp_path / "pki")
    server: load_cert_chain(pki["server_cert"], pki["server_key"]), trust pki["ca_cert"]
    client: load_cert_chain(pki["client_cert"], pki["client_key"]), trust pki["ca_cert"]

The server and client certificates name ``localhost`` and ``127.0.0.1`` / ``::1`` (DNS and IP
subject alternative names), so hostname checking works on the loopback. Roles are strict, as a real
deployment's would be: the server certificate is for server authentication only, the client
certificate for client authentication only. ``untrusted_cert`` is signed by a second CA that no one
trusts and allows both roles, for "a peer without a valid certificate is refused" tests.

Keys are P-256 (fast to make, one test run creates several); certificates carry the extensions
that strict verifiers (``VERIFY_X509_STRICT``, Python 3.13's default) require: basic constraints,
key usage, subject and authority key identifiers.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates are valid, from a day before they are made (clock skew) onward.
valid_days = 30
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


def make_test_pki(directory: str | Path) -> dict[str, Path]:
    """Write a CA, server, client and untrusted certificates (PEM) into ``directory``; their paths.

    Keys of the result: ``ca_cert``, ``ca_key``, ``server_cert``, ``server_key``, ``client_cert``,
    ``client_key``, ``untrusted_ca_cert``, ``untrusted_cert``, ``untrusted_key``.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca("multisite test CA")
    rogue_key, rogue_ca = _make_ca("multisite untrusted CA")
    server_key, server_cert = _make_leaf("server", ca_key, ca_cert, [ExtendedKeyUsageOID.SERVER_AUTH])
    client_key, client_cert = _make_leaf("client", ca_key, ca_cert, [ExtendedKeyUsageOID.CLIENT_AUTH])
    untrusted_key, untrusted_cert = _make_leaf(
        "untrusted", rogue_key, rogue_ca, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    return {
        "ca_cert": _write_cert(out / "ca.pem", ca_cert),
        "ca_key": _write_key(out / "ca.key", ca_key),
        "server_cert": _write_cert(out / "server.pem", server_cert),
        "server_key": _write_key(out / "server.key", server_key),
        "client_cert": _write_cert(out / "client.pem", client_cert),
        "client_key": _write_key(out / "client.key", client_key),
        "untrusted_ca_cert": _write_cert(out / "untrusted-ca.pem", rogue_ca),
        "untrusted_cert": _write_cert(out / "untrusted.pem", untrusted_cert),
        "untrusted_key": _write_key(out / "untrusted.key", untrusted_key),
    }


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(days=1), now + datetime.timedelta(days=valid_days)


def _make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    common_name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    usages: list[x509.ObjectIdentifier],
    loopback_names: bool = True,
    unit: str | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity()
    alt_names = [x509.DNSName(n) for n in LOOPBACK_DNS] + [x509.IPAddress(ipaddress.ip_address(a)) for a in LOOPBACK_IPS]
    if not loopback_names:
        alt_names = [x509.DNSName(f"{common_name}.invalid")]  # a name no host has
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
                                + ([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit)] if unit else [])))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(pem)
    return path


def make_named_cert(pki: dict[str, Path], name: str, loopback_names: bool = True) -> dict[str, Path]:
    """A certificate for server ``name`` (its common name), signed by ``pki``'s CA, for both roles (a
    document server both listens and initiates): ``{"cert", "key"}`` written beside the CA.
    ``loopback_names=False``: it names no host of this machine (for host-name checking tests)."""
    out = Path(pki["ca_cert"]).parent
    ca_cert = x509.load_pem_x509_certificate(Path(pki["ca_cert"]).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(pki["ca_key"]).read_bytes(), password=None)
    key, cert = _make_leaf(name, ca_key, ca_cert, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                           loopback_names)
    return {"cert": _write_cert(out / f"{name}.pem", cert), "key": _write_key(out / f"{name}.key", key)}


def make_grid_cert(pki: dict[str, Path], name: str, grid: str | None) -> dict[str, Path]:
    """A grid member's certificate (a catalog or container named ``name`` of grid ``grid``: its subject's
    organizational unit), or with ``grid`` None a grid client's (a user ``name``), signed by ``pki``'s CA
    for both roles: ``{"cert", "key"}`` written beside the CA (``grid-<grid>-<name>.pem``)."""
    out = Path(pki["ca_cert"]).parent
    ca_cert = x509.load_pem_x509_certificate(Path(pki["ca_cert"]).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(pki["ca_key"]).read_bytes(), password=None)
    key, cert = _make_leaf(name, ca_key, ca_cert, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                           unit=grid)
    stem = f"grid-{grid or 'user'}-{name}"
    return {"cert": _write_cert(out / f"{stem}.pem", cert), "key": _write_key(out / f"{stem}.key", key),
            "ca": Path(pki["ca_cert"])}

