"""Act 4 (rolling upgrade): filters carry a value-shape change across a switchover.

The old application stores a person as ``{"name": "Ann Lee"}``, the new one as
``{"first": "Ann", "last": "Lee"}``. A runs the old one and commits. B is upgraded while A runs:
its Receiver Server takes an in-filter (in-process, ``upgrade_person``) and B catches up in the new
shape. The application switches over to B (A's source drains and stops, B is promoted). A goes down
for its own upgrade window while B commits new shapes, and comes back still on the old version: it
catches up from B's journal through B's out-filter (an external filter process, ``downgrade``)
that turns the new shapes back into old ones. At the end every value on A is the downgrade of B's.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..errors import MultisiteError
from ..testing.cluster import Cluster
from ..testing.filters import downgrade_person, filter_command

ON_A = 200  # people A commits in the old shape
ON_B = 100  # people B commits in the new shape after the switchover
CATCH_UP_TIMEOUT_S = 60.0


def _people(node) -> dict:
    with node.client() as db:
        return dict(db.items("people"))


def act_rolling_upgrade(console: Console, root: Path) -> bool:
    console.rule("[bold]Act 4: rolling upgrade: filters turn old value shapes into new ones and back")
    cluster = Cluster(root / "rolling-upgrade")
    try:
        a, b = cluster.instance("A"), cluster.instance("B")
        with a.client() as db:
            db.create_region("people")
            for i in range(ON_A // 2):
                db.set("people", ("p", i), {"name": f"Ann Lee{i}"})
        console.print(f"A (old application) committed {ON_A // 2} people as {{'name': 'Ann Lee0'}}, ...")
        b.start_receiver(filter="multisite.testing.filters:upgrade_person")
        a.start_source(b)
        with a.client() as db:  # A keeps running while B catches up
            for i in range(ON_A // 2, ON_A):
                db.set("people", ("p", i), {"name": f"Ann Lee{i}"})
        cluster.wait_caught_up(a, b)
        console.print(f"B upgraded while A runs: its receiver's in-filter gives B {_people(b)[('p', 1)]} for A's "
                      f"{_people(a)[('p', 1)]} (seqno {b.seqno()})")
        a.call("source.stop", secondary="B")
        b.call("receiver.stop")
        b.call("role", role="primary")
        console.print(f"switchover at seqno {b.seqno()}: A's source drained and stopped, B is the primary")
        a.stop()
        with b.client() as db:
            db.set("people", ("p", 1), {"first": "Ann", "last": "Lee-Smith"})
            for i in range(ON_A, ON_A + ON_B):
                db.set("people", ("p", i), {"first": "Cy", "last": f"Du{i}"})
        console.print(f"A is down for its upgrade window; B (new application) commits {ON_B + 1} transactions "
                      f"(seqno {b.seqno()})")
        a.start()
        a.start_receiver()
        cmd = filter_command("downgrade")
        b.start_source(a, filter=cmd)
        cluster.wait_caught_up(b, a, timeout=CATCH_UP_TIMEOUT_S)
        st = b.call("source.status", secondary="A")
        console.print(f"A is back, still on the old application, and caught up at seqno {a.seqno()} through B's "
                      f"out-filter ({st['filtered']} transactions through `{st['filter'].rsplit('/', 1)[-1]}`): "
                      f"A has {_people(a)[('p', 1)]} for B's {_people(b)[('p', 1)]}")
        on_a, on_b = _people(a), _people(b)
        ok = on_a == {k: _old(v) for k, v in on_b.items()} and all("name" in v for v in on_a.values())
    except (TimeoutError, MultisiteError) as e:
        console.print(f"[bold red]rolling upgrade act stopped: {e}[/]")
        cluster.stop_all()
        return False
    cluster.stop_all()
    console.print("[bold green]every value on A is the old shape of B's[/]" if ok
                  else "[bold red]ROLLING UPGRADE CHECK FAILED[/]")
    return ok


def _old(value):
    return downgrade_person({"updates": [{"region": "people", "value": value}]})["updates"][0]["value"]
