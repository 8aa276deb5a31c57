"""TLS on replication links: mutual certificate authentication works, and a peer without a valid
certificate is refused, with the refusal in the logs and in the status of the side that refused."""

from __future__ import annotations

import socket
import ssl

import pytest

from multisite.testing.certs import make_test_pki
from multisite.testing.checks import assert_contiguous_journal, assert_same_data, log_text, wait_until


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return {k: str(v) for k, v in make_test_pki(tmp_path_factory.mktemp("pki")).items()}


def tls(pki, who: str, ca: str = "ca_cert") -> dict:
    return {"cert": pki[f"{who}_cert"], "key": pki[f"{who}_key"], "ca": pki[ca]}


def write(node, n: int, start: int = 0) -> int:
    with node.client() as db:
        db.create_region("acct")
        for i in range(start, start + n):
            last = db.set("acct", (i,), {"i": i})
    return last


def test_mutual_tls_replicates(cluster, pki):
    a, b = cluster.instance("A"), cluster.instance("B")
    rs = b.call("receiver.start", listen="127.0.0.1:0", tls=tls(pki, "server"))
    b.receiver_port = int(rs["listen"].rsplit(":", 1)[1])
    assert rs["tls"] is True
    st = a.start_source(b, tls=tls(pki, "client"))
    assert st["tls"] is True
    last = write(a, 200)
    cluster.wait_caught_up(a, b)
    assert a.call("source.status", secondary="B")["state"] == "streaming"
    assert "TLS" in log_text(a.root, "source-B.log") and "(TLS)" in log_text(b.root, "receiver.log")
    cluster.stop_all()
    assert_same_data(a.root, b.root)
    assert_contiguous_journal(b.root, last)


def tls_receiver(cluster, pki):
    a, b = cluster.instance("A"), cluster.instance("B")
    rs = b.call("receiver.start", listen="127.0.0.1:0", tls=tls(pki, "server"))
    b.receiver_port = int(rs["listen"].rsplit(":", 1)[1])
    write(a, 20)
    return a, b


def assert_receiver_refused_tls(b) -> None:
    rs = wait_until(lambda: (r := b.call("receiver.status"))["refusals"] >= 1 and r, what="a TLS refusal")
    assert "TLS" in (rs["last_error"] or "")
    log = wait_until(lambda: log_text(b.root, "receiver.log"), what="receiver log")
    assert any("TLS" in line and "refus" in line for line in log.splitlines()), log
    assert b.seqno() == 0 and rs["state"] == "listening"


@pytest.mark.parametrize("who", ["untrusted", None], ids=["certificate-from-an-unknown-ca", "no-tls-at-all"])
def test_a_source_without_a_valid_certificate_is_refused_and_logged(cluster, pki, who):
    a, b = tls_receiver(cluster, pki)
    a.start_source(b, **({"tls": tls(pki, who)} if who else {}))
    assert_receiver_refused_tls(b)
    st = wait_until(lambda: (s := a.call("source.status", secondary="B"))["connects"] >= 1 and s["last_error"]
                    and s, what="the source's error")
    assert st["state"] != "streaming" and st["sent_records"] == 0
    assert "lost" in log_text(a.root, "source-B.log")


def test_a_client_presenting_no_certificate_is_refused_and_logged(cluster, pki):
    a, b = tls_receiver(cluster, pki)
    ctx = ssl.create_default_context(cafile=pki["ca_cert"])
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", b.receiver_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(raw) as s:  # TLS 1.3: the refusal arrives on the first read
                s.sendall(b"\0" * 16)
                if not s.recv(1):
                    raise ConnectionResetError("closed without a word")
    assert_receiver_refused_tls(b)


def test_a_source_that_does_not_trust_the_receiver_refuses_it(cluster, pki):
    a, b = tls_receiver(cluster, pki)
    a.start_source(b, tls=tls(pki, "client", ca="untrusted_ca_cert"))
    st = wait_until(lambda: (s := a.call("source.status", secondary="B"))["last_error"] and s,
                    what="the source's error")
    assert "CERTIFICATE_VERIFY_FAILED" in st["last_error"] or "certificate verify failed" in st["last_error"]
    assert "certificate verify failed" in log_text(a.root, "source-B.log").lower()
    assert b.seqno() == 0
