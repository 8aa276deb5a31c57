"""``multisite server stop`` against an instance served inside an application (``multisite.serve``):
the server stops, the application's process goes on (real processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import multisite
from multisite.server.process import stop_server

APP = """
import sys, time, multisite
srv = multisite.serve(sys.argv[1], listen="127.0.0.1:0")
print("served", flush=True)
sys.stdin.readline()  # the test says when to end
srv.close()
print("app ends normally", flush=True)
"""


def test_server_stop_ends_a_served_instance_without_killing_the_application(tmp_path):
    """stop_server waited for the pid in the run file to exit, then SIGKILLed it: with serve() that
    pid is the application's, which an operator's `server stop` killed 10 s later."""
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    app = subprocess.Popen([sys.executable, "-c", APP, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert app.stdout.readline().strip() == "served"
        t0 = time.monotonic()
        stop_server(root, timeout=0)
        assert time.monotonic() - t0 < 8
        assert app.poll() is None  # the application lives on
        with multisite.open(root):  # and the instance is free: its server closed it
            pass
        app.stdin.write("\n")
        app.stdin.flush()
        assert app.stdout.readline().strip() == "app ends normally"
        assert app.wait(30) == 0
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
