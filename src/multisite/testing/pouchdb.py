"""Real PouchDB in Node for the CouchDB endpoints' tests, bench and demo.

``node_modules()`` installs the pinned packages (``PACKAGES``) once into a cache it keeps
(``$MULTISITE_POUCHDB_CACHE``, default ``~/.cache/multisite-pouchdb/<hash of the pins>``) with
``npm install --prefix``, and returns its ``node_modules``; ``PouchUnavailable`` says why when Node or
npm is missing or the registry cannot be reached (a test skips with that reason). ``Pouch`` drives
``tests/integration/pouch/driver.js``: one Node process holding PouchDB databases, a JSON command per
line on its stdin, a JSON answer per line on its stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Self

PACKAGES = ("pouchdb@9.0.0", "pouchdb-adapter-memory@9.0.0", "express-pouchdb@4.2.0", "express@4.21.2")
INSTALL_TIMEOUT_S = 600.0
ANSWER_TIMEOUT_S = 300.0
ROOT = Path(__file__).resolve().parents[3]
DRIVER = ROOT / "tests" / "integration" / "pouch" / "driver.js"
_install_lock = threading.Lock()


class PouchUnavailable(RuntimeError):
    """Node, npm or the npm registry is not there: the reason, for a skip."""


def cache_dir() -> Path:
    key = hashlib.sha256(" ".join(PACKAGES).encode()).hexdigest()[:12]
    base = os.environ.get("MULTISITE_POUCHDB_CACHE") or str(Path.home() / ".cache" / "multisite-pouchdb")
    return Path(base) / key


def node_modules() -> Path:
    """The ``node_modules`` holding ``PACKAGES`` (installed the first time)."""
    if not shutil.which("node") or not shutil.which("npm"):
        raise PouchUnavailable("node and npm are not installed (make setup installs Debian's nodejs and npm)")
    d = cache_dir()
    done = d / ".installed"
    with _install_lock:
        if done.exists():
            return d / "node_modules"
        d.mkdir(parents=True, exist_ok=True)
        try:
            out = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(d), *PACKAGES],
                                 check=False, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PouchUnavailable(f"npm install {' '.join(PACKAGES)} took over {INSTALL_TIMEOUT_S:.0f} s") from None
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
            if any(w in (out.stderr or "") for w in ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ENETUNREACH")):
                raise PouchUnavailable(f"npm cannot reach its registry: {' / '.join(tail)}")
            raise RuntimeError(f"npm install {' '.join(PACKAGES)} failed: {' / '.join(tail)}")
        done.write_text(" ".join(PACKAGES))
        return d / "node_modules"


def node_env() -> dict[str, str]:
    return {**os.environ, "NODE_PATH": str(node_modules())}


class Pouch:
    """A Node process holding PouchDB databases under ``workdir``, driven one command at a time."""

    def __init__(self, workdir: Path | str):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "node.log", "a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(["node", str(DRIVER), str(self.workdir)], env=node_env(), text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.n = 0

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._lines.append("")
            self._cond.notify_all()

    def __call__(self, op: str, timeout: float = ANSWER_TIMEOUT_S, **args: Any) -> Any:
        """Run ``op`` in Node; its result, or RuntimeError with the error it threw."""
        self.n += 1
        self.proc.stdin.write(json.dumps({**args, "rid": self.n, "op": op}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        with self._cond:
            while True:
                for k, line in enumerate(self._lines):
                    if line == "":
                        raise RuntimeError(f"the PouchDB driver exited (see {self.workdir / 'node.log'})")
                    msg = json.loads(line)
                    if msg.get("rid") == self.n:
                        del self._lines[k]
                        if "error" in msg:
                            raise RuntimeError(f"PouchDB {op}: {msg['error']}")
                        return msg.get("result")
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"PouchDB {op} gave no answer within {timeout:.0f} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self("exit", timeout=10)
            except (RuntimeError, TimeoutError, OSError):
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
