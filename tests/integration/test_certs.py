"""The test PKI works for mutual TLS on the loopback: the right certificates pass, others are refused."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from multisite.testing.certs import make_test_pki

test_timeout_s = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def server_context(pki, cert="server_cert", key="server_key") -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca_cert"]))
    ctx.load_cert_chain(pki[cert], pki[key])
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(pki, cert="client_cert", key="client_key") -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki["ca_cert"]))
    if cert:
        ctx.load_cert_chain(pki[cert], pki[key])
    return ctx


def exchange(server_ctx, client_ctx, server_hostname="127.0.0.1"):
    """Connect over mutual TLS to an echo server and send one line; (reply or error, peers seen)."""
    peers: list[dict] = []

    async def echo(reader, writer):
        peers.append(writer.get_extra_info("peercert"))
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname=server_hostname
            )
            writer.write(b"hello\n")
            reply = await reader.readline()  # with TLS 1.3 a refusal shows here, after the handshake
            writer.close()
            return reply
        except (ssl.SSLError, ConnectionError) as e:
            return e
        finally:
            server.close()

    result = asyncio.run(asyncio.wait_for(main(), test_timeout_s))
    return result, peers


def common_name(peercert: dict) -> str:
    return dict(rdn[0] for rdn in peercert["subject"])["commonName"]


@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
def test_mutual_tls_with_the_good_certificates(pki, hostname):
    reply, peers = exchange(server_context(pki), client_context(pki), server_hostname=hostname)
    assert reply == b"hello\n"
    assert [common_name(p) for p in peers] == ["client"]


@pytest.mark.parametrize("cert", ["untrusted_cert", None])
def test_a_client_without_a_valid_certificate_is_refused(pki, cert):
    key = "untrusted_key" if cert else None
    reply, peers = exchange(server_context(pki), client_context(pki, cert, key))
    assert reply == b"" or isinstance(reply, (ssl.SSLError, ConnectionError)), reply
    assert peers == []  # the server's handler never ran


def test_a_server_with_an_untrusted_certificate_is_refused(pki):
    reply, peers = exchange(server_context(pki, "untrusted_cert", "untrusted_key"), client_context(pki))
    assert isinstance(reply, ssl.SSLCertVerificationError)
    assert peers == []


def test_roles_are_strict(pki):
    """A client certificate cannot serve: its extended key usage is client authentication only."""
    reply, peers = exchange(server_context(pki, "client_cert", "client_key"), client_context(pki))
    assert isinstance(reply, ssl.SSLCertVerificationError)


def test_files(pki):
    assert set(pki) == {
        "ca_cert", "ca_key", "server_cert", "server_key", "client_cert", "client_key",
        "untrusted_ca_cert", "untrusted_cert", "untrusted_key",
    }
    assert all(p.is_file() for p in pki.values())
    assert pki["server_key"].stat().st_mode & 0o077 == 0
