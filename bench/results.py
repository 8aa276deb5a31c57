"""What the benchmark scripts share: the git state they ran on, and their own section of RESULTS.md.

Each script owns a section between ``<!-- bench/NAME.py: begin -->`` and ``... end -->`` and
replaces only that, reading the file just before writing (others edit theirs).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


def markers(script: str) -> tuple[str, str]:
    return f"<!-- bench/{script}: begin -->", f"<!-- bench/{script}: end -->"


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=HERE.parent,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes under src/)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_section(script: str, text: str) -> None:
    """Replace ``script``'s section of RESULTS.md with ``text`` (which starts and ends with its markers)."""
    begin, end = markers(script)
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + text + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/PID/stat``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def boost_session(pid: int) -> bool:
    """Give the session of process ``pid`` (its scheduler autogroup) this process's niceness, when that
    is below 0 (``nice -n -15 .venv/bin/python bench/...``, as root). With ``sched_autogroup`` on (the
    default), nice orders processes only within a session, and sessions share the CPUs as equals: a
    server started in a session of its own (``multisite server start``, ``pg_ctl``) ran at the
    priority of every other engineer's session whatever the bench's nice, its clients at theirs
    (issue 27 found it: a server process committed at half the rate of the same server in the bench's
    process). Every server of a run gets the same, PostgreSQL's too. True if it was set."""
    import os

    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= 0:
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:  # no autogroups, or not allowed: the bench runs as before
        return False
    return True
