"""Archive URLs that do not say what they seem to are refused with a clear error, not taken for
another place."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError
from multisite.pipeline.archive import Target


def test_a_file_url_with_a_host_is_refused_not_archived_elsewhere(tmp_path):
    # file://tmp/arch (two slashes) parses as host "tmp", path "/arch": the archive went to /arch.
    with pytest.raises(ConfigError, match="file:///"):
        Target(f"file:/{tmp_path}/arch")
    assert Target(f"file://{tmp_path}/arch").base == str(tmp_path / "arch")
    assert Target(f"file://localhost{tmp_path}/arch").base == str(tmp_path / "arch")


def test_archive_option_naming_an_instance_directory_says_it_is_not_an_archive(tmp_path):
    # --archive /data/A (the instance itself, or another instance) was reported as "the archive /data/A
    # holds instance A's journal, not A's".
    import multisite
    from multisite.pipeline.plan import with_archive

    a = multisite.create(tmp_path / "A", name="A", durability="none")
    with pytest.raises(ConfigError, match="is not a journal archive"):
        with_archive(str(a), str(a))


@pytest.mark.parametrize("inside", ["", "journal", "archive"])
def test_an_archive_inside_its_instance_directory_is_refused(tmp_path, inside):
    # journal archive /data/A --to /data/A wrote archive.json into the instance: prune then counted on a
    # copy on the same disk, and every pipeline read of /data/A took the directory for the archive,
    # reading only the archived seqnos.
    import multisite
    from multisite.pipeline.archive import archive, is_archive

    a = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096)
    with multisite.open(a) as db:
        db.create_region("r")
        for i in range(100):
            db.set("r", ("k", i), "x" * 50)
    with pytest.raises(ConfigError, match="inside the instance"):
        archive(str(a), str(a / inside) if inside else str(a))
    assert not is_archive(str(a))
