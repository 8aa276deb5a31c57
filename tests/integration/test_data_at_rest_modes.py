"""What the servers write into the directories they own is as private as the rest: an instance server's
logs, run file and store after clients committed, and a document server's home. (The files an instance
makes by itself: tests/unit/test_data_at_rest_modes.py.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import multisite
from multisite.multimaster.server import docdb
from multisite.multimaster.server.process import start_docserver, stop_docserver
from multisite.net import control
from multisite.server.process import start_server, stop_server


@pytest.fixture(autouse=True)
def usual_umask():
    old = os.umask(0o022)  # inherited by the servers started below
    yield
    os.umask(old)


def not_private(root: Path) -> dict[str, str]:
    out = {}
    for p in [root, *root.rglob("*")]:
        m = stat.S_IMODE(p.lstat().st_mode)
        if m != (0o700 if p.is_dir() else 0o600):
            out[str(p.relative_to(root))] = f"{m:o}"
    return out


def test_an_instance_server_writes_nothing_others_can_read(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    try:
        info = start_server(root, "127.0.0.1:0")
        with multisite.connect(f"127.0.0.1:{info['client_port']}") as db:
            db.create_region("r")
            for i in range(50):
                db.set("r", ("k", i), i)
    finally:
        if control.is_running(root):
            stop_server(root)
    assert (root / "log" / "server.log").exists()
    assert not not_private(root), not_private(root)


def test_a_document_server_home_is_private(tmp_path):
    docdb.create(tmp_path / "docs", "P", durability="none").close()
    home = tmp_path / "home"
    try:
        start_docserver(home, [str(tmp_path / "docs")], "A", "127.0.0.1:0")
    finally:
        if control.is_running(home):
            stop_docserver(home)
    assert (home / "log").is_dir()
    assert not not_private(home), not_private(home)
    assert not not_private(tmp_path / "docs"), not_private(tmp_path / "docs")
