"""Starting a grid process waits for it: one that answers its control socket without a run file (a
refused container stopping) is reported by its exit, not by a missing file."""

import subprocess
import sys

import pytest

from multisite.errors import ServerError
from multisite.grid.server.process import _wait_ready

# answers ping on the control socket of ROOT for a moment with no run/container.json, then exits 3
STOPPING = """
import asyncio, sys
from pathlib import Path
from multisite.net.control import answer_simple, control_address
root = Path(sys.argv[1])
async def main():
    stop = asyncio.Event()
    srv = await asyncio.start_unix_server(lambda r, w: answer_simple(r, w, dict, stop), path=control_address(root))
    print("error: refused by the catalog: NOT_A_MEMBER", flush=True)
    await asyncio.sleep(1.0)
    srv.close()
asyncio.run(main())
sys.exit(3)
"""


def test_a_process_that_answers_without_its_run_file_and_exits_is_reported_by_its_exit(tmp_path):
    (tmp_path / "log").mkdir()
    with open(tmp_path / "log" / "container.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", STOPPING, str(tmp_path)], stdout=out, stderr=subprocess.STDOUT)
    try:
        with pytest.raises(ServerError, match=r"exited at start \(status 3\): error: refused by the catalog"):
            _wait_ready(proc, tmp_path, "container")
    finally:
        proc.kill()
        proc.wait()
