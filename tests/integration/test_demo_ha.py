"""Act 9 of the demo (automatic failover through etcd), run on its own; the act's own checks decide and
the test reads its story."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from multisite.demo import ACTS
from multisite.demo.ha import act_ha


def test_the_ha_act_passes_and_tells_its_story(tmp_path: Path):
    out = io.StringIO()
    ok = act_ha(Console(file=out, width=200, force_terminal=False), tmp_path)
    text = out.getvalue()
    logs = "".join(f"\n===== {f.relative_to(tmp_path)} (last 20 lines)\n"
                   + "\n".join(f.read_text(errors="replace").splitlines()[-20:])
                   for f in sorted(tmp_path.glob("ha/*/log/*.log")))
    assert ok, f"the HA act failed:\n{text}{logs}"
    flat = " ".join(text.split())
    for phrase in ("Act 9: automatic failover", "holds the leader key and is primary", "SIGKILL",
                   "detection:", "election:", "promotion:", "the writer's first commit on",
                   "came back and rejoined as a secondary", "switchover back to", "members identical"):
        assert phrase in flat, f"missing {phrase!r} in the act's output:\n{text}"
    assert act_ha in ACTS
