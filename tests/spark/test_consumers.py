"""Consumer positions protect unconsumed journal segments from prune (no Spark needed)."""

from multisite import create, open as open_db
from multisite.instance import consumers
from multisite.instance.layout import Layout
from multisite.instance.maintenance import prune


def test_prune_keeps_segments_a_consumer_has_not_consumed(tmp_path):
    root = create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with open_db(root) as db:
        db.create_region("r")
        for i in range(400):
            db.set("r", ("k", i), "x" * 50)
    lay = Layout.existing(root)
    consumers.record(lay, "stream1", 10)
    rep = prune(root, before=400)
    assert rep.limit_seqno == 11 and "stream1" in rep.reason
    assert rep.kept_from_seqno <= 11
    consumers.record(lay, "stream1", 300)
    rep = prune(root, before=400)
    assert 11 < rep.kept_from_seqno <= 301
    assert consumers.forget(lay, "stream1")
    assert consumers.load_all(lay) == []
