"""Which CPUs an instance server runs on (``multisite server start --cpus``).

Under CPython's GIL one thread of a process runs Python at a time, and on a VM waking a thread on
another CPU costs about four times waking it on the same one (``bench/commit.py``, thread wake-up
round trip). Group commit is made of such wake-ups, so a busy server commits more on one CPU.
"""

from __future__ import annotations

import os

from ..errors import ConfigError


def parse_cpus(text: str) -> set[int]:
    """``"0"``, ``"0,2"``, ``"0-3"`` -> CPU numbers; ConfigError naming what is wrong, or which CPUs
    this process may use, when the text is malformed or names a CPU it may not run on."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"--cpus {text!r}: give CPU numbers and ranges, e.g. 0 or 0,2 or 0-1") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ConfigError(f"--cpus {text!r}: CPUs {sorted(cpus - allowed) or text} are not available to this "
                          f"process; it may run on {', '.join(map(str, sorted(allowed)))}")
    return cpus
