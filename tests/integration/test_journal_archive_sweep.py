"""A local archive write killed mid-way leaves a temp file (fsutil.atomic_write's); the next run of the
archiver removes it, in every folder the archiver writes to."""

from __future__ import annotations

from multisite.pipeline.archive import archive

from .test_journal_archive import journaled


def test_a_killed_local_write_of_frame_headers_leaves_no_temp_file_after_the_next_run(tmp_path):
    a = journaled(tmp_path / "A", 120)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    (dest / "headers" / ".00000009.bin.tmp-999").write_bytes(b"half")  # atomic_write killed mid-way
    archive(str(a), str(dest))
    assert not list((dest / "headers").glob(".*"))
