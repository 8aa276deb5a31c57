"""A real Mosquitto broker for tests and the demo: started on a free port of 127.0.0.1 in a folder of
its own (config, persistence, log), stopped by its pid."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .ports import free_port


class Broker:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("mosquitto") is not None or Path("/usr/sbin/mosquitto").exists()

    def start(self) -> "Broker":
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        conf = self.folder / "mosquitto.conf"
        # ``user``: run as whoever runs the tests (as root, mosquitto would switch to its own user, who
        # cannot write the persistence file into a test's folder).
        conf.write_text(f"user {getpass.getuser()}\nlistener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                        f"persistence_location {self.folder}/\nmax_queued_messages 0\nmax_queued_bytes 0\n"
                        f"log_dest file {self.folder}/mosquitto.log\n")
        self.proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.proc.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not listen within 10 s")

    def address(self, topic: str) -> str:
        return f"mqtt://127.0.0.1:{self.port}/{topic}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None
