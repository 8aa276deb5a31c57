"""What the CouchDB endpoints keep in a document database beyond its documents, and the one write
they make that no replica makes: ``_local`` documents (replication checkpoints, in ``meta`` under
``("couch_local", id)``, not replicated), the count of documents ``GET /{db}`` shows, and ``purge``
(the stored versions a client names, removed with no trace as ``conflicts.settle``'s removals are:
``couch_purge.plan_purge`` decides which). A mixin of
``DocDB``: it works on the database's own engine instance, lock and conflict index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..document import CONFLICT_FIELD


class CouchStore:
    """``DocDB``'s operations for the CouchDB endpoints (see the module's note)."""

    def local_get(self, name: str) -> Any:
        """A ``_local`` document of the CouchDB endpoints (a replication checkpoint): kept, not replicated."""
        return self.db.get("meta", ("couch_local", name))

    def local_update(self, name: str, fn: Callable[[Any], Any]) -> Any:
        """Replace ``_local`` document ``name`` with ``fn(current)`` (None deletes it), atomically."""
        with self._lock:
            new = fn(self.local_get(name))
            if new is None:
                self.db.kill("meta", ("couch_local", name))
            else:
                self.db.set("meta", ("couch_local", name), new)
            return new

    def count_main(self) -> tuple[int, int]:
        """``(live, deleted)`` documents that are not conflict documents (one scan)."""
        live = deleted = 0
        for _, v in self.db.items("docs"):
            d = v[1]
            if CONFLICT_FIELD in d[2]:
                continue
            if d[8]:
                deleted += 1
            else:
                live += 1
        return live, deleted

    def purge(self, unid: str, decide: Callable[[tuple], Any]) -> Any:
        """Read document ``unid`` with its conflict documents, let ``decide(family)`` say which stored
        versions to remove and which to write (a ``couch_purge.PurgePlan``), and do both in one
        transaction; the plan. Removed versions leave no stub: their change entries read as absent."""
        with self._lock:
            plan = decide(self.families([unid])[unid])
            kills = self._removal_ops(plan.removes)
            if plan.writes:
                self._write([(d, None) for d in plan.writes], kills, checked=True)
            elif kills:
                self.db.commit_updates(kills)
                self._epoch += 1
            self._forget(plan.removes)
            return plan
