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
