"""A real S3-compatible server for tests, the bench and the demo cluster: ``moto``'s server mode in a
process of its own, on a free port of 127.0.0.1 (the port is chosen by the server: port 0), stopped by
its pid. ``env()`` is what a client (``pipeline.archive``, Spark executors) needs to reach it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

_SERVE = """
import sys, time
from moto.server import ThreadedMotoServer
s = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
s.start()
port = s.get_host_and_port()[1]
print(port, flush=True)
for line in sys.stdin:  # until the owner's end of the pipe closes: stop() or the owner's death, even by SIGKILL
    if line.strip() == "down" and s is not None:
        s.stop()  # the port closes; the stored buckets stay in this process
        s = None
    elif line.strip() == "up" and s is None:
        s = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        s.start()
    print("ok", flush=True)
if s is not None:
    s.stop()
"""


class S3Server:
    def __init__(self):
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        try:
            import moto.server  # noqa: F401
        except ImportError:
            return False
        return True

    def start(self, timeout_s: float = 60) -> "S3Server":
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout_s
        line = self.proc.stdout.readline()
        if not line.strip().isdigit() or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"the moto S3 server did not start (said {line!r})")
        self.port = int(line)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

    def export_env(self) -> None:
        os.environ.update(self.env())

    def make_bucket(self, name: str) -> str:
        from pyarrow import fs

        env = self.env()
        s3 = fs.S3FileSystem(endpoint_override=f"127.0.0.1:{self.port}", scheme="http", region=env["AWS_REGION"],
                             access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                             allow_bucket_creation=True)
        s3.create_dir(name)
        return f"s3://{name}"

    def _command(self, word: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":
            raise RuntimeError(f"the moto S3 server did not answer {word!r}")

    def down(self) -> None:
        """Stop serving (the port is closed: clients see connection errors); what it stores is kept."""
        self._command("down")

    def up(self) -> None:
        """Serve again on the same port, with what it stored before ``down``."""
        self._command("up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self.proc is not None and self.proc.stdin:
            self.proc.stdin.close()


@contextlib.contextmanager
def running_s3(bucket: str = "lake"):
    """An ``S3Server`` with ``bucket`` made and its endpoint and keys in ``os.environ`` (restored and the
    server stopped on exit): what tests and benches that archive to S3 need."""
    server = S3Server().start()
    saved = dict(os.environ)
    try:
        server.export_env()
        server.make_bucket(bucket)
        yield server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()
