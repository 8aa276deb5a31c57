"""What the CouchDB endpoints (``couch_http.py``, ``couch_feed.py``, ``couch_docs.py``) share: JSON by
msgspec, query parameters, request bodies within ``MAX_REQUEST_BYTES`` (413 past it, 400 for JSON that
does not parse: CouchDB's errors)."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from .. import couch, couch_atts
from ..couch import CouchError, Leaf, Tree

MAX_REQUEST_BYTES = 64 * 1024 * 1024
encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode
JSON = "application/json"
#: The status of an error a per-document result names (``_bulk_docs`` answers 201 with the errors in it;
#: a single document's write answers with its error's status).
ERROR_STATUS = {"conflict": 409, "forbidden": 403, "bad_content_type": 415, "missing_stub": 412,
                "attachment_too_large": 413, "document_too_large": 413}


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=encode(obj), status=status, content_type=JSON, headers=headers)


def flag(q: Any, name: str) -> bool:
    return q.get(name, "false").lower() == "true"


def int_param(q: Any, name: str, default: int, lo: int = 0, hi: int = 2**62) -> int:
    v = q.get(name)
    if v is None:
        return default
    try:
        return max(lo, min(hi, int(v)))
    except ValueError:
        raise couch.bad_request(f"Invalid value for {name}: {v!r:.40}") from None


def qjson(q: Any, name: str) -> Any:
    v = q.get(name)
    if v is None:
        return None
    try:
        return decode(v)
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise couch.bad_request(f"Invalid JSON in {name}") from None
    except RecursionError:
        raise couch.bad_request(f"JSON in {name} is nested too deep") from None


async def read_body(request: web.Request) -> Any:
    """The request's JSON body (None when empty)."""
    if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
        raise CouchError(413, "too_large", f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
    data = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise CouchError(413, "too_large", f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
    if not data:
        return None
    try:
        return decode(bytes(data))
    except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec: a string that is not UTF-8
        raise CouchError(400, "bad_request", "invalid UTF-8 JSON") from None
    except RecursionError:  # msgspec: arrays or objects nested past its depth
        raise CouchError(400, "bad_request", "the JSON body is nested too deep") from None


def conflicts_extra(tree: Tree, want: bool) -> dict | None:
    if not want:
        return None
    c = tree.conflicts()
    return {"_conflicts": c} if c else None


def atts_for(q: Any, lf: Leaf) -> int | None:
    """How a read sends leaf ``lf``'s attachments: None (stubs), or the position after which their data
    goes with it (``attachments=true``: 0, every one; ``atts_since``: after the newest given on its line)."""
    since = qjson(q, "atts_since")
    if since is not None:
        return couch_atts.since_pos(since, lf.seq, lf.path)
    return 0 if flag(q, "attachments") else None
