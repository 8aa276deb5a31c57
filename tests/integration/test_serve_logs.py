"""Two instances served in one process (``multisite.serve``) each log to their own files, and close them.

Each serve() added its server.log handler to the one "multisite" logger, so every instance's lines went
into every served instance's server.log; the component logs (update.log...) were keyed by file name
only, so the second instance's went into the first's; and close() left those files open."""

from __future__ import annotations

import os
from pathlib import Path

import multisite


def _open_files() -> set[Path]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(Path(os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
    return out


def test_two_served_instances_log_apart_and_close_their_log_files(tmp_path):
    a = multisite.create(tmp_path / "A", name="A", durability="none")
    b = multisite.create(tmp_path / "B", name="B", durability="none")
    sa = multisite.serve(a, listen="127.0.0.1:0")
    try:
        sb = multisite.serve(b, listen="127.0.0.1:0")
        sb.close()
    finally:
        sa.close()
    log_a, log_b = (Path(r) / "log" / "server.log" for r in (a, b))
    text_a, text_b = log_a.read_text(), log_b.read_text()
    assert f"({Path(a).absolute()}) started" in text_a and f"({Path(b).absolute()}) started" in text_b
    assert str(Path(b).absolute()) not in text_a, text_a
    assert str(Path(a).absolute()) not in text_b, text_b
    left = {p for p in _open_files() if p.parent.name == "log" and p.parent.parent in (Path(a), Path(b))}
    assert not left, f"log files still open after close(): {sorted(map(str, left))}"
