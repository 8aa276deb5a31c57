"""Act 7 (multi-master documents): two document servers, Boston and London, each accepting writes to
its replica of one Profiles database. They reconcile over TCP with the seed's step-by-step session:
new documents move both ways, edits to the same field of a Note make a conflict document on the
side that held the losing version, edits to different fields of one Person too (a session never
merges: the outcome would depend on which lines met first), which Boston then merges field by field
(the form merges conflicts: ``doc.merge_conflicts``, an edit the next session takes to London), a
deletion beats an older edit, and a connection document then keeps the two in
step on a one-second schedule. Both servers end with the same documents, version for version. Then
a PouchDB database syncs live with Boston's CouchDB endpoints (``multimaster_pouch.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..multimaster.server import docdb
from ..multimaster.server.process import call, start_docserver, stop_docserver
from .multimaster_pouch import pouchdb_scene


def _table(console: Console, title: str, rows: list[dict]) -> None:
    t = Table(title=title)
    for c in ("unid", "form", "seq", "conflict", "fields"):
        t.add_column(c)
    for d in sorted(rows, key=lambda d: (d["conflict"], d["unid"])):
        if d["deleted"]:
            continue
        f = {k: v for k, v in d["fields"].items() if k != "$Ref"}
        t.add_row(d["unid"][:12] + "…", d["form"], str(d["seq"]), "yes" if d["conflict"] else "", str(f))
    console.print(t)


def _create_databases(console: Console, base: Path) -> None:
    """Boston's Profiles (with its forms), a London replica of it, and Boston's address book (Names)."""
    bos = docdb.create(base / "boston-profiles", "Profiles")
    bos.define_form("Person", merge=True)
    bos.define_form("Note", merge=False)
    rid = bos.replica_id
    bos.close()
    lon = docdb.create(base / "london-profiles", "Profiles", replica_id=rid)
    lon.close()
    book = docdb.create(base / "boston-names", "Names")
    book.close()
    console.print(f"Profiles: replica ID {rid}, one replica in Boston and one in London (different database IDs)")


@dataclass
class _Sites:
    """The two running document servers, as the act talks to them."""

    console: Console
    homes: dict[str, Path]
    london: str  # London's listen address: Boston's sessions and connection document reach London there

    def doc(self, site: str, op: str, **a):
        """One request on ``site``'s replica of Profiles."""
        return call(self.homes[site], op, db="Profiles", **a)

    def replicate(self, mode: str = "pull-push") -> dict:
        """One session Boston → London, its totals printed and returned."""
        r = call(self.homes["Boston"], "replicate", server=self.london, mode=mode)
        t = r["totals"]
        self.console.print(f"Boston {mode} London: {t['new']} new, {t['updated']} updated, {t['deleted']} deleted, "
                           f"{t['conflicts']} conflicts, {t['merged']} merged in {r['seconds']:.3f} s")
        return t


def _edit_apart_and_replicate(sites: _Sites) -> dict[str, bool]:
    """Write on both sites, then edit one Person's different fields, one Note's same field, and delete a
    note the other side edits, replicating in between: the checks of what replication made of each."""
    doc = sites.doc
    ada = doc("Boston", "doc.create", form="Person", fields={"name": "Ada", "city": "Boston", "phone": "555-0100"})
    memo = doc("Boston", "doc.create", form="Note", fields={"text": "kick-off on Monday"})
    old = doc("Boston", "doc.create", form="Note", fields={"text": "obsolete"})
    doc("London", "doc.create", form="Person", fields={"name": "Grace", "city": "London"})
    first = sites.replicate()
    sites.console.print("both sites edit while apart:")
    doc("Boston", "doc.update", unid=ada, fields={"phone": "555-0199"})
    sites.console.print("  Boston: Ada's phone → 555-0199;  London: Ada's city → Cambridge (different fields)")
    doc("London", "doc.update", unid=ada, fields={"city": "Cambridge"})
    doc("Boston", "doc.update", unid=memo, fields={"text": "kick-off moved to Tuesday"})
    doc("London", "doc.update", unid=memo, fields={"text": "kick-off cancelled"})
    sites.console.print("  Boston and London both rewrite the memo's text (same field, a Note: conflict)")
    doc("London", "doc.update", unid=old, fields={"text": "still needed?"})
    time.sleep(0.002)  # Boston's deletion is the later change
    doc("Boston", "doc.delete", unid=old)
    sites.console.print("  London edits the obsolete note, Boston deletes it later (the deletion wins)")
    second = sites.replicate()
    m = doc("Boston", "doc.merge_conflicts", unid=ada)
    sites.console.print(f"Boston merges Ada's conflict (Person merges conflicts): {m and m['fields']}")
    third = sites.replicate()
    last = sites.replicate()
    b = doc("Boston", "doc.list")
    _table(sites.console, "Profiles in Boston after replication", b)
    ada_on = [next(d for d in doc(s, "doc.list") if d["unid"] == ada)["fields"] for s in ("Boston", "London")]
    conflicts = [d for d in b if d["conflict"] and not d["deleted"]]  # (a deleted one records a dropped edit)
    return {
        "first session moved the new documents both ways": first["new"] == 4,
        "Ada's edits merged on both sites": third["updated"] >= 1 and all(
            f.get("phone") == "555-0199" and f.get("city") == "Cambridge" for f in ada_on),
        "one conflict document holds the losing memo": second["conflicts"] == 2 and [
            d["fields"].get("$Ref") for d in conflicts] == [memo],
        "the deletion beat the older edit": next(d for d in b if d["unid"] == old)["deleted"],
        "a last session moved nothing": last["new"] == last["updated"] == last["conflicts"] == 0,
    }


