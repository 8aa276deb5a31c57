"""The instance server's client requests (``InstanceServer._client_op``), called directly: no sockets."""

from __future__ import annotations

import pytest

from multisite.errors import RegionNotFound
from multisite.server.instance import InstanceServer


@pytest.mark.parametrize("args", [{"limit": 0}, {"inclusive": "yes"}, {"start": [1.5j]}],
                         ids=["bad-limit", "bad-inclusive", "bad-start"])
def test_items_of_a_region_that_does_not_exist_says_so_first(db, args):
    # As before the engine's facade: the region is checked before the page's other arguments.
    srv = InstanceServer(db.layout.root, None)
    srv.db = db
    with pytest.raises(RegionNotFound, match="nope"):
        srv._client_op("items", {"region": "nope", "start": None, **args})
    assert srv._client_op("items", {"region": "acct", "start": None}) == []
