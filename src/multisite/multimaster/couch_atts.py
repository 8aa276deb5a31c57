"""Attachments (``_attachments``) of CouchDB documents as fields of multisite documents. Pure.

**The mapping.** Each attachment is one field of the document, ``$File/<name>`` (Domino keeps a
note's attachments as ``$FILE`` items), holding ``{"content_type", "digest", "length", "revpos",
"data"}``: ``data`` is the content in base64 (as CouchDB's JSON carries it, so a read with
``attachments=true`` copies it out and the document server's control socket, which speaks JSON, shows
it), ``digest`` is CouchDB's ``md5-<base64 of the MD5>``, ``revpos`` the revision position at which the
attachment was last changed. Being fields, attachments replicate between multisite servers as any
field does, go with the losing version into its conflict document, end with a deletion, and merge
per attachment where a form merges conflicts (two sites that changed different attachments).

**In** (``incoming``): inline data (``{"content_type", "data"}``) is checked (base64) and measured
here, its digest computed here (a client's digest is not trusted); a stub (``{"stub": true}``) names
an attachment the server already has: ``resolve`` takes it from the version being edited (the
``_rev`` of a client's edit: never another conflicting version, as CouchDB) or, for a replicator's
revision, from any version of the document with the same digest; 412 ``missing_stub`` when there is
none. Attachments that follow in a multipart body are refused (415): PouchDB sends
them inline. At most ``MAX_ATTACHMENTS_BYTES`` a version (their base64 then fits in a document).

**Out** (``render``): stubs with ``length`` and ``stub: true``, or, from ``attachments=true`` and
``atts_since``, the data of those changed after the position given (``since_pos``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from typing import Any

from .couch_errors import CouchError, bad_request

ATT_PREFIX = "$File/"
MAX_ATTACHMENTS_BYTES = 6_000_000  # the content of one version's attachments (base64: 8 MB, a document)
MAX_ATT_NAME_BYTES = 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"
STUB = "stub"


def field_name(name: str) -> str:
    return ATT_PREFIX + name


def digest_of(raw: bytes) -> str:
    return "md5-" + base64.b64encode(hashlib.md5(raw, usedforsecurity=False).digest()).decode()


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_ATT_NAME_BYTES:
        raise bad_request(f"an attachment's name is a non-empty string of at most {MAX_ATT_NAME_BYTES} bytes")
    if name.startswith("_"):
        raise bad_request(f"Attachment name '{name:.80}' starts with prohibited character '_'")
    return name


def stored(content_type: Any, raw: bytes, revpos: int) -> dict:
    """The field value of an attachment with content ``raw``."""
    if not isinstance(content_type, str) or not content_type:
        content_type = DEFAULT_CONTENT_TYPE
    return {"content_type": content_type, "digest": digest_of(raw), "length": len(raw), "revpos": revpos,
            "data": base64.b64encode(raw).decode()}


def incoming(atts: Any, seq: int, *, keep_revpos: bool) -> dict[str, dict]:
    """The fields of a body's ``_attachments`` for a version at position ``seq`` (stubs stay stubs
    until ``resolve``); ``keep_revpos``: a replicator's revision keeps the ``revpos`` it carries."""
    if atts is None:
        return {}
    if not isinstance(atts, dict):
        raise bad_request("_attachments must be a JSON object of attachment names to attachments")
    out: dict[str, dict] = {}
    total = 0
    for name, a in atts.items():
        check_name(name)
        if not isinstance(a, dict):
            raise bad_request(f"attachment {name!r:.80} must be a JSON object")
        if a.get("follows"):
            raise CouchError(415, "bad_content_type", f"attachment {name!r:.80} follows in a multipart body: "
                             f"multisite takes attachments inline only (\"data\": base64)")
        rp = a.get("revpos")
        revpos = rp if keep_revpos and isinstance(rp, int) and not isinstance(rp, bool) and 1 <= rp <= seq else seq
        if a.get("stub") is True:
            digest = a.get("digest")
            out[field_name(name)] = {STUB: True, "digest": digest if isinstance(digest, str) else None}
            continue
        data = a.get("data")
        if not isinstance(data, str):
            raise bad_request(f"attachment {name!r:.80} needs \"data\" (base64) or \"stub\": true")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"attachment {name!r:.80} data is not valid base64") from None
        total += len(raw)
        if total > MAX_ATTACHMENTS_BYTES:
            raise CouchError(413, "attachment_too_large", f"the attachments of one version hold more than "
                             f"{MAX_ATTACHMENTS_BYTES} bytes (at {name!r:.80})")
        out[field_name(name)] = stored(a.get("content_type"), raw, revpos)
    return out


