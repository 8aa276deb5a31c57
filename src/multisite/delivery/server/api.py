"""Setting delivery up and looking at it: publish, subscribe, remote setup, status, conflicts, extract.

Each operation takes an open ``Database`` (the agent is not running on it: one process per instance)
and commits what it sets up in the instance's system regions (``sysremote``). A subscription starts at
the journal's end offset when it is made: what was committed before reaches the subscriber by
``extract``, what is committed after by messages.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from rich.table import Table

from ...errors import DeliveryConfigError
from ...journal.offsets import end_offset, format_offset
from ...journal.records import SET
from ...keys import decode_key
from .. import sysremote
from ..build import field_matches
from ..machine import ReceiveState, SendState
from ..message import parse_key
from ..sysremote import CONFLICT_REGION, ROLE_CONSOLIDATED, ROLE_REMOTE, SYSTEM_REGIONS, Link, Publication, check_name
from .transport import SUFFIX, inbox_folder


def default_inbox(db) -> str:
    return str(db.layout.root / "delivery" / "inbox")


def _check_regions(regions: list[str]) -> list[str]:
    if not regions:
        raise DeliveryConfigError("--regions: a publication needs at least one region")
    for r in regions:
        if r in SYSTEM_REGIONS:
            raise DeliveryConfigError(f"--regions: {r} is delivery's own system region; it cannot be published")
        check_name("region", r)
    return regions


def _set_role(db, setup: sysremote.Setup, role: str, inbox: str | None) -> list[tuple]:
    if setup.role and setup.role != role:
        raise DeliveryConfigError(f"instance {db.name} is already set up as a {setup.role} instance, not {role}")
    inbox = inbox or setup.inbox or default_inbox(db)
    if inbox_folder(inbox) is None:
        raise DeliveryConfigError(f"--inbox {inbox!r}: an agent reads its messages from a folder")
    return [] if (setup.role == role and setup.inbox == inbox) else [sysremote.self_op(role, inbox)]


def publish(db, name: str, regions: list[str], subscribe_by: str | None = None, inbox: str | None = None
            ) -> Publication:
    """Make publication ``name`` of ``regions`` on this (consolidated) instance; rows go to the
    subscribers whose ``--value`` their ``subscribe_by`` field holds (every subscriber without one)."""
    check_name("publication", name)
    _check_regions(regions)
    sysremote.ensure_regions(db)
    setup = sysremote.load(db)
    if name in setup.publications:
        raise DeliveryConfigError(f"publication {name} exists on {db.name}")
    for r in regions:
        db.create_region(r)
    pub = Publication(name, list(regions), subscribe_by or None)
    db.commit_updates(_set_role(db, setup, ROLE_CONSOLIDATED, inbox) + [sysremote.publication_op(pub)])
    return pub


def _new_link(db, setup: sysremote.Setup, link: Link) -> int:
    """Check a new remote user; its link starts at the journal's end offset (returned)."""
    check_name("user", link.user)
    if link.user in setup.links:
        raise DeliveryConfigError(f"{link.user} is already a remote user of {db.name}")
    if link.user == db.name:
        raise DeliveryConfigError(f"{link.user} is this instance's own name")
    if link.key:
        parse_key(link.key, f"--key of {link.user}")
    return end_offset(db.layout.journal)


def subscribe(db, publication: str, user: str, address: str, value: str | None = None, key: str = "") -> Link:
    """Subscribe remote user ``user`` (its instance's name), reached at ``address``, to ``publication``."""
    setup = sysremote.load(db)
    if publication not in setup.publications:
        raise DeliveryConfigError(f"no publication {publication!r} on {db.name}; make it with `delivery publish`")
    pub = setup.publications[publication]
    if pub.subscribe_by and value is None:
        raise DeliveryConfigError(f"publication {publication} is subscribed by {pub.subscribe_by}: give --value")
    link = Link(user, publication, address, value, ROLE_REMOTE, key)
    start = _new_link(db, setup, link)
    out = SendState(log_sent=start, confirm_sent=start, start=start)
    db.commit_updates([sysremote.def_op(link), sysremote.state_op(user, "out", out),
                       sysremote.state_op(user, "in", ReceiveState())])
    sysremote.keep_journal_for(db, user, start)
    return link


def remote_setup(db, consolidated: str, address: str, publication: str, regions: list[str],
                 inbox: str | None = None, key: str = "") -> Link:
    """Make this instance a remote of ``consolidated`` (reached at ``address``): its changes to
    ``regions`` go there as publication ``publication``; what the consolidated instance sends is applied."""
    check_name("publication", publication)
    _check_regions(regions)
    sysremote.ensure_regions(db)
    setup = sysremote.load(db)
    ops = _set_role(db, setup, ROLE_REMOTE, inbox)
    if setup.links:
        raise DeliveryConfigError(f"{db.name} is already the remote of {', '.join(setup.links)}")
    for r in regions:
        db.create_region(r)
    pub = Publication(publication, list(regions))
    link = Link(consolidated, publication, address, None, ROLE_CONSOLIDATED, key)
    start = _new_link(db, setup, link)
    out = SendState(log_sent=start, confirm_sent=start, start=start)
    db.commit_updates(ops + [sysremote.publication_op(pub), sysremote.def_op(link),
                             sysremote.state_op(consolidated, "out", out),
                             sysremote.state_op(consolidated, "in", ReceiveState())])
    return link


STATUS_COLUMNS = ("user", "publication", "address", "log_sent", "confirm_sent", "log_received", "confirm_received",
                  "time_sent", "time_received")


