"""atomic_write in one process: the steps, and a failure before the rename leaves the old file."""

from __future__ import annotations

import pytest

from multisite.fsutil import atomic_write, write_all


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"old")
    steps = []
    atomic_write(p, b"new contents", hook=steps.append)
    assert p.read_bytes() == b"new contents"
    assert steps == ["written", "synced", "replaced"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f"]


def test_atomic_write_creates_a_missing_file(tmp_path):
    atomic_write(tmp_path / "g", b"x")
    assert (tmp_path / "g").read_bytes() == b"x"


@pytest.mark.parametrize("step", ["written", "synced"])
def test_failure_before_the_rename_keeps_the_old_content(tmp_path, step):
    p = tmp_path / "f"
    p.write_bytes(b"old")

    def hook(s):
        if s == step:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_write(p, b"new", hook=hook)
    assert p.read_bytes() == b"old"
    if step == "written":  # the temp file is cleaned up when the write itself fails
        assert sorted(x.name for x in tmp_path.iterdir()) == ["f"]


def test_write_all_writes_everything(tmp_path):
    import os

    fd = os.open(tmp_path / "w", os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, memoryview(b"abc" * 100_000), "w")
    finally:
        os.close(fd)
    assert (tmp_path / "w").read_bytes() == b"abc" * 100_000
