"""A group-mode primary that comes back without frames its source had shipped (issue 28's simulation
found it: an EIO on the fdatasync after the journal pool took the batch, or a power cut) starts a new
history record when its server starts, so the secondary holding those frames rolls them back instead
of keeping them under seqnos the primary then gives to other transactions (a silent divergence)."""

from __future__ import annotations

import shutil

from multisite.testing.checks import journal_frames

from .test_replication import workload


def test_a_secondary_ahead_of_a_restarted_group_primary_rolls_back(cluster):
    a, b = cluster.instance("A"), cluster.instance("B")
    cluster.link(a, b)
    workload(a, 10)
    cluster.wait_caught_up(a, b)
    a.stop()
    shutil.copytree(a.root, a.root.parent / "A-before")  # A's disk as the power cut will leave it
    a.start()
    a.start_source(b)
    workload(a, 10, start=100)  # shipped to B, then lost by A below
    cluster.wait_caught_up(a, b)
    shipped = b.seqno()
    cluster.stop_all()
    shutil.rmtree(a.root)
    shutil.copytree(a.root.parent / "A-before", a.root)
    a.start()
    workload(a, 15, start=200)  # other transactions at the seqnos B holds
    assert a.seqno() > shipped
    b.start()
    b.start_receiver(autorollback=True)
    a.start_source(b)
    cluster.wait_caught_up(a, b)
    cluster.stop_all()
    assert journal_frames(b.root) == journal_frames(a.root)
    assert list((b.root / "lost").iterdir())  # what A lost went to B's lost-transaction file
