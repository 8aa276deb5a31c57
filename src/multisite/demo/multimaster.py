"""Act 7 (multi-master documents): two document servers, Boston and London, each accepting writes to
its replica of one Profiles database. They reconcile over TCP with the seed's step-by-step session:
new documents move both ways, edits to different fields of one Person merge (the form merges
conflicts), edits to the same field of a Note make a conflict document on the side that held the
losing version, a deletion beats an older edit, and a connection document then keeps the two in
step on a one-second schedule. Both servers end with the same documents, version for version.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..multimaster.server import docdb
from ..multimaster.server.process import call, start_docserver, stop_docserver


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


def act_multimaster(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 7: multi-master documents: two sites write, replicate, merge and keep conflicts")
    base = root / "multimaster"
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
    homes = {"Boston": base / "srv-boston", "London": base / "srv-london"}
    info = {}
    try:
        info["London"] = start_docserver(homes["London"], [str(base / "london-profiles")], "London", "127.0.0.1:0")
        info["Boston"] = start_docserver(homes["Boston"], [str(base / "boston-profiles")], "Boston", "127.0.0.1:0",
                                         address_book=str(base / "boston-names"), replicators=2)
        for n, i in info.items():
            console.print(f"document server {n}: pid {i['pid']}, listening on {i['listen']}")
        lon_addr = info["London"]["listen"]

        def doc(site, op, **a):
            return call(homes[site], op, db="Profiles", **a)

        def replicate(mode="pull-push"):
            r = call(homes["Boston"], "replicate", server=lon_addr, mode=mode)
            t = r["totals"]
            console.print(f"Boston {mode} London: {t['new']} new, {t['updated']} updated, {t['deleted']} deleted, "
                          f"{t['conflicts']} conflicts, {t['merged']} merged in {r['seconds']:.3f} s")
            return t

        ada = doc("Boston", "doc.create", form="Person", fields={"name": "Ada", "city": "Boston", "phone": "555-0100"})
        memo = doc("Boston", "doc.create", form="Note", fields={"text": "kick-off on Monday"})
        old = doc("Boston", "doc.create", form="Note", fields={"text": "obsolete"})
        doc("London", "doc.create", form="Person", fields={"name": "Grace", "city": "London"})
        first = replicate()
        console.print("both sites edit while apart:")
        doc("Boston", "doc.update", unid=ada, fields={"phone": "555-0199"})
        console.print("  Boston: Ada's phone → 555-0199;  London: Ada's city → Cambridge (different fields: merge)")
        doc("London", "doc.update", unid=ada, fields={"city": "Cambridge"})
        doc("Boston", "doc.update", unid=memo, fields={"text": "kick-off moved to Tuesday"})
        doc("London", "doc.update", unid=memo, fields={"text": "kick-off cancelled"})
        console.print("  Boston and London both rewrite the memo's text (same field, a Note: conflict)")
        doc("London", "doc.update", unid=old, fields={"text": "still needed?"})
        time.sleep(0.002)
        doc("Boston", "doc.delete", unid=old)
        console.print("  London edits the obsolete note, Boston deletes it later (the deletion wins)")
        second = replicate()
        third = replicate()
        b, l = doc("Boston", "doc.list"), doc("London", "doc.list")
        _table(console, "Profiles in Boston after replication", b)
        merged = next(d for d in b if d["unid"] == ada)["fields"]
        conflicts = [d for d in b if d["conflict"]]
        gone = next(d for d in b if d["unid"] == old)["deleted"]

        console.print("a connection document in Boston's address book: pull-push with London every second")
        with_book = call(homes["Boston"], "status")
        call(homes["Boston"], "doc.create", db="Names", form="Connection",
             fields={"source": "Boston", "destination": "London", "address": lon_addr, "databases": ["Profiles"],
                     "mode": "pull-push", "range": "00:00-23:59:59", "interval_s": 1, "enabled": True})
        late = doc("London", "doc.create", form="Note", fields={"text": "written in London after the session"})
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not any(d["unid"] == late for d in doc("Boston", "doc.list")):
            time.sleep(0.1)
        scheduled = any(d["unid"] == late for d in doc("Boston", "doc.list"))
        conns = call(homes["Boston"], "connections")
        console.print(f"the connection fired: {scheduled} (last result: {conns[0].get('last_result')})")
        b, l = doc("Boston", "doc.list"), doc("London", "doc.list")
        same = b == l
        checks = {
            "first session moved the new documents both ways": first["new"] == 4,
            "Ada's edits merged on both sites": merged.get("phone") == "555-0199" and merged.get("city") == "Cambridge",
            "one conflict document holds the losing memo": len(conflicts) == 1 and second["conflicts"] == 1,
            "the deletion beat the older edit": gone,
            "a second session moved nothing": third["new"] == third["updated"] == third["conflicts"] == 0,
            "the connection document fired on schedule": scheduled,
            "Boston and London hold the same documents, version for version": same and len(with_book) > 0,
        }
        for what, ok in checks.items():
            console.print(f"  {'[green]OK[/]' if ok else '[red]FAILED[/]'} {what}")
        ok = all(checks.values())
        console.print("[bold green]the two sites converged: merges merged, the conflict was kept, nothing lost[/]" if ok
                      else "[bold red]MULTI-MASTER CHECK FAILED[/]")
        return ok
    finally:
        for n in info:
            try:
                stop_docserver(homes[n])
            except Exception:  # noqa: BLE001 - the act's result is already decided
                pass
