"""``multisite.documents.connect(DIR_OR_HOME)``: a document database that a running document server holds
open, read and edited through that server (as ``multisite.connect`` is for an instance server).

A served database cannot be opened by another process (the instance lock), so ``documents.open(DIR)``
fails with INSTANCE_LOCKED while its server runs. ``connect`` finds the server from the database
directory (the server records its home in ``DIR/run/served_by.json`` while it runs) or is given the
server's home; ``RemoteDocDB`` then has ``DocDB``'s document methods (create, update, delete, get,
documents, count, info, ACL, forms), each one request on the server's control socket (``docops.py``).
Errors come back as their own classes (DocumentNotFound, MalformedDocument, ...).

The control socket is a Unix socket: this works on the server's machine, as the ``doc`` commands do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from ...errors import ConfigError, ServerError
from ..document import Doc
from .docdb_files import IDENTITY_FILE, SERVED_BY_FILE, served_by
from .process import call

# A read of every document (``documents``) is one reply; the server writes it as one JSON line.
LIST_TIMEOUT_S = 60.0


def connect(dir_or_home: str | os.PathLike, db: str | None = None) -> "RemoteDocDB":
    """The database at ``dir_or_home`` through the document server that serves it; or, given a server's
    home, its database ``db`` (a title, replica ID or directory; may be left out when it serves one).
    ServerError, saying what to do, when no running server serves it."""
    where = Path(dir_or_home).absolute()
    if (where / IDENTITY_FILE).exists():  # a database directory: its server is the one it records
        if db is not None:
            raise ConfigError(f"{where} is a database directory; db= picks a database of a server's home")
        rec = served_by(where)
        if rec is None:
            raise ServerError(f"no document server serves {where} (no run/served_by.json): open it with "
                              f"multisite.documents.open('{where}'), or start a server with `multisite docserver "
                              f"start {where} --name NAME --listen HOST:PORT`")
        try:
            return _attach(Path(rec["home"]), str(where))
        except ServerError:
            raise ServerError(f"the document server {rec['name']} of {rec['home']} (recorded in "
                              f"{where / 'run' / SERVED_BY_FILE}) is not running: it was killed or crashed; start "
                              f"it again, or open the database with multisite.documents.open('{where}')") from None
    if not where.is_dir():
        raise ConfigError(f"{where} is neither a document database directory nor a document server's home")
    return _attach(where, db)


def _attach(home: Path, db: str | None) -> "RemoteDocDB":
    st = call(home, "status")  # ServerError: none runs for ``home``
    dbs = st["databases"]
    if db is None:
        if len(dbs) != 1:
            raise ConfigError(f"the document server {st['name']} ({home}) serves {len(dbs)} databases "
                              f"({', '.join(sorted(d['title'] for d in dbs))}): name one (db=TITLE)")
        return RemoteDocDB(home, st["name"], dbs[0])
    found = [d for d in dbs if db in (d["title"], d["replica_id"], d["path"], Path(d["path"]).name)
             or Path(db).absolute() == Path(d["path"])]
    if not found:
        served = ", ".join(f"{d['title']} ({d['path']})" for d in dbs)
        raise ConfigError(f"the document server {st['name']} ({home}) serves no database {db!r}; it serves {served}")
    return RemoteDocDB(home, st["name"], found[0])


class RemoteDocDB:
    """A served document database, through its server's control socket: ``DocDB``'s document methods."""

    def __init__(self, home: Path, server: str, served: dict):
        self.home, self.server = home, server
        self.path = Path(served["path"])
        self.title: str = served["title"]
        self.replica_id: str = served["replica_id"]
        self.db_id: str = served["db_id"]

    def _call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        kw = {} if timeout is None else {"timeout": timeout}
        return call(self.home, op, db=self.replica_id, **kw, **args)

    # -- identity, ACL, forms ------------------------------------------------------------------------
    @property
    def changeno(self) -> int:
        return self.info()["changeno"]

    def info(self) -> dict:
        return self._call("doc.info")

    def acl(self) -> dict[str, str]:
        return self._call("doc.acl")

    def set_access(self, server: str, access: str) -> None:
        self._call("doc.set_access", server=server, access=access)

    def forms(self) -> dict[str, dict]:
        return self._call("doc.forms")

    def define_form(self, name: str, *, merge: bool) -> None:
        self._call("doc.define_form", name=name, merge=merge)

    # -- documents -----------------------------------------------------------------------------------
    def create(self, form: str, fields: dict[str, Any]) -> str:
        """A new document; its UNID."""
        return self._call("doc.create", form=form, fields=fields)

    def create_many(self, docs: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
        """New documents, in one transaction; their UNIDs."""
        return self._call("doc.create_many", docs=[[form, fields] for form, fields in docs])

    def update(self, unid: str, fields: dict[str, Any]) -> Doc:
        return Doc.from_value(self._call("doc.update", unid=unid, fields=fields, full=True))

    def update_many(self, changes: Iterable[tuple[str, dict[str, Any]]]) -> list[Doc]:
        return [Doc.from_value(v) for v in self._call("doc.update_many", changes=[[u, f] for u, f in changes],
                                                     full=True)]

    def delete(self, unid: str) -> Doc:
        return Doc.from_value(self._call("doc.delete", unid=unid, full=True))

    def merge_conflicts(self, unid: str) -> Doc | None:
        """``DocDB.merge_conflicts`` on the served database: the merged version, or None."""
        v = self._call("doc.merge_conflicts", unid=unid, full=True)
        return None if v is None else Doc.from_value(v)

    def get(self, unid: str, *, include_deleted: bool = False) -> Doc | None:
        v = self._call("doc.get", unid=unid, include_deleted=include_deleted, full=True)
        return None if v is None else Doc.from_value(v)

    def documents(self, *, include_deleted: bool = False) -> Iterator[Doc]:
        """Every document in UNID order (read in one request)."""
        values = self._call("doc.list", LIST_TIMEOUT_S, include_deleted=include_deleted, full=True)
        return iter([Doc.from_value(v) for v in values])

    def count(self) -> int:
        return self._call("doc.count")

    # -- as DocDB, so that code written for one works with the other -----------------------------------
    def close(self) -> None:
        """Nothing to release (each call is its own connection)."""

    def __enter__(self) -> "RemoteDocDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteDocDB {self.title!r} replica {self.replica_id} via document server {self.server} ({self.home})>"
