"""The change-table sink of streams (``pipeline.change_sink``) without Spark: what a reader of the
table sees, a replayed batch, empty batches."""

from __future__ import annotations

import os
import stat

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from multisite.errors import ConfigError  # noqa: E402
from multisite.pipeline.stream_sink import PART_NAME, ChangeSink  # noqa: E402


def _rows(lo: int, hi: int):
    return pa.table({"seqno": pa.array(range(lo, hi + 1), pa.int64()),
                     "key_text": pa.array([f'["k",{i}]' for i in range(lo, hi + 1)])})


def test_each_batch_is_one_complete_file_named_by_its_batch_id(tmp_path):
    sink = ChangeSink(tmp_path / "t")
    sink.write(_rows(1, 5), 0)
    sink.write(_rows(6, 9), 1)
    assert sorted(p.relative_to(tmp_path / "t").as_posix() for p in (tmp_path / "t").rglob("*")
                  if p.is_file()) == [f"batch=00000000/{PART_NAME}", f"batch=00000001/{PART_NAME}"]
    got = pq.read_table(tmp_path / "t")  # the hive layout gives the batch column
    assert sorted(got.column("seqno").to_pylist()) == list(range(1, 10))
    assert (sink.rows, sink.batches) == (9, 2)


def test_a_replayed_batch_replaces_its_own_file_so_rows_land_once(tmp_path):
    sink = ChangeSink(tmp_path / "t")
    sink.write(_rows(1, 5), 0)
    sink.write(_rows(1, 5), 0)  # Spark re-runs the last planned batch after a restart
    assert sorted(pq.read_table(tmp_path / "t").column("seqno").to_pylist()) == [1, 2, 3, 4, 5]


def test_an_empty_batch_writes_nothing(tmp_path):
    sink = ChangeSink(tmp_path / "t")
    assert sink.write(_rows(1, 0), 3) is None
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def test_a_failed_write_leaves_no_file_for_readers(tmp_path, monkeypatch):
    sink = ChangeSink(tmp_path / "t")

    real = os.fsync

    def boom(fd):  # the batch file's fsync fails (a directory's would fail before the file is written)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("disk gone")
        real(fd)

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        sink.write(_rows(1, 3), 0)
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "t" / "batch=00000000").iterdir()] == []


def test_a_table_path_that_is_a_file_is_refused_by_name(tmp_path):
    f = tmp_path / "t"
    f.write_text("x")
    with pytest.raises(ConfigError, match=str(f)):
        ChangeSink(f)


def test_the_directories_the_sink_creates_are_made_durable(tmp_path, monkeypatch):
    # The table (and any missing parent) was made with mkdir(parents=True) and its parent never fsynced: a
    # power loss could lose the whole table, batch files fsynced inside it, while the stream's checkpoint
    # (kept elsewhere) says those batches are done. (A power loss cannot be staged: the fsyncs are checked.)
    import multisite.fsutil as fsutil
    import multisite.pipeline.stream_sink as stream_sink

    synced = []
    real = fsutil.fsync_dir

    def spy(d):
        synced.append(str(d))
        real(d)

    monkeypatch.setattr(fsutil, "fsync_dir", spy)
    monkeypatch.setattr(stream_sink, "fsync_dir", spy)
    table = tmp_path / "lake" / "A-changes"
    ChangeSink(table).write(_rows(1, 3), 0)
    for d in (tmp_path, tmp_path / "lake", table, table / "batch=00000000"):
        assert str(d) in synced, f"{d} not fsynced after an entry was made in it"