def _connection_document(sites: _Sites) -> tuple[bool, dict]:
    """Give Boston's address book a connection document to London every second, write in London, and wait
    (up to 8 s) for the schedule to bring it: ``(whether it did, Boston's status before)``."""
    boston = sites.homes["Boston"]
    sites.console.print("a connection document in Boston's address book: pull-push with London every second")
    with_book = call(boston, "status")
    call(boston, "doc.create", db="Names", form="Connection",
         fields={"source": "Boston", "destination": "London", "address": sites.london, "databases": ["Profiles"],
                 "mode": "pull-push", "range": "00:00-23:59:59", "interval_s": 1, "enabled": True})
    late = sites.doc("London", "doc.create", form="Note", fields={"text": "written in London after the session"})
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not any(d["unid"] == late for d in sites.doc("Boston", "doc.list")):
        time.sleep(0.1)
    scheduled = any(d["unid"] == late for d in sites.doc("Boston", "doc.list"))
    conns = call(boston, "connections")
    sites.console.print(f"the connection fired: {scheduled} (last result: {conns[0].get('last_result')})")
    return scheduled, with_book


def act_multimaster(console: Console, root: Path) -> bool:
    """Run act 7 under ``root``: True when every check passed (the two servers are stopped either way)."""
    console.rule("[bold]Act 7: multi-master documents: two sites write, replicate, keep conflicts and merge them")
    base = root / "multimaster"
    _create_databases(console, base)
    homes = {"Boston": base / "srv-boston", "London": base / "srv-london"}
    info = {}
    try:
        info["London"] = start_docserver(homes["London"], [str(base / "london-profiles")], "London", "127.0.0.1:0")
        info["Boston"] = start_docserver(homes["Boston"], [str(base / "boston-profiles")], "Boston", "127.0.0.1:0",
                                         address_book=str(base / "boston-names"), replicators=2,
                                         couch_listen="127.0.0.1:0")
        for n, i in info.items():
            console.print(f"document server {n}: pid {i['pid']}, listening on {i['listen']}")
        sites = _Sites(console, homes, info["London"]["listen"])
        checks = _edit_apart_and_replicate(sites)
        scheduled, with_book = _connection_document(sites)
        same = sites.doc("Boston", "doc.list") == sites.doc("London", "doc.list")
        checks["the connection document fired on schedule"] = scheduled
        checks["Boston and London hold the same documents, version for version"] = same and len(with_book) > 0
        url = f"http://127.0.0.1:{info['Boston']['couch_port']}/profiles"
        checks.update(pouchdb_scene(console, lambda op, **a: sites.doc("Boston", op, **a), url, base / "pouch"))
        return _report(console, checks)
    finally:
        for n in info:
            try:
                stop_docserver(homes[n])
            except Exception:  # noqa: BLE001 - the act's result is already decided
                pass


def _report(console: Console, checks: dict[str, bool]) -> bool:
    """Print each check and the act's verdict; whether all passed."""
    for what, ok in checks.items():
        console.print(f"  {'[green]OK[/]' if ok else '[red]FAILED[/]'} {what}")
    ok = all(checks.values())
    console.print("[bold green]the two sites converged: merges merged, the conflict was kept, nothing lost[/]" if ok
                  else "[bold red]MULTI-MASTER CHECK FAILED[/]")
    return ok
