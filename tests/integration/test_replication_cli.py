"""The replication commands as an operator runs them: each `multisite …` is its own subprocess.

Covers server start/stop, receiver start/status, source start/status/showbacklog/deactivate/activate/
stop, update stop/start/status, and `status`, with the JSON shapes scripts rely on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import multisite
from multisite.testing.checks import assert_contiguous_journal, assert_same_data, wait_until

MULTISITE = shutil.which("multisite", path=str(Path(sys.executable).parent)) or "multisite"


def ms(*args: object, ok: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([MULTISITE, *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok and res.returncode != 0:
        raise AssertionError(f"`multisite {' '.join(map(str, args))}` failed ({res.returncode}): "
                             f"{res.stdout}{res.stderr}")
    return res


def ms_json(*args: object) -> dict:
    return json.loads(ms(*args, "--json").stdout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


SOURCE_KEYS = {"pid", "log", "secondary", "state", "mode", "connect", "seqno", "last_sent", "last_confirmed",
               "backlog", "backlog_unsent", "reading_from", "file_reads", "lag_s", "connects", "last_error",
               "start_seqno", "sent_records", "compress_level", "tls"}
RECEIVER_KEYS = {"pid", "log", "state", "listen", "source", "seqno", "received_seqno", "backlog",
                 "receive_pool_bytes", "xoff", "xoffs", "received_records", "last_error", "update_process"}
UPDATE_KEYS = {"pid", "log", "state", "seqno", "applied", "backlog", "error"}


@pytest.fixture
def instances(tmp_path):
    """A and B created with the CLI; any server still running at the end is stopped."""
    roots = {}
    for name in ("A", "B"):
        ms("instance", "create", tmp_path / name, "--name", name, "--durability", "group")
        roots[name] = tmp_path / name
    yield roots
    for root in roots.values():
        if (root / "run" / "server.json").exists():
            ms("server", "stop", root, "--timeout", "2", ok=False)


def write(port: int, n: int, start: int = 0) -> int:
    with multisite.connect(f"127.0.0.1:{port}") as db:
        db.create_region("acct")
        for i in range(start, start + n):
            last = db.set("acct", ("k", i), {"i": i})
    return last


def test_replication_through_the_cli(instances):
    a, b = instances["A"], instances["B"]

    out = ms("server", "start", a, "--listen", "127.0.0.1:0").stdout
    m = re.search(r"pid (\d+), log (\S+), clients on port (\d+)", out)
    assert m, out
    a_pid, a_port = int(m[1]), int(m[3])
    assert alive(a_pid) and Path(m[2]) == a / "log" / "server.log"
    assert "already running" in ms("server", "start", a, ok=False).stderr
    ms("server", "start", b)

    out = ms("receiver", "start", b, "--listen", "127.0.0.1:0", "--receive-pool-mib", "1").stdout
    m = re.search(r"listening on 127\.0\.0\.1:(\d+).*pid (\d+), log (\S+)", out)
    assert m, out
    port = int(m[1])
    assert Path(m[3]) == b / "log" / "receiver.log"
    out = ms("source", "start", a, "--secondary", "B", "--connect", f"127.0.0.1:{port}",
             "--heartbeat-interval", "0.2", "--heartbeat-timeout", "3").stdout
    assert f"pid {a_pid}" in out and "source-B.log" in out

    last = write(a_port, 100)
    st = wait_until(lambda: (s := ms_json("source", "status", a, "--secondary", "B"))["last_confirmed"] == last
                    and s, what="B confirms")
    assert SOURCE_KEYS <= set(st), SOURCE_KEYS - set(st)
    assert st["pid"] == a_pid and st["state"] == "streaming" and st["mode"] == "active"
    assert (st["seqno"], st["last_sent"], st["backlog"], st["backlog_unsent"]) == (last, last, 0, 0)
    assert st["log"] == str(a / "log" / "source-B.log")

    bl = ms_json("source", "showbacklog", a, "--secondary", "B")
    assert bl == {"pid": a_pid, "state": "streaming", "seqno": last, "last_sent": last, "last_confirmed": last,
                  "backlog": 0, "backlog_unsent": 0}

    rs = ms_json("receiver", "status", b)
    assert RECEIVER_KEYS <= set(rs), RECEIVER_KEYS - set(rs)
    assert (rs["state"], rs["source"], rs["seqno"], rs["received_seqno"], rs["backlog"]) == \
           ("receiving", "A", last, last, 0)
    assert rs["listen"] == f"127.0.0.1:{port}" and rs["xoff"] is False
    assert rs["update_process"]["state"] == "running"

    # The Update Process stops alone; records keep arriving and wait in the receive pool.
    assert "update process stopped" in ms("update", "stop", b).stdout
    up = ms_json("update", "status", b)
    assert UPDATE_KEYS <= set(up) and up["state"] == "stopped" and up["seqno"] == last
    more = write(a_port, 50, start=100)
    rs = wait_until(lambda: (r := ms_json("receiver", "status", b))["received_seqno"] == more and r,
                    what="records received while the update process is stopped")
    assert rs["seqno"] == last and rs["backlog"] == more - last and rs["update_process"]["state"] == "stopped"
    bl = ms_json("source", "showbacklog", a, "--secondary", "B")
    assert bl["seqno"] == bl["last_sent"] == more and bl["backlog"] == more - last and bl["backlog_unsent"] == 0
    assert "update process started" in ms("update", "start", b).stdout
    wait_until(lambda: ms_json("receiver", "status", b)["seqno"] == more, what="B applies the backlog")
    wait_until(lambda: ms_json("source", "showbacklog", a, "--secondary", "B")["backlog"] == 0, what="backlog 0")

    # Deactivate / activate / stop the source.
    ms("source", "deactivate", a, "--secondary", "B")
    wait_until(lambda: ms_json("source", "status", a, "--secondary", "B")["state"] == "passive", what="passive")
    ms("source", "activate", a, "--secondary", "B")
    wait_until(lambda: ms_json("source", "status", a, "--secondary", "B")["state"] == "streaming", what="streaming")

    st = ms_json("status", a)
    assert st["pid"] == a_pid and st["role"] == "primary" and st["seqno"] == more and st["client_port"] == a_port
    assert set(st["sources"]) == {"B"} and st["receiver"] is None
    assert ms_json("status", b)["role"] == "secondary"

    assert "stopped" in ms("source", "stop", a, "--secondary", "B").stdout
    res = ms("source", "status", a, "--secondary", "B", "--json", ok=False)
    assert res.returncode == 1 and res.stderr.startswith("error: SERVER:") and "Traceback" not in res.stderr

    out = ms("server", "stop", a).stdout
    assert f"pid {a_pid} stopped" in out and not alive(a_pid)
    ms("server", "stop", b)
    res = ms("receiver", "status", b, "--json", ok=False)
    assert res.returncode == 1 and "no instance server is running" in res.stderr
    assert_same_data(a, b)
    assert_contiguous_journal(b, more)


def test_cli_errors_are_one_line(instances):
    a = instances["A"]
    ms("server", "start", a)
    try:
        for args in (("source", "status", a, "--secondary", "nobody"),
                     ("source", "start", a, "--secondary", "B", "--connect", "no-port"),
                     ("source", "start", a, "--secondary", "B", "--connect", "127.0.0.1:1", "--compress", "99"),
                     ("source", "start", a, "--secondary", "B", "--connect", "127.0.0.1:1", "--tls-cert", "x.pem"),
                     ("receiver", "stop", a)):
            res = ms(*args, ok=False)
            assert res.returncode == 1 and res.stderr.startswith("error: ") and "Traceback" not in res.stderr, args
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    finally:
        ms("server", "stop", a)
