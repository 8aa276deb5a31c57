"""``multisite.documents``: document databases (multi-master replication), the public entry points.

    import multisite.documents as documents
    db = documents.create("/data/a", title="Profiles")
    unid = db.create("Person", {"name": "Ada"})

    db = documents.connect("/data/a")   # while a document server serves it: edits go through the server
"""

from .multimaster.server.docclient import RemoteDocDB, connect  # noqa: F401
from .multimaster.server.docdb import DocDB, create, open, read_identity  # noqa: F401,A004
from .multimaster.document import Doc  # noqa: F401

__all__ = ["DocDB", "Doc", "RemoteDocDB", "connect", "create", "open", "read_identity"]