_SHAPE = (("content_type", str), ("digest", str), ("length", int), ("revpos", int), ("data", str))


def is_attachment(v: Any) -> bool:
    """Whether a ``$File/<name>`` field's value has an attachment's shape. The name is an ordinary field
    name to multisite's own API and replicas, so a document may hold another value there: it is not
    shown as an attachment (rather than a KeyError on every read of the document)."""
    return isinstance(v, dict) and all(isinstance(v.get(k), t) for k, t in _SHAPE)


def check_total(fields: dict) -> None:
    """413 when the attachments of one version (inline ones and those stubs kept) hold more than
    ``MAX_ATTACHMENTS_BYTES``: each edit may add one beside stubs, so the bound is the version's."""
    total = sum(v["length"] for k, v in fields.items() if k.startswith(ATT_PREFIX) and is_attachment(v))
    if total > MAX_ATTACHMENTS_BYTES:
        raise CouchError(413, "attachment_too_large", f"the attachments of one version would hold {total} bytes, "
                         f"more than {MAX_ATTACHMENTS_BYTES}")


def has_stubs(fields: dict) -> bool:
    return any(k.startswith(ATT_PREFIX) and v.get(STUB) is True for k, v in fields.items() if isinstance(v, dict))


def resolve(fields: dict, doc_id: str, sources: Iterable[dict]) -> dict:
    """``fields`` with each stub replaced by the stored attachment it names: the first of ``sources``
    (fields of versions, the one edited first) with that name and, when the stub gives one, digest."""
    if not has_stubs(fields):
        return fields
    sources = [s for s in sources if s]
    out = dict(fields)
    for k, v in fields.items():
        if not (k.startswith(ATT_PREFIX) and isinstance(v, dict) and v.get(STUB) is True):
            continue
        found = next((s[k] for s in sources if is_attachment(s.get(k)) and v["digest"] in (None, s[k]["digest"])),
                     None)
        if found is None:
            raise CouchError(412, "missing_stub", f"Invalid attachment stub in {doc_id!r:.80} for "
                             f"{k[len(ATT_PREFIX):]!r:.80}: no stored attachment has that name and digest")
        out[k] = found
    check_total(out)
    return out


def render(fields: dict, since: int | None) -> dict | None:
    """``_attachments`` of a version: stubs, with data for those whose ``revpos`` is past ``since``
    (None: stubs only; 0: every one's data). None when it has none."""
    out = {}
    for k, v in fields.items():
        if not k.startswith(ATT_PREFIX) or not is_attachment(v):
            continue
        if since is not None and v["revpos"] > since:
            out[k[len(ATT_PREFIX):]] = {"content_type": v["content_type"], "digest": v["digest"],
                                        "revpos": v["revpos"], "data": v["data"]}
        else:
            out[k[len(ATT_PREFIX):]] = {"content_type": v["content_type"], "digest": v["digest"],
                                        "length": v["length"], "revpos": v["revpos"], "stub": True}
    return out or None


def since_pos(atts_since: Any, seq: int, path: tuple[str, ...] | list[str]) -> int:
    """The position of the newest of ``atts_since`` (revisions a client has) on the line ``path`` of a
    version at ``seq``: attachments changed after it are sent with data (0: all of them)."""
    if not isinstance(atts_since, list):
        raise bad_request("atts_since must be a JSON list of revisions")
    best = 0
    for rev in atts_since:
        if not isinstance(rev, str):
            raise bad_request("atts_since must be a JSON list of revisions")
        pos, _, h = rev.partition("-")
        if pos.isascii() and pos.isdigit() and len(pos) <= 10 and 0 <= seq - int(pos) < len(path) and path[seq - int(pos)] == h:
            best = max(best, int(pos))
    return best


def content(fields: dict, name: str) -> tuple[str, bytes, str] | None:
    """``(content_type, bytes, digest)`` of attachment ``name``, None if the version has none by it."""
    v = fields.get(field_name(name))
    if not is_attachment(v):
        return None
    try:
        return v["content_type"], base64.b64decode(v["data"], validate=True), v["digest"]
    except (binascii.Error, ValueError):
        return None
