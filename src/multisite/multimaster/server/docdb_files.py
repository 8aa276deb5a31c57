"""The files beside a document database's instance: its identity and the server that serves it.

``docdb.json`` repeats the database's identity (``replica_id``, ``db_id``, ``title``, also in its meta
region), so that ``--replica-of DIR`` and the CLI read it while a server holds the instance locked.
``run/served_by.json`` names the document server holding the database open, so that the ``doc`` and
``db`` commands (and ``multisite.documents.connect``) go through that server instead of failing on
the lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import InstanceLocked, NotADocumentDatabase
from ...fsutil import atomic_write

IDENTITY_FILE = "docdb.json"
SERVED_BY_FILE = "served_by.json"  # in the database's run/: the home of the document server holding it open


def write_identity(path: str | os.PathLike, replica_id: str, db_id: str, title: str) -> None:
    """Write ``docdb.json`` (crash-safe): the identity ``read_identity`` reads back."""
    atomic_write(Path(path) / IDENTITY_FILE,
                 json.dumps({"replica_id": replica_id, "db_id": db_id, "title": title}).encode())


def read_identity(path: str | os.PathLike) -> dict:
    """``{"replica_id", "db_id", "title"}`` of the document database at ``path`` (no lock needed)."""
    p = Path(path) / IDENTITY_FILE
    try:
        ident = json.loads(p.read_text())
        return {k: ident[k] for k in ("replica_id", "db_id", "title")}
    except FileNotFoundError:
        raise NotADocumentDatabase(f"{path} is not a document database (no {IDENTITY_FILE}); make one with "
                                   f"`multisite db create {path} --title T`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise NotADocumentDatabase(f"{p} is damaged ({e}); the identity is also in the database's meta region")


def served_by(path: str | os.PathLike) -> dict | None:
    """``{"home", "name", "pid"}`` of the document server that serves the database at ``path``, as it
    recorded when it started (None: none did, or it stopped). A server that was killed leaves its
    record behind: whoever reads it checks that the server answers."""
    try:
        rec = json.loads((Path(path) / "run" / SERVED_BY_FILE).read_text())
        return {k: rec[k] for k in ("home", "name", "pid")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_served_by(path: str | os.PathLike, home: str | os.PathLike, name: str) -> None:
    """The document server of ``home`` (this process) serves the database at ``path``."""
    atomic_write(Path(path) / "run" / SERVED_BY_FILE,
                 json.dumps({"home": str(Path(home).absolute()), "name": name, "pid": os.getpid()}).encode())


def clear_served_by(path: str | os.PathLike, home: str | os.PathLike) -> None:
    """The document server of ``home`` stops serving ``path`` (a record naming another home is left)."""
    rec = served_by(path)
    if rec is not None and rec["home"] == str(Path(home).absolute()):
        (Path(path) / "run" / SERVED_BY_FILE).unlink(missing_ok=True)


def held_by_server(path: Path, e: InstanceLocked) -> InstanceLocked:
    """The lock's error, naming the document server that holds the database when one recorded it."""
    rec = served_by(path)
    if rec is None or rec["pid"] != e.details.get("pid"):
        return e
    return InstanceLocked(f"{path} is held open by the document server {rec['name']} (home {rec['home']}, pid "
                          f"{rec['pid']}): edit it through that server with multisite.documents.connect('{path}'); "
                          f"the doc and db commands go through it by themselves", pid=rec["pid"])
