"""bench/catchup.py's cleanup: a failed run leaves no process behind (no servers needed: stubbed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "catchup.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_catchup", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def test_a_timed_out_run_kills_its_source_start_process(tmp_path, monkeypatch):
    cu = _load()
    hang = tmp_path / "multisite"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(cu, "MULTISITE", str(hang))
    monkeypatch.setattr(cu.Tree, "ms", lambda self, *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    monkeypatch.setattr(cu, "ctl", lambda root, op, **k: {"listen": "127.0.0.1:1"} if op == "receiver.status"
                        else {"seqno": 0})
    procs = []
    real = subprocess.Popen

    def popen(*a, **k):
        procs.append(real(*a, **k))
        return procs[-1]

    monkeypatch.setattr(cu.subprocess, "Popen", popen)
    primary = tmp_path / "A"
    primary.mkdir()
    with pytest.raises(RuntimeError, match="after 0 s"):
        cu.multisite_run(cu.Tree("t", tmp_path), primary, 10, tmp_path / "work", "none", 0.1, tmp_path / "logs")
    (p,) = procs
    try:
        assert p.poll() is not None, "the `source start` process outlived the failed run"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not any((tmp_path / "work").iterdir())
