"""``couch_cors``: origins spelled as browsers send them, and which a request's ``Origin`` may be."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError
from multisite.multimaster import couch_cors


@pytest.mark.parametrize("text,want", [
    ("https://App.Example.com", "https://app.example.com"),
    ("HTTPS://app.example.com:443/", "https://app.example.com"),
    ("http://localhost:80", "http://localhost"),
    ("http://localhost:3000", "http://localhost:3000"),
    ("http://[::1]:5984", "http://[::1]:5984"),
    ("http://[::1]", "http://[::1]"),
])
def test_an_origin_is_spelled_as_a_browser_sends_it(text, want):
    assert couch_cors.serialize(text) == want


@pytest.mark.parametrize("text", ["*", "", "null", "app.example.com", "file:///x", "https://a.b/c", "https://a.b?x",
                                  "https://a.b#f", "https://u:p@a.b", "https://a.b:0", "https://a.b:x",
                                  "https://a.b:", "http://[::1", "http://[::1]x", "https://a b"])
def test_a_malformed_origin_is_a_config_error_naming_the_option(text):
    with pytest.raises(ConfigError, match="--couch-cors-origin"):
        couch_cors.serialize(text)


def test_an_origin_is_allowed_when_configured_or_the_endpoints_own():
    conf = couch_cors.parse_origins(["https://app.example.com"])
    assert couch_cors.allowed("https://app.example.com", conf, "http", "127.0.0.1:5984")
    assert couch_cors.allowed("http://127.0.0.1:5984", conf, "http", "127.0.0.1:5984")
    assert couch_cors.allowed("https://db.example.com", frozenset(), "https", "db.example.com:443")
    for other in ("https://evil.example", "http://app.example.com", "null", "", None, "https://127.0.0.1:5984"):
        assert not couch_cors.allowed(other, conf, "http", "127.0.0.1:5984"), other
    assert not couch_cors.allowed("http://x", frozenset(), "http", "bad host/")  # a Host that is no origin
    assert "Access-Control-Allow-Methods" not in couch_cors.headers("https://a.b", preflight=False)
    assert couch_cors.headers("https://a.b", preflight=True)["Access-Control-Allow-Credentials"] == "true"
