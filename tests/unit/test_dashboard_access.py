"""Who the dashboard lets in without its token: loopback peers, also as a dual-stack socket
(``--listen [::]:PORT``) reports them: IPv4-mapped IPv6 (``::ffff:127.0.0.1``)."""

from multisite.web.model import access_allowed


def test_an_ipv4_mapped_loopback_peer_is_local_and_a_mapped_remote_one_is_not():
    assert access_allowed("::ffff:127.0.0.1", None, None)
    assert not access_allowed("::ffff:10.0.0.7", None, "t")
    assert access_allowed("::ffff:10.0.0.7", "t", "t")
