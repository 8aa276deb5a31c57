"""Act 7's PouchDB scene (issue 26): a PouchDB database in Node syncs live with Boston's CouchDB endpoints;
each side edits one document while the sync is paused, so each makes a conflict; once the sync runs
again PouchDB and ``multisite doc get`` name the same winner and PouchDB's ``_conflicts`` is Boston's
conflict document. Skipped, saying why, where Node, npm or the npm registry cannot be had.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from ..multimaster import couch


def pouchdb_scene(console: Console, doc: Callable[..., object], url: str, work: Path) -> dict[str, bool]:
    """The scene against Boston's Profiles at ``url`` (``doc(op, **args)`` asks Boston); its checks."""
    from ..testing.pouchdb import Pouch, PouchUnavailable, node_modules
    try:
        node_modules()
    except PouchUnavailable as e:
        console.print(f"[yellow]PouchDB scene skipped: {e}[/]")
        return {}
    console.print(f"a PouchDB database in Node syncs live with Boston at {url}")
    with Pouch(work) as p:
        p("open", name="phone")
        p("sync_start", name="phone", url=url)
        unid = doc("doc.create", form="Note", fields={"text": "pack for the trip"})
        p("wait", name="phone", id=unid, rev=couch.doc_rev(_get(doc, unid)))
        console.print("  Boston's note reached PouchDB; now both edit it while the phone is offline")
        p("sync_stop", name="phone")
        note = p("get", name="phone", id=unid)
        first = p("put", name="phone", doc={**note, "text": "passport!"})
        p("put", name="phone", doc={**note, "_rev": first["rev"], "text": "passport and charger!"})
        doc("doc.update", unid=unid, fields={"text": "pack light"})
        console.print("  phone: 2 edits ('passport and charger!'); Boston: 1 edit ('pack light')")
        p("sync_start", name="phone", url=url)
        shown = _wait_for_conflict(doc, unid)
        want = couch.doc_rev(shown)
        seen = p("wait", name="phone", id=unid, rev=want, conflicts=[c for c in _conflict_revs(doc, unid)])
        console.print(f"  multisite doc get: seq {shown.seq}, text {shown.fields.get('text')!r}; "
                      f"PouchDB: {seen['_rev'][:10]}…, text {seen.get('text')!r}, conflicts {seen.get('_conflicts')}")
        p("sync_stop", name="phone")
        return {"PouchDB and multisite doc get name the same winner (the longer line)":
                seen["_rev"] == want and seen.get("text") == shown.fields.get("text") == "passport and charger!",
                "PouchDB's _conflicts is Boston's conflict document":
                seen.get("_conflicts") == _conflict_revs(doc, unid) and len(seen.get("_conflicts", [])) == 1}


def _get(doc: Callable[..., object], unid: str):
    from ..multimaster.document import Doc
    return Doc.from_value(doc("doc.get", unid=unid, full=True))


def _conflict_revs(doc: Callable[..., object], unid: str) -> list[str]:
    return sorted(f"{d['seq']}-{d['seq_time_us']:016x}{d['origin']}" for d in doc("doc.list")  # type: ignore[union-attr]
                  if d["conflict"] and not d["deleted"] and d["fields"].get("$Ref") == unid)


def _wait_for_conflict(doc: Callable[..., object], unid: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d = _get(doc, unid)
        if d.seq == 3 and _conflict_revs(doc, unid):
            return d
        time.sleep(0.05)
    return _get(doc, unid)
