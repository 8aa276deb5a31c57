"""The dashboard's loopback exemption must not extend to pages of other sites that a browser on this
machine runs: after DNS rebinding, such a page reaches 127.0.0.1 under its own host name (the Host
header), so without the token a request naming a non-local host is refused (403), as Jupyter does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

import multisite

from .test_dashboard import start_dashboard, stop


def _get(url: str, host: str | None = None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    return urllib.request.urlopen(req, timeout=10)


def test_a_loopback_request_naming_another_host_needs_the_token(tmp_path):
    a = multisite.create(tmp_path / "A", name="A")
    proc, url = start_dashboard(tmp_path, "--listen", "127.0.0.1:0", "--token", "s3cret", str(a))
    port = url.rsplit(":", 1)[1]
    try:
        for host in (None, f"localhost:{port}", f"127.0.0.1:{port}"):
            assert "instances" in json.loads(_get(f"{url}/api/state", host).read())
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(f"{url}/api/state", f"rebind.example:{port}")
        assert e.value.code == 403
        assert "instances" in json.loads(_get(f"{url}/api/state?token=s3cret", f"rebind.example:{port}").read())
    finally:
        stop(proc)