def status(db) -> dict:
    """The SYSREMOTEUSER table of this instance, with its role and inbox (a stable JSON shape)."""
    setup = sysremote.load(db)
    rows = []
    for user, link in sorted(setup.links.items()):
        out, inn = sysremote.send_state(db, user), sysremote.receive_state(db, user)
        rows.append({"user": user, "publication": link.publication, "address": link.address,
                     "value": link.value, "peer_role": link.peer_role, "encrypted": bool(link.key),
                     "log_sent": out.log_sent, "confirm_sent": out.confirm_sent, "gen": out.gen,
                     "log_received": inn.log_received, "confirm_received": inn.confirm_received,
                     "time_sent": out.time_sent, "time_received": inn.time_received})
    return {"instance": db.name, "role": setup.role, "inbox": setup.inbox,
            "publications": {p.name: {"regions": p.regions, "subscribe_by": p.subscribe_by}
                             for p in setup.publications.values()},
            "remote_users": rows}


def when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def status_table(st: dict, title: str | None = None) -> Table:
    """``status``'s SYSREMOTEUSER table for people (the CLI, the demo)."""
    t = Table(title=title or f"SYSREMOTEUSER of {st['instance']} ({st['role']})")
    for c in ("user", "publication", "log_sent", "confirm_sent", "log_received", "confirm_received", "last sent",
              "last received"):
        t.add_column(c, no_wrap=True)
    for r in st["remote_users"]:
        t.add_row(r["user"], r["publication"] + (f"={r['value']}" if r["value"] else ""), format_offset(r["log_sent"]),
                  format_offset(r["confirm_sent"]), format_offset(r["log_received"]),
                  format_offset(r["confirm_received"]), when(r["time_sent"]), when(r["time_received"]))
    return t


def conflicts(db) -> list[dict]:
    """The update conflicts resolved on this instance (``sysconflict``), oldest first."""
    if CONFLICT_REGION not in db.regions():
        return []
    return [dict(row, user=k[0], offset=k[1]) for k, row in db.items(CONFLICT_REGION)]


def extract(db, subscriber: str, to: str | os.PathLike, *, durability: str = "fsync", rows=None) -> dict:
    """Build a new remote instance at ``to`` holding exactly ``subscriber``'s rows, consistent with the
    offsets: the link restarts at the journal's end offset on both sides (a new generation), and
    messages of the old remote waiting in this instance's inbox are removed. ``rows``: an iterable of
    ``(region, key, encoded value)`` to copy instead of paging the store here (the Spark path,
    ``pipeline.delivery_extract``); the rows are filtered by the subscription either way. ``db`` is
    held open meanwhile, so nothing commits between the rows read and the offset taken."""
    from ... import engine

    setup = sysremote.load(db)
    link = setup.links.get(subscriber)
    if link is None or link.peer_role != ROLE_REMOTE:
        raise DeliveryConfigError(f"{subscriber!r} is not a subscriber of {db.name}")
    pub = setup.publications[link.publication]
    if rows is None:
        rows = ((r, key, vb) for r in pub.regions for key, vb in _rows(db, r))
    root = engine.create(to, subscriber, durability=durability)
    new = engine.open(root)
    try:
        for r in pub.regions:
            new.create_region(r)
        copied = _copy(new, rows, pub, link)
        at = end_offset(db.layout.journal)
        remote_setup(new, db.name, setup.inbox, pub.name, pub.regions, key=link.key,
                     inbox=link.address if inbox_folder(link.address) is not None else None)
        new_in = ReceiveState(log_received=at, confirm_received=at, start=at)
        remote_start = sysremote.send_state(new, db.name).start
        new.commit_updates([sysremote.state_op(db.name, "in", new_in)])
        old_out = sysremote.send_state(db, subscriber)
        out = SendState(log_sent=at, confirm_sent=at, start=at, gen=old_out.gen + 1)
        db.commit_updates([sysremote.state_op(subscriber, "out", out),
                           sysremote.state_op(subscriber, "in", ReceiveState(start=remote_start))])
        sysremote.keep_journal_for(db, subscriber, at)
        folder = inbox_folder(setup.inbox)
        removed = 0
        if folder is not None and folder.is_dir():
            for p in folder.glob(f"{subscriber}(*{SUFFIX}"):
                p.unlink()
                removed += 1
        return {"instance": str(Path(root)), "subscriber": subscriber, "rows": copied,
                "offset": format_offset(at), "stale_messages_removed": removed}
    finally:
        new.close()


EXTRACT_BATCH_ROWS = 10_000  # rows per commit into the new remote


def _copy(new, rows, pub: Publication, link: Link) -> int:
    """Commit the subscriber's rows of ``rows`` into ``new`` in batches; how many."""
    copied, batch = 0, []
    regions = set(pub.regions)
    for r, key, vb in rows:
        if r not in regions or (pub.subscribe_by and not field_matches(vb, pub.subscribe_by, link.value or "")):
            continue
        batch.append((SET, r, key, vb))
        if len(batch) >= EXTRACT_BATCH_ROWS:
            new.commit_updates(batch)
            copied += len(batch)
            batch = []
    if batch:
        new.commit_updates(batch)
        copied += len(batch)
    return copied


def _rows(db, region: str):
    lo, inclusive = b"", True
    while True:
        rows = db.page(region, lo, None, 10_000, inclusive=inclusive)
        for kb, vb in rows:
            yield decode_key(kb), vb
        if len(rows) < 10_000:
            return
        lo, inclusive = rows[-1][0], False

