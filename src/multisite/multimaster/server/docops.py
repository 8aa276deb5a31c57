"""The document operations of a document server's control socket (``doc.*``): what the ``doc`` and ``db``
commands and ``multisite.documents.connect`` do to a database the server holds open.

A running server owns its databases (the instance lock), so an edit from outside goes through it: one
control request (a JSON line) per operation, run in a worker thread against the server's ``DocDB``,
its errors answered by code (``DOCUMENT_NOT_FOUND``, ``DOCUMENT_MALFORMED``, ...) and raised again as
their class by the caller. Documents travel as ``Doc.public()`` (what the CLI prints) or, when the
request asks ``full``, as ``Doc.to_value()``: every part of the version, which the client checks with
``Doc.from_value`` and turns back into the ``Doc`` that ``DocDB`` returns. Field values are JSON values
on this channel.
"""

from __future__ import annotations

from typing import Any, Callable

from ..document import Doc
from .docdb import DocDB


def _doc(d: Doc | None, args: dict) -> Any:
    if d is None:
        return None
    return d.to_value() if args.get("full") else d.public()


def _create_many(db: DocDB, a: dict) -> list[str]:
    form = a.get("form")  # one form for all (``docs``: fields), or each its own (``docs``: [form, fields])
    return db.create_many([(form, f) for f in a["docs"]] if form is not None else [(f, x) for f, x in a["docs"]])


def _list(db: DocDB, a: dict) -> list:
    return [_doc(d, a) for d in db.documents(include_deleted=a.get("include_deleted", True))]


def _set_access(db: DocDB, a: dict) -> dict:
    db.set_access(a["server"], a["access"])
    return db.acl()


def _define_form(db: DocDB, a: dict) -> dict:
    db.define_form(a["name"], merge=bool(a["merge"]))
    return db.forms()


OPS: dict[str, Callable[[DocDB, dict], Any]] = {
    "doc.create": lambda db, a: db.create(a["form"], a["fields"]),
    "doc.create_many": _create_many,
    "doc.update": lambda db, a: _doc(db.update(a["unid"], a["fields"]), a),
    "doc.update_many": lambda db, a: [_doc(d, a) for d in db.update_many([(u, f) for u, f in a["changes"]])],
    "doc.delete": lambda db, a: _doc(db.delete(a["unid"]), a),
    "doc.merge_conflicts": lambda db, a: _doc(db.merge_conflicts(a["unid"]), a),
    "doc.get": lambda db, a: _doc(db.get(a["unid"], include_deleted=a.get("include_deleted", True)), a),
    "doc.list": _list,
    "doc.count": lambda db, a: db.count(),
    "doc.info": lambda db, a: db.info(),
    "doc.acl": lambda db, a: db.acl(),
    "doc.set_access": _set_access,
    "doc.forms": lambda db, a: db.forms(),
    "doc.define_form": _define_form,
}


def run(db: DocDB, op: str, args: dict) -> Any:
    """``op`` (one of ``OPS``) on ``db`` with the request's ``args``; blocking (database work)."""
    return OPS[op](db, args)
