"""Waiting for a server process to end and running one with its log: what every family's processes share.

The instance server (``server/process.py``), the grid's catalog and containers (``grid/server/process.py``)
and the document server (``multimaster/server/process.py``) each start their own process; they all
stop it with ``wait_exit`` and run its body with ``run_logged``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Coroutine

from ..errors import MultisiteError
from ..fsutil import check_not_world_writable, create_file, make_dir


def wait_exit(pid: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for ``pid`` (told to shut down) to exit, then SIGKILL it; the pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return pid
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return pid


def _exited(pid: int) -> bool:
    """True once ``pid`` is gone. A server started by this process (tests, the demo) stays a zombie,
    which ``kill(pid, 0)`` still reaches, until it is reaped here."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def run_logged(root: Path, log_name: str, log_format: str, server: Callable[[], Coroutine[Any, Any, None]],
               *, exit_code: int = 2) -> None:
    """The body of a grid process's ``main``: make ``root``'s log/ and run/, send the multisite log to
    ``log/<log_name>``, run ``server()`` until it ends; a MultisiteError is logged, printed as
    ``error: ...`` and ends the process with ``exit_code``."""
    check_not_world_writable(root, "server directory")
    for sub in ("log", "run"):
        make_dir(root / sub)
    h = logging.FileHandler(create_file(root / "log" / log_name))
    h.setFormatter(logging.Formatter(log_format))
    logging.getLogger("multisite").addHandler(h)
    logging.getLogger("multisite").setLevel(logging.INFO)
    try:
        asyncio.run(server())
    except MultisiteError as e:
        logging.getLogger("multisite").error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exit_code)
