"""Act 5 of the demo (the grid), run on its own: a catalog and three containers as processes on
127.0.0.1, a writer through the grid client, a SIGKILLed container, the key-by-key comparison, and a
commit refused by the vote that is visible nowhere; then the same grid on a 3-member etcd with two
catalogs, the leading one SIGKILLed under the writer, then a container (issue 24). The act's own
checks decide; the test also reads its story."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from multisite.demo import ACTS
from multisite.demo.grid import CONTAINERS, PARTITIONS, act_grid


def test_the_grid_act_passes_and_tells_its_story(tmp_path: Path):
    out = io.StringIO()
    ok = act_grid(Console(file=out, width=160, force_terminal=False), tmp_path)
    text = out.getvalue()
    logs = "".join(f"\n===== {f.relative_to(tmp_path)} (last 30 lines)\n"
                   + "\n".join(f.read_text(errors="replace").splitlines()[-30:])
                   for f in sorted([*tmp_path.glob("grid/*/log/*.log"), *tmp_path.glob("grid-etcd/*/log/*.log")]))
    assert ok, f"the grid act failed:\n{text}{logs}"
    flat = " ".join(text.split())  # immune to line wrapping
    for phrase in ("Act 5: the grid", "catalog: pid", "container A: pid", "container B: pid", "container C: pid",
                   "writer started", "SIGKILL container", "promoted to primary", "the new primaries take commits",
                   "restarted on its directory", "replicas caught up", "writer stopped",
                   "every replica holds every committed transaction", "compared key by key",
                   "ReplicationVotedToRollback", "0 synchronous replica(s) current, min_sync is 1",
                   "the refused commit is visible nowhere", "every acknowledged write survived the SIGKILL"):
        assert phrase in flat, f"missing {phrase!r} in the act's output:\n{text}"
    # the comparison: every shard of every partition, each OK
    rows = re.findall(r"^\s*(?:p\d+\s+)?([ABC]) (primary|sync|async)\s+[\d,]+\s+[\d,]+\s+0\s+0\s+0\s+0\s+0\s+OK\s*$",
                      text, re.M)
    assert len(rows) == 3 * PARTITIONS, text
    # the refused key: absent on the primary, in each container's shard of its partition on disk, and
    # after every process restarted
    assert re.search(r"get \('refused',\) from p\d+'s primary: absent OK", flat), text
    on_disk = re.findall(r"[ABC]/demo-p\d+: seqno [\d,]+, [\d,]+ keys, \('refused',\) absent OK", text)
    assert len(on_disk) == len(CONTAINERS), text
    assert re.search(r"get \('refused',\): absent OK; p\d+ takes commits again", flat), text
    assert list(tmp_path.glob("grid/A/demo-p*")), "the shards live under the act's root"
    # the scene on etcd: the follower took over, named by its own status, while the writer went on
    scene = flat[flat.index("No single point of failure"):]
    for phrase in ("etcd: 3 members at", "catalog k1: pid", "catalog k2: pid", "registered in etcd",
                   "the leader, after", "the writer went on meanwhile", "lost: its lease in etcd ended",
                   "promoted to primary", "the new primaries take commits", "shards of 8 partitions compared key by key",
                   "identical, OK", "etcd scene in"):
        assert phrase in scene, f"missing {phrase!r} in the etcd scene's output:\n{text}"
    took = re.search(r"SIGKILL catalog (k[12]) \(pid \d+\), the leader.*?catalog (k[12]) leads ([\d.]+) s after the "
                     r"SIGKILL \(its status: leader \2, answered by \2\); the writer went on meanwhile: ([\d,]+) commits "
                     r"acknowledged", scene)
    assert took and took[1] != took[2], text
    assert int(took[4].replace(",", "")) > 0, "no commit while the catalogs changed leader"
    assert re.search(r"leading catalog: (k[12]|none) \(was k[12]", scene), text
    assert act_grid in ACTS  # `multisite demo` plays it
