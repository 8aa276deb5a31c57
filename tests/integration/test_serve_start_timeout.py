"""``multisite.serve`` giving up on a slow start leaves no server running behind the caller's back."""

from __future__ import annotations

import threading
import time

import pytest

import multisite
from multisite.errors import ServerError
from multisite.server import serve as serve_mod


def test_a_serve_that_times_out_stops_the_server_once_it_is_up(tmp_path, monkeypatch):
    """serve() raised ServerError after START_TIMEOUT_S but its thread went on starting the server,
    which then served the instance for the rest of the process: its port open, the instance locked
    (a retry of serve() failed with InstanceLocked), and nothing left to close it with."""
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    monkeypatch.setattr(serve_mod, "START_TIMEOUT_S", 0.0)  # recovery "took longer" than the bound
    with pytest.raises(ServerError, match="did not start within"):
        multisite.serve(root, listen="127.0.0.1:0")
    log = root / "log" / "server.log"
    deadline = time.monotonic() + 30
    while "client protocol listening" not in log.read_text():  # it does come up, late
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while [t for t in threading.enumerate() if t.name.startswith("multisite-serve-")]:
        assert time.monotonic() < deadline, "the abandoned server still runs"
        time.sleep(0.05)
    with multisite.open(root):  # and the instance is free
        pass
