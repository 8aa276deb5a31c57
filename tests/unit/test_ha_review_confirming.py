"""Review of issue 25: ``InstanceServer.confirming`` is read from the client listener's thread
(``_confirm_why``, every 50 ms while commits wait for --min-confirm) while the server's loop starts and
stops sources (at each promotion and fence); iterating the dict there raised "dictionary changed size
during iteration", which ended the listener's expiry timer for good: waiting commits were never
answered MIN_CONFIRM_TIMEOUT again."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

from multisite.server.instance import InstanceServer


def test_ha_review_confirming_from_another_thread_while_sources_change():
    srv = InstanceServer.__new__(InstanceServer)  # only its sources: what confirming() reads
    srv.sources = {f"S{i}": SimpleNamespace(state="streaming", last_confirmed=i) for i in range(3)}
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            srv.sources[f"X{i % 7}"] = SimpleNamespace(state="streaming", last_confirmed=1)
            srv.sources.pop(f"X{(i + 3) % 7}", None)
            i += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=churn)
    t.start()
    errors = []
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                srv.confirming()
            except RuntimeError as e:
                errors.append(str(e))
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert errors == []
