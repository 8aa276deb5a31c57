"""The main job, end to end: ``multisite demo`` as a user runs it, with its server processes on 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO_TIMEOUT_S = 900  # act 8 starts Spark: about a minute more on a quiet machine, several on a loaded one


def test_demo_passes_and_tells_its_story(tmp_path: Path):
    workdir = tmp_path / "demo"
    multisite = Path(sys.executable).with_name("multisite")
    proc = subprocess.run([str(multisite), "demo", "--workdir", str(workdir)], capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT_S, env={**os.environ, "COLUMNS": "160"})
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed (status {proc.returncode}):\n{out}\n{proc.stderr}"
    text = " ".join(out.split())  # immune to line wrapping

    # Act 1: crash recovery
    assert "every acknowledged transaction survived the crash" in text

    # Act 2: three server processes, a SIGKILLed secondary, catch-up from journal files, then the pool again
    for phrase in ("Act 2: log shipping", "instance server A: pid", "instance server B: pid", "instance server C: pid",
                   "SIGKILL B's instance server", "B's instance server restarted",
                   "B's Receiver Server listens again", "reading journal files", "caught up: back to the journal pool",
                   "B and C caught up with A", "now reading from the pool: OK",
                   "A, B and C hold the same data and the same journal"):
        assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    # the live table's last frame and the key-by-key comparison
    assert re.search(r"B ← A\s+\d+\s+[\d,]+\s+0\s+[\d.]+ s\s+streaming\s+pool\s+[1-9]", out), out
    for name in "BC":
        assert re.search(rf"^\s*{name}\s+[\d,]+\s+0\s+0\s+0\s+1\.\.[\d,]+\s+0\s+OK\s*$", out, re.M), out
    # Act 3: failover, rollback into a lost-transaction file, rejoin
    for phrase in ("Act 3: failover", "B promoted to primary and accepting commits",
                   "rolled back 5 transaction(s)", "Unreplicated Transaction Log", "never reached B",
                   "A rejoined as B's secondary",
                   "A and B hold the same data; A's unreplicated transactions are in its lost file"):
        assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    # Act 4: rolling upgrade through an in-filter and an out-filter
    for phrase in ("Act 4: rolling upgrade", "its receiver's in-filter gives B {'first': 'Ann', 'last': 'Lee1'} for "
                   "A's {'name': 'Ann Lee1'}", "switchover at seqno", "through B's out-filter",
                   "every value on A is the old shape of B's"):
        assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    # Act 6: guaranteed message delivery through the file transport
    for phrase in ("Act 6: guaranteed message delivery", "round 1 (oslo offline): SYSREMOTEUSER of HQ",
                   "paris: 12 rows, exactly its subscribed rows (site=fr): yes",
                   "oslo: 12 rows, exactly its subscribed rows (site=no): yes", "rule consolidated-wins",
                   "act_delivery: OK"):
        assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    # Act 7: multi-master documents
    for phrase in ("Act 7: multi-master documents", "OK Ada's edits merged on both sites",
                   "OK one conflict document holds the losing memo", "OK the connection document fired on schedule",
                   "the two sites converged"):
        assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    # Act 8: the pipeline on act 2's instances (skipped, saying so, only when no Java is found)
    assert "Act 8: the pipeline" in text
    if "Act 8 skipped" not in text:
        for phrase in ("verify A B (local", "EQUAL at seqno", "exported A seqnos 1..",
                       "the next export found the rollback: retracted 3 transaction(s)",
                       "0 in changes, 0 in state; retracted/ lists 3 transaction(s)", "analytics replica of A: the newest transactions",
                       "the analytics replica follows A, rollback included; A and B verify equal", "act_pipeline: OK"):
            assert phrase in text, f"missing {phrase!r} in the demo's output:\n{out}"
    assert re.search(r"demo finished in [\d.]+ s: OK", text)
    assert {p.name for p in (workdir / "log-shipping").iterdir()} >= {"A", "B", "C"}
