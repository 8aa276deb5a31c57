"""A Source Server reading the journal files (catching up from before its journal pool), no sockets."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import multisite
from multisite.replication.server.source import SourceConfig, SourceServer
from multisite.replication.server.pools import JournalPool


def test_file_reads_see_records_written_after_the_reader_reached_the_end(tmp_path):
    # The secondary is behind the journal pool: the source reads the files. It reaches the end of what
    # was written, the primary commits more (and the pool, too small, no longer holds them): the next
    # read must find them in the files, not end the source with "neither in the pool nor in the files".
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(20):
            db.set("r", (i,), "x" * 40)
        pool = JournalPool(1)  # keeps only the newest frame
        pool.reset(db.seqno)
        db.commit_listeners.append(pool.extend)
        src = SourceServer(SimpleNamespace(db=db, pool=pool), SourceConfig("B", "127.0.0.1", 1),
                           logging.getLogger("test-source-files"))
        run = src._read_files(1)
        assert (run.first_seqno, run.last_seqno) == (1, 20)
        for i in range(5):
            db.set("r", (i,), "y" * 40)
        assert pool.read(21, 1 << 20) is None  # older than the pool holds: from the files
        run = src._read_files(21)
        assert run is not None and (run.first_seqno, run.last_seqno) == (21, 25)
