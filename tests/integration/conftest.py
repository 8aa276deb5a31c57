"""Fixtures for the integration tier: real instance servers on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import pytest

from multisite.testing.checks import log_text
from multisite.testing.cluster import Cluster
from multisite.testing.docservers import DocCluster
from multisite.testing.pouchdb import Pouch, PouchUnavailable, node_modules


@pytest.fixture
def cluster(tmp_path, request):
    """A Cluster in the test's directory; every server is stopped (or killed) afterwards, and the
    servers' logs are printed when the test failed."""
    c = Cluster(tmp_path, durability="group")
    yield c
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    c.stop_all()
    if failed:
        for node in c.nodes.values():
            for f in sorted((node.root / "log").glob("*.log")):
                print(f"===== {node.name}/log/{f.name} (last 40 lines)")
                print("\n".join(log_text(node.root, f.name).splitlines()[-40:]))


@pytest.fixture
def dc(tmp_path):
    """Document servers in the test's directory (the CouchDB endpoints' tests), stopped afterwards."""
    c = DocCluster(tmp_path, durability="none")
    yield c
    c.stop_all()


@pytest.fixture(scope="module")
def pouch_installed():
    """The PouchDB modules (installed by ``make setup``); the test is skipped, saying why, without them."""
    try:
        return node_modules()
    except PouchUnavailable as e:
        pytest.skip(f"PouchDB cannot be installed: {e}")


@pytest.fixture
def pouch(pouch_installed, tmp_path):
    """A PouchDB in Node, in the test's directory."""
    p = Pouch(tmp_path / "pouch")
    yield p
    p.close()
