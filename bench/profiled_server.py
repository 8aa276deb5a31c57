"""An instance server under cProfile, one profile per thread (for bench/secondary.py --profile).

    python bench/profiled_server.py OUTDIR INSTANCE_DIR [server options]

cProfile sees only the thread it was enabled in, and the Update Process is a thread of its own:
every thread started here runs under a profiler of its own, written to OUTDIR/THREADNAME.prof
when the thread ends, and the main thread's (the event loop: receiver, client listener) to
OUTDIR/main.prof when the server exits (``multisite server stop``).
"""

from __future__ import annotations

import cProfile
import sys
import threading
from pathlib import Path

out = Path(sys.argv[1])
_run = threading.Thread.run


def _profiled_run(self) -> None:
    prof = cProfile.Profile()
    prof.enable()
    try:
        _run(self)
    finally:
        prof.disable()
        prof.dump_stats(out / f"{self.name.replace('/', '_')}-{threading.get_ident()}.prof")


threading.Thread.run = _profiled_run

from multisite.server.instance import main  # noqa: E402  (after the patch: the server's threads are profiled)

prof = cProfile.Profile()
prof.enable()
try:
    main(sys.argv[2:])
finally:
    prof.disable()
    prof.dump_stats(out / "main.prof")
