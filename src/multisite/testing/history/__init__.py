"""A history checker for real clients (issue 28), in the manner of Jepsen's Elle: clients record each
call's invocation and outcome (``recorder.Recorder``); after a fault round, ``checker.check`` compares
the history with the final state and the logs read from the instances, and names lost writes, phantom
writes, duplicates and stale reads after a client's own write (``model.py`` says what each means)."""

from .checker import check
from .model import (DUPLICATE, FAIL, LOST, OK, PHANTOM, READ, STALE_READ, UNKNOWN, WRITE, Anomaly, Op,
                    Report)
from .recorder import Recorder

__all__ = ["check", "Recorder", "Op", "Anomaly", "Report", "OK", "FAIL", "UNKNOWN", "WRITE", "READ", "LOST",
           "PHANTOM", "DUPLICATE", "STALE_READ"]
