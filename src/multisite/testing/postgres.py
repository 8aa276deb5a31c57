"""A throwaway PostgreSQL server for tests and benches: ``initdb`` in a temp dir, a free port, trust auth.

The binaries: ``pg_ctl`` on PATH, under /usr/local/bin, or Debian's /usr/lib/postgresql/*/bin (``make
setup`` installs Debian's ``postgresql`` package when none is found; docs/decisions.md). As root the
server runs as the ``postgres`` user (``runuser``), which PostgreSQL requires.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from .ports import free_port


def pg_bindir() -> Path | None:
    cands = [shutil.which("pg_ctl"), "/usr/local/bin/pg_ctl",
             *sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)]
    for c in cands:
        if c and os.path.exists(c) and os.path.exists(Path(c).parent / "initdb"):
            return Path(c).resolve().parent
    return None


class PostgresServer:
    def __init__(self, root: Path, bindir: Path | None = None) -> None:
        self.bin = bindir or pg_bindir()
        if self.bin is None:
            raise FileNotFoundError("no PostgreSQL binaries (pg_ctl, initdb): run `make setup`")
        self.root = Path(root)
        self.data = self.root / "pgdata"
        self.port = free_port()
        self.as_user: list[str] = []
        self.uid = self.gid = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self.as_user, self.uid, self.gid = ["runuser", "-u", "postgres", "--"], pw.pw_uid, pw.pw_gid

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, tool: str, *args: object, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_user, str(self.bin / tool), *map(str, args)], check=check,
                              capture_output=True, text=True)

    def start(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.uid is not None:
            os.chown(self.root, self.uid, self.gid)
        if not self.data.exists():
            self._run("initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync")
        self._run("pg_ctl", "-D", self.data, "-l", self.data / "server.log", "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=on", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False)

    def connect(self, **kw):
        import psycopg
        return psycopg.connect(self.dsn, autocommit=True, **kw)
