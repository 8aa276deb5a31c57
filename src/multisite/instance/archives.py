"""What the journal archiver has archived from this instance, so that ``prune`` can require it.

``multisite journal archive DIR --to URL`` copies sealed segments to shared storage (see
``pipeline.archive``) and, after each segment is copied and checked, records here the last seqno the
archive holds without a gap: ``<instance>/archives/<sha256(url)[:12]>.json`` = ``{"url",
"last_archived", "updated"}``, replaced atomically. ``prune`` then keeps every segment holding a seqno
past the lowest ``last_archived`` when archiving is required (by default: whenever an archive is
recorded here), so that no segment is removed before it is safe elsewhere. Removing a file
(``forget``) releases what it held.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import atomic_write, ensure_dir, fsync_dir
from .layout import Layout

SUFFIX = ".json"


@dataclass(frozen=True)
class ArchiveMark:
    url: str
    last_archived: int
    updated: float


def archives_dir(layout: Layout) -> Path:
    return layout.root / "archives"


def _file(layout: Layout, url: str) -> Path:
    return archives_dir(layout) / f"{hashlib.sha256(url.encode()).hexdigest()[:12]}{SUFFIX}"


def record(layout: Layout, url: str, last_archived: int) -> None:
    """Record that the archive at ``url`` holds every seqno of the journal up to ``last_archived``."""
    d = archives_dir(layout)
    ensure_dir(d)
    body = {"url": url, "last_archived": int(last_archived), "updated": time.time()}
    atomic_write(_file(layout, url), json.dumps(body).encode())


def load_all(layout: Layout, *, skip_unreadable: bool = False) -> list[ArchiveMark]:
    """Every mark; an unreadable one is a ConfigError (prune must not take it for "no archive"),
    or skipped with ``skip_unreadable`` (``cap``: a rollback cannot cap what it cannot read)."""
    d = archives_dir(layout)
    out = []
    for p in sorted(d.glob(f"*{SUFFIX}")) if d.exists() else []:
        try:
            body = json.loads(p.read_text())
            out.append(ArchiveMark(str(body["url"]), int(body["last_archived"]), float(body.get("updated", 0))))
        except (OSError, ValueError, KeyError, TypeError) as e:
            if skip_unreadable:
                continue
            raise ConfigError(f"journal archive mark {p} is unreadable ({e}): prune cannot tell what that archive "
                              f"holds; fix or remove it") from None
    return out


def forget(layout: Layout, url: str) -> bool:
    p = _file(layout, url)
    if not p.exists():
        return False
    p.unlink()
    fsync_dir(p.parent)
    return True


def cap(layout: Layout, seqno: int) -> None:
    """After a rollback to ``seqno``: what any archive holds past it was taken off the journal, so no
    archive counts as holding more than ``seqno`` (``prune`` keeps the records written there again)."""
    for mark in load_all(layout, skip_unreadable=True):
        if mark.last_archived > seqno:
            record(layout, mark.url, seqno)
