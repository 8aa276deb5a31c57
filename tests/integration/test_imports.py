"""Importing multisite, its pipeline and its command line loads neither pyspark nor pyarrow: checked in a
fresh interpreter (a child process), since this test run has imported both already."""

from __future__ import annotations

import subprocess
import sys


def test_import_multisite_stays_light():
    code = ("import sys, multisite, multisite.pipeline, multisite.cli.main; "
            "print('pyspark' in sys.modules, 'pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
