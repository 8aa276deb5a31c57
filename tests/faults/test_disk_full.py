"""A journal write that fails (the file cannot grow) leaves no trace and loses nothing committed.

The failure is real, not mocked: a child process lowers its RLIMIT_FSIZE just above the journal's
size, so the next record's write fails part-way (EFBIG), as on a full disk.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import multisite
from multisite.journal.reader import iter_records

CHILD = r"""
import json, resource, signal, sys
import multisite, multisite.engine.core
multisite.engine.core.STORE_FLUSH_INTERVAL_S = 3600.0  # the store must not flush (and grow) under the limit
db = multisite.open(sys.argv[1])
db.create_region("acct")
db.create_region("scratch", replicated=False)
for i in range(10):
    db.set("acct", ("a", i), i)
db.flush()
seg = sorted(db.layout.journal.glob("*.msj"))[-1]
size0 = seg.stat().st_size
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (size0 + 120, resource.RLIM_INFINITY))
db.set("scratch", ("u",), "unreplicated, committed before the failure")
small = db.set("acct", ("small",), 1)  # fits under the limit
size1 = seg.stat().st_size
out = {"small": small}
try:
    with db.transaction() as tx:
        tx.set("acct", ("big",), "x" * 1000)
        tx.set("acct", ("a", 0), "changed")
        tx.kill("acct", ("a", 1))
    out["error"] = None
except Exception as e:
    out["error"] = type(e).__name__
out.update(seqno=db.seqno, size_after_failure=seg.stat().st_size, size_before_failure=size1,
           big=db.get("acct", ("big",)), a0=db.get("acct", ("a", 0)), a1=db.get("acct", ("a", 1)),
           u=db.get("scratch", ("u",)))
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
out["next"] = db.set("acct", ("after",), 1)
db.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    root = multisite.create(tmp_path_factory.mktemp("full") / "A", name="A", durability="none")
    res = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return root, json.loads(res.stdout)


def test_the_failed_transaction_leaves_no_trace(outcome):
    root, out = outcome
    assert out["error"] is not None
    assert out["small"] == 11 and out["seqno"] == 11
    assert out["size_after_failure"] == out["size_before_failure"]  # the partial frame was cut off
    assert (out["big"], out["a0"], out["a1"]) == (None, 0, 1)
    assert out["next"] == 12  # no seqno was used up by the failure


def test_the_journal_stays_valid_and_reopens(outcome):
    root, _ = outcome
    with multisite.open(root) as db:
        assert db.seqno == 12 and db.recovery.torn_bytes == 0
        assert db.get("acct", ("small",)) == 1 and db.get("acct", ("after",)) == 1
        assert db.get("acct", ("big",)) is None and db.get("acct", ("a", 0)) == 0
    assert [r.seqno for r in iter_records(root / "journal")] == list(range(1, 13))


def test_unreplicated_updates_committed_before_the_failure_survive(outcome):
    _, out = outcome
    assert out["u"] == "unreplicated, committed before the failure"
