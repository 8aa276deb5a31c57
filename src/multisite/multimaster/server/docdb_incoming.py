"""What a document database does with versions received from a replica (seed step 9): each reconciled
with the stored one (``conflicts.reconcile``), the conflict documents made, the families touched
brought in line (``conflicts.settle``: retirements written, conflict documents that stand for no losing
leaf removed), and all of it written in one transaction with the session's ``in`` bookmark. A mixin
of ``DocDB``: it works on the database's own engine instance, lock, conflict index and ``_write``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ...journal.records import SET
from ...values import encode_value
from ..conflicts import Outcome, descends, reconcile, settle
from ..document import CONFLICT_FIELD, REF_FIELD, Doc


@dataclass
class Snapshot:
    """The current documents of some UNIDs and the write epoch they were read at (``DocDB.current_at``)."""

    epoch: int
    docs: dict[str, Doc | None]


class IncomingStore:
    """``DocDB``'s reconciliation of received versions (see the module's note)."""

    def apply_incoming(self, docs: list[Doc], *, peer_db_id: str | None = None, bookmark: int | None = None,
                       known: "Snapshot | None" = None, echo: set | None = None) -> Counter:
        """Reconcile versions received from a replica (seed step 9) and write the outcome and, in the same
        transaction, the ``in`` bookmark for ``peer_db_id``; counts per outcome kind. ``known`` (from
        ``current_at``) is used if no write came in between, and is brought up to date with this one's.
        ``echo`` collects ``(unid, stamp)`` of the received versions written as they came: the peer holds
        them, so a push back to it in the same session need not offer them."""
        counts: Counter = Counter()
        with self._lock:
            writes: list[tuple[Doc, int | None]] = []
            pending: dict[str, tuple[Doc, int | None]] = {}  # a batch may hold a document twice
            hint = known.docs if known is not None and known.epoch == self._epoch else None
            unknown = [d.unid for d in docs if hint is None or d.unid not in hint]
            have = {u: Doc.trusted(v[1]) for u, v in self._rows(unknown).items()}  # one batch read
            conflicts: list[Doc] = []
            for inc in docs:
                if inc.unid in pending:
                    cur = pending[inc.unid][0]
                elif hint is not None and inc.unid in hint:
                    cur = hint[inc.unid]
                else:
                    cur = have.get(inc.unid)
                out: Outcome = reconcile(cur, inc)
                counts[out.kind.value] += 1
                if out.write is not None:
                    pending[inc.unid] = (out.write, None)
                    if echo is not None and out.write is inc:
                        echo.add((inc.unid, inc.stamp))
                if out.conflict_doc is not None:
                    conflicts.append(out.conflict_doc)
                if out.record is not None:
                    conflicts.append(out.record)
            if conflicts:  # a conflict document made here may exist already (found before, or replicated)
                exist = self._rows([cd.unid for cd in conflicts if cd.unid not in pending])
                for cd in conflicts:
                    if cd.unid in pending:
                        continue
                    old = Doc.trusted(exist[cd.unid][1]) if cd.unid in exist else None
                    if old is None or (old.stamp != cd.stamp and descends(cd, old)):  # (a record retires it)
                        pending[cd.unid] = (cd, None)
            removes = self._settle(pending)
            writes = list(pending.values())
            extra = self._removal_ops(removes)
            if peer_db_id is not None and bookmark is not None:
                old = self.bookmark(peer_db_id, "in")
                extra.append((SET, "history", (peer_db_id, "in"), encode_value(max(old, bookmark))))
            if writes or extra:
                self._write(writes, extra, checked=True)
            self._forget(removes)
            if hint is not None:  # still current: add what this call wrote
                hint.update((u, d) for u, (d, _) in pending.items())
                hint.update((u, None) for u in removes)
                known.epoch = self._epoch
        return counts

    def _settle(self, pending: dict[str, tuple[Doc, int | None]]) -> list[str]:
        """Bring the conflict documents of each family ``pending`` touches in line with it (``settle``):
        retirements are added to ``pending``; conflict documents that stand for no losing leaf are taken
        out of it, and those stored are returned, to remove. Only families that have conflict documents
        are read again."""
        affected: dict[str, set[str]] = {}
        for u, (d, _) in pending.items():
            ref = d.fields.get(REF_FIELD) if CONFLICT_FIELD in d.fields else u
            if isinstance(ref, str):
                affected.setdefault(ref, set(self._refs.get(ref, ())))
                if ref != u:
                    affected[ref].add(u)
        affected = {r: cs for r, cs in affected.items() if cs}
        if not affected:
            return []
        need = [u for r, cs in affected.items() for u in (r, *cs) if u not in pending]
        rows = self._rows(need)

        def doc(u: str) -> Doc | None:
            if u in pending:
                return pending[u][0]
            return Doc.trusted(rows[u][1]) if u in rows else None

        removes = []
        for ref, cs in affected.items():
            cur = doc(ref)
            st = settle(None if cur is not None and cur.is_conflict else cur,
                        [c for c in map(doc, sorted(cs)) if c is not None])
            for r in st.retire:
                pending[r.unid] = (r, None)
            for u in st.remove:
                pending.pop(u, None)
                if u in rows or u in self._ref_of:
                    removes.append(u)
        return removes
