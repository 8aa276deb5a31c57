"""``ProxyProcess``: the fault proxy in a child process, driven synchronously from plain tests.

It runs ``python -m multisite.testing.faultproxy``, reads the JSON line with its ports, and sends
each fault method as one JSON line on the control port. The methods have the names and arguments
of ``FaultProxy``'s; errors come back as ``ProxyCommandError``. A separate process keeps the proxy
alive across the test's own blocking calls and lets a test SIGKILL it like any other peer.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time


class ProxyCommandError(RuntimeError):
    """The proxy process refused a command (bad argument, unknown op) or could not be reached."""


class ProxyProcess:
    """A fault proxy process from ``listen_host:listen_port`` to ``target_host:target_port``.

    ``with ProxyProcess("127.0.0.1", receiver_port) as proxy:`` then point the client at
    ``proxy.port`` (or ``proxy.address``).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int | None = None,
        startup_timeout_s: float = 10.0,
        command_timeout_s: float = 10.0,
    ) -> None:
        self.target = f"{target_host}:{target_port}"
        self.listen = f"{listen_host}:{listen_port}"
        self.seed = seed
        self.startup_timeout_s = startup_timeout_s
        self.command_timeout_s = command_timeout_s
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self._control: socket.socket | None = None
        self._control_file = None
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ProxyProcess:
        cmd = [sys.executable, "-m", "multisite.testing.faultproxy", "--target", self.target, "--listen", self.listen]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        ready, _, _ = select.select([self.proc.stdout], [], [], self.startup_timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.kill()
            raise ProxyCommandError(f"fault proxy did not start within {self.startup_timeout_s} s (target {self.target})")
        self.info = json.loads(line)
        self._control = socket.create_connection(
            ("127.0.0.1", self.info["control_port"]), timeout=self.command_timeout_s
        )
        self._control_file = self._control.makefile("rwb")
        return self

    @property
    def port(self) -> int:
        return self.info["listen_port"]

    @property
    def address(self) -> str:
        """``"HOST:PORT"`` to give the client instead of the target's."""
        return self.info["listen"]

    @property
    def pid(self) -> int:
        return self.info["pid"]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the proxy to reset its connections and exit; kill it if it has not within ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._command({"op": "stop"})
            except (ProxyCommandError, OSError):
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_control()
        self.proc.stdout.close()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL the proxy: the kernel closes its sockets, as when a router process dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults (see FaultProxy for each one's meaning) -----------------------------------------

    def delay(self, delay_s: float, direction: str = "both") -> None:
        self._command({"op": "delay", "delay_s": delay_s, "direction": direction})

    def stall(self, direction: str = "both") -> None:
        self._command({"op": "stall", "direction": direction})

    def resume(self, direction: str = "both") -> None:
        self._command({"op": "resume", "direction": direction})

    def drop(self, probability: float | None = None, *, next_bytes: int | None = None, direction: str = "both") -> None:
        self._command({"op": "drop", "probability": probability, "next_bytes": next_bytes, "direction": direction})

    def bandwidth(self, bytes_per_s: float | None, direction: str = "both") -> None:
        self._command({"op": "bandwidth", "bytes_per_s": bytes_per_s, "direction": direction})

    def cut(self) -> int:
        return self._command({"op": "cut"})

    def refuse(self, refusing: bool = True) -> None:
        self._command({"op": "refuse", "refusing": refusing})

    def set_target(self, target_host: str, target_port: int) -> None:
        self._command({"op": "set_target", "target_host": target_host, "target_port": target_port})
        self.target = f"{target_host}:{target_port}"

    def heal(self) -> None:
        self._command({"op": "heal"})

    def stats(self) -> dict:
        return self._command({"op": "stats"})

    def wait_for_accepted(self, count: int, timeout_s: float = 10.0, poll_s: float = 0.02) -> dict:
        """Wait until ``count`` connections have been accepted in all (e.g. a reconnect); the stats."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if stats["connections_accepted"] >= count:
                return stats
            if time.monotonic() > deadline:
                raise TimeoutError(f"{stats['connections_accepted']} of {count} connections accepted after {timeout_s} s")
            time.sleep(poll_s)

    # -- control channel ----------------------------------------------------------------------

    def _command(self, request: dict) -> object:
        if self._control_file is None:
            raise ProxyCommandError("fault proxy is not running")
        with self._lock:
            try:
                self._control_file.write(json.dumps(request).encode() + b"\n")
                self._control_file.flush()
                line = self._control_file.readline()
            except OSError as e:
                raise ProxyCommandError(f"fault proxy control port: {e}") from e
        if not line:
            raise ProxyCommandError("fault proxy closed its control port (did it exit?)")
        reply = json.loads(line)
        if not reply["ok"]:
            raise ProxyCommandError(f"fault proxy refused {request['op']}: {reply['error']}")
        return reply["result"]

    def _close_control(self) -> None:
        for closable in (self._control_file, self._control):
            if closable is not None:
                try:
                    closable.close()
                except OSError:
                    pass
        self._control_file = self._control = None
