"""CouchDB's error answers, as one branch of multisite's exception tree: ``CouchError`` carries the
HTTP status and CouchDB's body (``{"error", "reason"}``). Its own module so that every sans-IO
``couch*.py`` module can raise it without importing another. Pure."""

from __future__ import annotations

from ..errors import DocumentError


class CouchError(DocumentError):
    """A request CouchDB would refuse, with CouchDB's status and error body (``{"error", "reason"}``)."""

    code = "COUCH"

    def __init__(self, status: int, error: str, reason: str):
        super().__init__(f"{status} {error}: {reason}")
        self.status, self.error, self.reason = status, error, reason

    def body(self) -> dict:
        return {"error": self.error, "reason": self.reason}


def bad_request(reason: str) -> CouchError:
    return CouchError(400, "bad_request", reason)
