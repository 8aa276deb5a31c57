"""What an instance keeps at rest is its owner's alone: every directory it makes is 0700 and every file
0600 (PostgreSQL's rule for a data directory), or 0750 and 0640 when it was created with --group-read
(users.json, password hashes, stays 0600); whatever the umask; through creation, commits over several
segments, a rollback's lost file, consumers, users and a backup. An instance directory every user may
write is refused at open, naming the fix. (tests/integration/test_data_at_rest_modes.py: what the
servers write.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import multisite
from multisite.errors import UnsafePermissions
from multisite.instance import consumers
from multisite.instance.layout import Layout
from multisite.instance.maintenance import backup
from multisite.instance.users import add_user
from multisite.journal.segments import list_segments
from multisite.multimaster.server import docdb


@pytest.fixture(autouse=True)
def usual_umask():
    old = os.umask(0o022)  # a usual machine's: files are made 0644 unless multisite says otherwise
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """The mode of ``root`` and of everything under it, by path relative to it."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


SECRETS = {"users.json"}  # password hashes: 0600 even where the group may read the data


def assert_modes(root: Path, dir_mode: int, file_mode: int) -> None:
    wrong = {p: f"{m:o}" for p, m in modes(root).items()
             if m != (dir_mode if (root / p).is_dir() else 0o600 if p in SECRETS else file_mode)}
    assert not wrong, f"not {dir_mode:o}/{file_mode:o} under {root}: {wrong}"


def exercise(root: Path) -> None:
    """Commits over several segments, a rollback (a lost file), a consumer and a user."""
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(200):
            db.set("acct", ("k", i), {"pad": "x" * 60})
        target = db.seqno
        for i in range(5):
            db.set("acct", ("late", i), i)
        db.rollback(target)
        assert list(db.layout.lost.iterdir())
        consumers.record(db.layout, "spark", target)
    add_user(root, "ada", "admin", "a-secret-long-enough")


def test_an_instance_and_its_backup_are_private(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="fsync", segment_bytes=4096)
    assert_modes(root, 0o700, 0o600)
    exercise(root)
    assert len(list_segments(root / "journal")) > 1
    assert {"db/store.sqlite", "users.json", "lock", "instance.msi"} <= modes(root).keys()
    assert_modes(root, 0o700, 0o600)
    backup(root, tmp_path / "copy")
    assert_modes(tmp_path / "copy", 0o700, 0o600)


def test_group_read_lets_the_group_read_and_no_one_else(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=4096, group_read=True)
    exercise(root)
    assert_modes(root, 0o750, 0o640)
    backup(root, tmp_path / "copy")
    assert_modes(tmp_path / "copy", 0o750, 0o640)


def test_an_existing_empty_directory_is_made_private(tmp_path):
    d = tmp_path / "A"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    assert_modes(multisite.create(d, name="A", durability="none"), 0o700, 0o600)


def test_a_document_database_is_private(tmp_path):
    with docdb.create(tmp_path / "docs", "P", durability="none") as d:
        d.create("Memo", {"n": 1})
    assert_modes(tmp_path / "docs", 0o700, 0o600)


@pytest.mark.parametrize("where", [".", "journal", "db"])
def test_a_directory_others_may_write_is_refused_with_the_fix(tmp_path, where):
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    os.chmod(root / where, 0o777 if where != "." else 0o707)
    path = (root / where) if where != "." else root
    with pytest.raises(UnsafePermissions, match=f"chmod o-w {path}") as e:
        multisite.open(root)
    assert e.value.code == "UNSAFE_PERMISSIONS" and str(path) in str(e.value)
    os.chmod(path, 0o700)
    multisite.open(root).close()
    assert Layout.existing(root)
