"""Spark's own start-up lines stay off the terminal unless --verbose (a fresh process each: the JVM starts)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import KNOWN, build

NOISE = ("Setting default log level", "Using incubator modules")


def _verify(a, b, *extra):
    exe = [sys.executable, "-c", "from multisite.cli.main import main; main()"]
    return subprocess.run([*exe, "pipeline", "verify", str(a), str(b), "--engine", "spark", *extra],
                          capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if k != "MULTISITE_SPARK_VERBOSE"})


def test_jvm_start_up_lines_only_with_verbose(tmp_path):
    a = build(tmp_path / "A", "A", KNOWN)
    b = build(tmp_path / "B", "B", KNOWN)
    quiet = _verify(a, b)
    assert quiet.returncode == 0 and "EQUAL at seqno 5" in quiet.stdout, quiet.stdout + quiet.stderr
    for line in NOISE:
        assert line not in quiet.stdout + quiet.stderr
    loud = _verify(a, b, "--verbose")
    assert loud.returncode == 0
    assert "Using incubator modules" in loud.stdout + loud.stderr  # the JVM's own line, on the terminal
