"""The tests' moto S3 server must not outlive the process that started it: a test run killed by a
timeout or SIGKILL never reaches ``S3Server.stop``, and the server used to sleep on forever (orphans
of killed runs were found on the shared machine, hours old)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from multisite.testing.checks import wait_until
from multisite.testing.s3server import S3Server

OWNER = """
import time
from multisite.testing.s3server import S3Server
s = S3Server().start()
print(s.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_s3_server_exits_when_its_owner_is_sigkilled():
    if not S3Server.available():
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    server_pid = None
    try:
        server_pid = int(owner.stdout.readline())
        assert _alive(server_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        wait_until(lambda: not _alive(server_pid), timeout_s=15, what="the orphaned moto server to exit")
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        if server_pid is not None and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
