"""CORS on the CouchDB endpoints: a browser page may call them (with its cookie or basic credentials)
only from an origin the server was started with (``--couch-cors-origin``, repeatable) or from the
endpoints' own origin; any other ``Origin`` gets no CORS headers, so the browser keeps the answer from
the page. A malformed origin is a ``ConfigError`` at start. Real docserver processes over HTTP; Node's
``fetch`` (PouchDB's tests) sends no CORS checks and is covered by ``test_couch_pouchdb.py``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from multisite.errors import ConfigError
from multisite.testing.docservers import DocCluster

from .test_couch_http import serve

APP = "https://app.example.com:8443"


def serve_cors(dc: DocCluster, origins: list[str]):
    node = dc.server("A", ["Profiles"], start=False)
    node.options["start"] = {"couch_listen": "127.0.0.1:0", "couch_cors_origins": origins}
    dc.start(node)
    info = json.loads((node.home / "run" / "docserver.json").read_text())
    node.url = f"http://127.0.0.1:{info['couch_port']}"
    return node


def with_origin(method: str, url: str, origin: str, **headers: str) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, headers={"Origin": origin, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def cors(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.lower().startswith("access-control-")}


def test_by_default_only_the_endpoints_own_origin_gets_cors_headers(dc):
    a = serve(dc)
    for method in ("GET", "OPTIONS"):
        st, h = with_origin(method, a.url + "/profiles", "https://evil.example",
                            **({"Access-Control-Request-Method": "PUT"} if method == "OPTIONS" else {}))
        assert st == 200 and cors(h) == {}, (method, h)
    st, h = with_origin("GET", a.url + "/_session", "null")  # a sandboxed page or a file: no origin to trust
    assert cors(h) == {}
    st, h = with_origin("GET", a.url + "/profiles", a.url)  # same origin: a page the endpoints serve
    assert st == 200 and h["Access-Control-Allow-Origin"] == a.url
    assert h["Access-Control-Allow-Credentials"] == "true" and "Origin" in h.get("Vary", "")


def test_a_configured_origin_is_allowed_with_credentials_and_no_other(dc):
    a = serve_cors(dc, [APP, "HTTP://Localhost:3000/"])
    st, h = with_origin("OPTIONS", a.url + "/profiles/doc1", APP, **{"Access-Control-Request-Method": "PUT"})
    assert st == 200 and h["Access-Control-Allow-Origin"] == APP and h["Access-Control-Allow-Credentials"] == "true"
    assert "PUT" in h["Access-Control-Allow-Methods"]
    st, h = with_origin("GET", a.url + "/profiles/nope", "http://localhost:3000")  # normalized: case, slash
    assert st == 404 and h["Access-Control-Allow-Origin"] == "http://localhost:3000"  # errors too
    for other in ("https://app.example.com", "http://app.example.com:8443", "https://evil.example"):
        assert cors(with_origin("GET", a.url + "/profiles", other)[1]) == {}, other


@pytest.mark.parametrize("origin,words", [
    ("*", "list each origin"),
    ("app.example.com", "scheme://host[:port]"),
    ("ftp://app.example.com", "http or https"),
    ("https://app.example.com/path", "no path"),
    ("https://user@app.example.com", "scheme://host[:port]"),
    ("https://app.example.com:99999", "port"),
    ("https://", "scheme://host[:port]"),
])
def test_a_malformed_origin_is_a_config_error_at_start(dc, origin, words):
    with pytest.raises(ConfigError, match="--couch-cors-origin") as e:
        serve_cors(dc, [origin])
    assert words in str(e.value), str(e.value)
