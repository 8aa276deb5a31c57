"""The CLI's output as a script, a log or `grep` sees it on a fresh machine: each `multisite …` is a real
subprocess whose stdout is a pipe, with no COLUMNS in its environment. Paths, UNIDs and addresses come out
whole, on one line, however long (rich would wrap them at 80 columns, or cut them with an ellipsis)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MULTISITE = shutil.which("multisite", path=str(Path(sys.executable).parent)) or "multisite"
CLI_TIMEOUT_S = 120


def ms(*args: object) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    res = subprocess.run([MULTISITE, *map(str, args)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=CLI_TIMEOUT_S, env=env)
    assert res.returncode == 0, f"`multisite {' '.join(map(str, args))}` failed: {res.stdout}{res.stderr}"
    return res.stdout


def line_with(text: str, whole: str) -> str:
    """The one line of ``text`` holding all of ``whole``; fails naming what was printed instead."""
    lines = [ln for ln in text.splitlines() if whole in ln]
    assert lines, f"{whole!r} is not on one line of:\n{text}"
    return lines[0]


@pytest.fixture
def deep(tmp_path) -> Path:
    d = tmp_path.joinpath(*[f"a-directory-deep-enough-{i}" for i in range(4)])
    d.mkdir(parents=True)
    return d


def test_server_start_and_stop_print_the_log_path_whole(deep):
    root = deep / "A"
    ms("instance", "create", root, "--name", "A", "--durability", "none")
    log = str(root.absolute() / "log" / "server.log")
    assert len(log) > 160
    try:
        line_with(ms("server", "start", root, "--listen", "127.0.0.1:0"), log)
    finally:
        out = ms("server", "stop", root)
    line_with(out, log)


def test_doc_list_prints_each_unid_whole_and_db_info_its_path(deep):
    db = deep / "docs"
    ms("db", "create", db, "--title", "P", "--durability", "none")
    for n in range(3):
        ms("doc", "create", db, "Memo", json.dumps({"n": n, "subject": "a subject long enough to push the row past "
                                                             "eighty columns on its own"}))
    unids = [d["unid"] for d in json.loads(ms("doc", "list", db, "--json"))]
    assert len(unids) == 3
    out = ms("doc", "list", db)
    for u in unids:
        line_with(out, u)
    line_with(ms("db", "info", db), str(db))
