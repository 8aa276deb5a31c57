"""The fault proxy as a child process (``ProxyProcess``), driven from a synchronous test."""

from __future__ import annotations

import socket
import threading

import pytest

from multisite.testing.faultproxy import ProxyCommandError, ProxyProcess


@pytest.fixture
def echo_port():
    """A threaded echo server on an ephemeral port of 127.0.0.1."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve_one(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept_forever() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def client(proxy: ProxyProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=2.0)


def test_process_forwards_obeys_faults_and_reports(echo_port):
    with ProxyProcess("127.0.0.1", echo_port, seed=7) as proxy:
        assert proxy.address == f"127.0.0.1:{proxy.port}" and proxy.pid > 0
        s = client(proxy)
        s.sendall(b"hello")
        assert s.recv(16) == b"hello"

        proxy.stall()
        s.sendall(b"held")
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(16)
        proxy.resume()
        s.settimeout(2.0)
        assert s.recv(16) == b"held"

        assert proxy.cut() == 1
        with pytest.raises(ConnectionResetError):
            s.recv(16)
        s.close()

        proxy.refuse(True)
        with pytest.raises(ConnectionRefusedError):
            client(proxy)
        proxy.refuse(False)
        s = client(proxy)
        stats = proxy.wait_for_accepted(2, timeout_s=2.0)
        assert stats["connections_cut"] == 1
        assert stats["upstream"]["bytes_forwarded"] == stats["downstream"]["bytes_forwarded"] == 9
        s.close()

        with pytest.raises(ProxyCommandError, match="delay_s must be >= 0"):
            proxy.delay(-1)


def test_process_stops_and_kills(echo_port):
    proxy = ProxyProcess("127.0.0.1", echo_port).start()
    proc = proxy.proc
    proxy.stop()
    assert proc.returncode == 0

    proxy = ProxyProcess("127.0.0.1", echo_port).start()
    s = client(proxy)
    proxy.kill()  # the kernel closes the proxy's sockets: FIN, or RST if it had not accepted yet
    try:
        assert s.recv(16) == b""
    except ConnectionResetError:
        pass
    s.close()
    with pytest.raises(ProxyCommandError):
        proxy.stats()
    proxy.stop()
